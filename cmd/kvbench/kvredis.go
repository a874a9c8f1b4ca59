package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/redisproc"
)

// The kv benchmark's baseline: Debian's redis-server, started by kvbench
// on a free loopback port with persistence off, in a temporary directory
// inside kvbench's work directory (so that an interrupted run's cleanup
// removes it too), and killed at the end. It is driven by go-redis, one
// pool of connections shared by the goroutines of a measurement, as the
// rdmakv rows share one client.

// redisServer is the running baseline (internal/redisproc) and what
// kvbench reads of it.
type redisServer struct{ *redisproc.Server }

// startRedis starts redis-server in a new directory under parent (so that
// an interrupted run's cleanup removes it too) and connects a client with
// a pool of pool connections.
func startRedis(ctx context.Context, bin, parent string, pool int) (*redisServer, error) {
	s, err := redisproc.Start(ctx, bin, redisproc.Options{Dir: parent, Pool: pool, Prepare: childCmd})
	if err != nil {
		return nil, err
	}
	return &redisServer{s}, nil
}

// redisMem is the server's memory (INFO memory), in bytes.
type redisMem struct{ used, rss int64 }

func (s *redisServer) memory(ctx context.Context) (redisMem, error) {
	info, err := s.Client.Info(ctx, "memory").Result()
	if err != nil {
		return redisMem{}, fmt.Errorf("redis: INFO memory: %w", err)
	}
	var m redisMem
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "used_memory":
			m.used = n
		case "used_memory_rss":
			m.rss = n
		}
	}
	if m.used == 0 {
		return m, errors.New("redis: INFO memory has no used_memory")
	}
	return m, nil
}

// redisStore is Redis as the kv benchmark's store.
type redisStore struct {
	s      *redisServer
	ctx    context.Context
	arenas [kvLoaders][]byte
}

// writeBatch writes the batch as one pipeline of SETs.
func (r *redisStore) writeBatch(j, first, n int) error {
	a := r.arenas[j]
	if len(a) < n*(kvKeySize+kvValueSize) {
		a = make([]byte, n*(kvKeySize+kvValueSize))
		r.arenas[j] = a
	}
	pipe := r.s.Client.Pipeline()
	for i := range n {
		k := a[i*(kvKeySize+kvValueSize):][:kvKeySize]
		v := a[i*(kvKeySize+kvValueSize)+kvKeySize:][:kvValueSize]
		fillKey(k, first+i)
		fillValue(v, k, 'a')
		pipe.Set(r.ctx, string(k), v, 0)
	}
	cmds, err := pipe.Exec(r.ctx)
	if err != nil {
		return err
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// getter gets with GET (Redis has one consistency).
func (r *redisStore) getter(client.Consistency) func([]byte) ([]byte, bool, error) {
	return func(key []byte) ([]byte, bool, error) {
		v, err := r.s.Client.Get(r.ctx, string(key)).Bytes()
		if errors.Is(err, redis.Nil) {
			return nil, false, nil
		}
		return v, err == nil, err
	}
}

func (r *redisStore) putter() func(key, value []byte) error {
	return func(key, value []byte) error { return r.s.Client.Set(r.ctx, string(key), value, 0).Err() }
}

func (r *redisStore) geometry() (int, bool, bool) { return 0, false, false }
