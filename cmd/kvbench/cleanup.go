package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma/shm"
)

// What a run leaves behind, and how it is cleaned up.
//
// Everything kvbench puts in shared memory lives in one work directory per
// --shm-dir and process, made by shm.MkdirOwned (kvbench-XXXX, marked with
// kvbench's pid and start time): the shm clusters of the fabric sessions
// and broadcast groups, the replicas' stable files and the raw baselines'
// files. A run that ends removes it. A run that is interrupted (SIGINT,
// SIGTERM) or whose stdout is closed (EPIPE) goes through abort: it kills
// its child processes, removes the work directories and exits with one
// line on stderr. A run that is killed outright (SIGKILL) takes its
// children with it (they are started with a parent-death signal), and the
// next kvbench's sweep of --shm-dir (shm.SweepStale) removes the work
// directory, whose owner and every file's owner are then dead.

var (
	cleanMu  sync.Mutex
	workDirs = map[string]string{} // --shm-dir -> this process's work directory in it
	stopping bool                  // abort began: no new children or directories

	// runCtx ends when abort begins.
	runCtx, cancelRun = context.WithCancel(context.Background())
)

// errStopping: abort began; nothing new is started.
var errStopping = errors.New("kvbench: stopping")

// workDir returns this process's work directory in shmDir, making it on
// first use.
func workDir(shmDir string) (string, error) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	if stopping {
		return "", errStopping
	}
	if d, ok := workDirs[shmDir]; ok {
		return d, nil
	}
	d, err := shm.MkdirOwned(shmDir, "kvbench-")
	if err != nil {
		return "", fmt.Errorf("work directory in %s: %w", shmDir, err)
	}
	workDirs[shmDir] = d
	return d, nil
}

// removeWorkDirs removes every work directory and returns their paths.
// Once abort began it is abort's: the run's own call leaves them to it.
func removeWorkDirs(byAbort bool) ([]string, error) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	if stopping && !byAbort {
		return nil, nil
	}
	var removed []string
	var errs []error
	for k, d := range workDirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d)
		delete(workDirs, k)
	}
	return removed, errors.Join(errs...)
}

// sweepShmDir removes what dead processes left in dir (shm.SweepStale) and
// says so on stderr. A missing dir is no error: a run on mem needs none.
func sweepShmDir(dir string, stderr io.Writer) {
	removed, err := shm.SweepStale(dir)
	for _, p := range removed {
		fmt.Fprintf(stderr, "kvbench: removed %s, left by a dead process\n", p)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "kvbench: sweep of %s: %v\n", dir, err)
	}
}

// childCmd prepares cmd to run as a child process of this kvbench: in a
// process group of its own, so that a Ctrl-C at the terminal reaches only
// kvbench (which then kills it, see abort), and with SIGKILL as its
// parent-death signal, so that it does not outlive a kvbench killed
// outright. (The signal follows the thread that started the child; kvbench
// never ends threads: it does not lock goroutines to threads.) It fails
// once abort began.
func childCmd(cmd *exec.Cmd) error {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	if stopping {
		return errStopping
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return nil
}

// childPids lists this process's live (not zombie) children, from /proc.
func childPids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')') // comm may hold spaces and parentheses
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil && ppid == self {
			out = append(out, pid)
		}
	}
	return out
}

// killChildren SIGKILLs every child process until none is left alive (a
// child started meanwhile is found by the next look), for at most 5 s. It
// returns how many it killed.
func killChildren() int {
	killed := map[int]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for quiet := 0; quiet < 2 && time.Now().Before(deadline); {
		pids := childPids()
		if len(pids) == 0 {
			quiet++
		} else {
			quiet = 0
		}
		for _, p := range pids {
			unix.Kill(p, unix.SIGKILL)
			killed[p] = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return len(killed)
}

// exit ends the process with code, unless abort began: then the run ended
// because abort killed its children, and abort exits when it is done.
func exit(code int) {
	cleanMu.Lock()
	s := stopping
	cleanMu.Unlock()
	if s {
		select {}
	}
	os.Exit(code)
}

var abortOnce sync.Once

// abort ends a run that cannot go on (a signal, a closed stdout): it stops
// new children, silences stderr, cancels runCtx, kills the children,
// removes the work directories, prints one line and exits with code.
// Callers after the first wait for its exit.
func abort(why string, code int, stderr *gatedWriter) {
	first := false
	abortOnce.Do(func() { first = true })
	if !first {
		select {}
	}
	cleanMu.Lock()
	stopping = true
	cleanMu.Unlock()
	stderr.close()
	cancelRun()
	n := killChildren()
	removed, err := removeWorkDirs(true)
	msg := fmt.Sprintf("kvbench: %s: stopped; killed %d child process(es)", why, n)
	if len(removed) > 0 {
		msg += ", removed " + strings.Join(removed, ", ")
	}
	if err != nil {
		msg += fmt.Sprintf("; cleanup failed: %v", err)
	}
	fmt.Fprintln(os.Stderr, strings.ReplaceAll(msg, "\n", "; "))
	os.Exit(code)
}

// gatedWriter passes writes on until it is closed, then drops them (after
// abort began, progress lines would only bury its message). Write errors
// are dropped too: there is nowhere to report them.
type gatedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.w.Write(p)
	}
	return len(p), nil
}

func (g *gatedWriter) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// stdoutWriter ends the run through abort when a write fails (a closed
// pipe: EPIPE, since main asks for SIGPIPE instead of dying of it).
type stdoutWriter struct {
	w      io.Writer
	stderr *gatedWriter
}

func (s stdoutWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil {
		abort(fmt.Sprintf("write to stdout: %v", err), 1, s.stderr)
	}
	return n, err
}

// handleSignals makes SIGINT and SIGTERM abort the run (exit 128+signal),
// and turns SIGPIPE into write errors (EPIPE) that stdoutWriter handles.
func handleSignals(stderr *gatedWriter) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE)
	go func() {
		for s := range ch {
			if s == syscall.SIGPIPE {
				continue
			}
			abort(fmt.Sprintf("interrupted (%v)", s), 128+int(s.(syscall.Signal)), stderr)
		}
	}()
}
