module github.com/rdmakv/rdmakv

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/redis/go-redis/v9 v9.23.0
	golang.org/x/sys v0.49.0
)

require go.uber.org/atomic v1.12.0 // indirect
