# rdmakv developer entry points. `make test` is the one test command (README,
# .ci/run); `make run` is the one run command.

GO ?= go
# A count of executions, not a duration: see scripts/fuzz-short (golang/go#75804).
FUZZTIME ?= 300000x

.PHONY: test run vet unit fuzz-short bench

test: vet unit fuzz-short

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

unit:
	$(GO) test -race -timeout 30m ./...

# Runs every fuzz target for $(FUZZTIME) executions (the seed corpora already ran in unit).
fuzz-short:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz-short

run:
	$(GO) run ./cmd/kvbench fabric

bench:
	$(GO) run ./cmd/kvbench fabric --runs 5
