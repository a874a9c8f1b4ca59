package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/rdmakv/rdmakv/client"
)

// The kv benchmark's baseline: Debian's redis-server, started by kvbench
// on a free loopback port with persistence off, in a temporary directory
// inside kvbench's work directory (so that an interrupted run's cleanup
// removes it too), and killed at the end. It is driven by go-redis, one
// pool of connections shared by the goroutines of a measurement, as the
// rdmakv rows share one client.

// findRedis looks the redis-server binary up.
func findRedis(bin string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%s not found", bin)
	}
	return p, nil
}

// redisServer is a running redis-server and a client of it.
type redisServer struct {
	cmd    *exec.Cmd
	exited chan error
	dir    string
	addr   string
	rc     *redis.Client
}

// startRedis starts redis-server in a new directory under parent and
// connects a client with a pool of pool connections.
func startRedis(ctx context.Context, bin, parent string, pool int) (*redisServer, error) {
	dir, err := os.MkdirTemp(parent, "redis-")
	if err != nil {
		return nil, fmt.Errorf("redis: directory: %w", err)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis: free port: %w", err)
	}
	s := &redisServer{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan error, 1)}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no")
	if err := childCmd(s.cmd); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis: start %s: %w", bin, err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	s.rc = redis.NewClient(&redis.Options{
		Addr:                     s.addr,
		PoolSize:                 pool,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.rc.Ping(ctx).Err()
		if err == nil {
			break
		}
		select {
		case werr := <-s.exited:
			s.exited <- werr
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			s.close()
			return nil, fmt.Errorf("redis-server exited (%v): %s", werr, strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			s.close()
			return nil, fmt.Errorf("redis-server on %s did not answer in 10 s: %w", s.addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Persistence must be off: no RDB snapshot or AOF writes during the
	// measurements.
	for k, want := range map[string]string{"save": "", "appendonly": "no"} {
		got, err := s.rc.ConfigGet(ctx, k).Result()
		if err != nil {
			s.close()
			return nil, fmt.Errorf("redis: CONFIG GET %s: %w", k, err)
		}
		if got[k] != want {
			s.close()
			return nil, fmt.Errorf("redis: %s is %q, want %q", k, got[k], want)
		}
	}
	return s, nil
}

// freePort finds a free loopback TCP port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *redisServer) pid() int { return s.cmd.Process.Pid }

// close kills the server and removes its directory.
func (s *redisServer) close() error {
	s.rc.Close()
	s.cmd.Process.Kill()
	<-s.exited
	return os.RemoveAll(s.dir)
}

// redisMem is the server's memory (INFO memory), in bytes.
type redisMem struct{ used, rss int64 }

func (s *redisServer) memory(ctx context.Context) (redisMem, error) {
	info, err := s.rc.Info(ctx, "memory").Result()
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
	pipe := r.s.rc.Pipeline()
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
		v, err := r.s.rc.Get(r.ctx, string(key)).Bytes()
		if errors.Is(err, redis.Nil) {
			return nil, false, nil
		}
		return v, err == nil, err
	}
}

func (r *redisStore) putter() func(key, value []byte) error {
	return func(key, value []byte) error { return r.s.rc.Set(r.ctx, string(key), value, 0).Err() }
}

func (r *redisStore) geometry() (int, bool, bool) { return 0, false, false }
