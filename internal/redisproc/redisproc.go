// Package redisproc runs the Redis baseline of the benchmarks (kvbench kv,
// kvycsb bench): Debian's redis-server on a free loopback port with
// persistence off, in a temporary directory, checked with a go-redis
// client, and killed (its directory removed) by Close.
package redisproc

import (
	"context"
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
)

// Server is a running redis-server and a client of it.
type Server struct {
	// Addr is the server's host:port; Client is connected to it.
	Addr   string
	Client *redis.Client
	cmd    *exec.Cmd
	exited chan error
	dir    string
}

// Options configure Start.
type Options struct {
	// Dir is where the server's temporary directory is made ("": the
	// system's temporary directory).
	Dir string
	// Pool is the client's connection pool size (0: go-redis's default).
	Pool int
	// Prepare, if set, adjusts the command before it starts (process
	// group, death signal).
	Prepare func(*exec.Cmd) error
}

// Find looks the redis-server binary bin up.
func Find(bin string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%s not found", bin)
	}
	return p, nil
}

// Start starts redis-server (the binary bin), waits until it answers
// PING, and checks that persistence is off.
func Start(ctx context.Context, bin string, o Options) (*Server, error) {
	dir, err := os.MkdirTemp(o.Dir, "redis-")
	if err != nil {
		return nil, fmt.Errorf("redis: directory: %w", err)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis: free port: %w", err)
	}
	s := &Server{dir: dir, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan error, 1)}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no")
	if o.Prepare != nil {
		if err := o.Prepare(s.cmd); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis: start %s: %w", bin, err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	s.Client = redis.NewClient(&redis.Options{
		Addr:                     s.Addr,
		PoolSize:                 o.Pool,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Client.Ping(ctx).Err()
		if err == nil {
			break
		}
		select {
		case werr := <-s.exited:
			s.exited <- werr
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			s.Close()
			return nil, fmt.Errorf("redis-server exited (%v): %s", werr, strings.TrimSpace(string(log)))
		case <-ctx.Done():
			s.Close()
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("redis-server on %s did not answer in 10 s: %w", s.Addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Persistence must be off: no RDB snapshot or AOF writes during the
	// measurements.
	for k, want := range map[string]string{"save": "", "appendonly": "no"} {
		got, err := s.Client.ConfigGet(ctx, k).Result()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("redis: CONFIG GET %s: %w", k, err)
		}
		if got[k] != want {
			s.Close()
			return nil, fmt.Errorf("redis: %s is %q, want %q", k, got[k], want)
		}
	}
	return s, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Close kills the server and removes its directory.
func (s *Server) Close() error {
	s.Client.Close()
	s.cmd.Process.Kill()
	err := <-s.exited
	s.exited <- err
	return os.RemoveAll(s.dir)
}
