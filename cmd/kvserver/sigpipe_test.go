package main_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClosedOutputKeepsCleanup is kvserver | tee, then Ctrl-C, with real
// processes: kvserver's stdout and stderr are pipes whose readers close
// once it is up (tee dies of the same Ctrl-C), then it gets SIGINT. Its
// writes after that ("stopping", the logs) fail; it must still stop
// cleanly (exit 0, not killed by SIGPIPE) and leave nothing behind: no shm
// file, and for the embedded cluster no map and no lock file. Both modes:
// the embedded cluster, one replica per process (--config --id) and
// replicas of two groups in one (--id 1,2).
func TestClosedOutputKeepsCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvserver")
	}
	kvserver := build(t, "./cmd/kvserver")

	t.Run("embedded", func(t *testing.T) {
		d := t.TempDir()
		shmDir := filepath.Join(d, "shm")
		if err := os.Mkdir(shmDir, 0o755); err != nil {
			t.Fatal(err)
		}
		mapFile := filepath.Join(d, "run", "cluster.json")
		name := fmt.Sprintf("sp%d", os.Getpid())
		runClosedOutput(t, kvserver, "stop:", shmDir, "--memory", "--map", mapFile, "--shm-dir", shmDir, "--name", name,
			"--control", "-", "--log-level", "info", "--groups", "1", "--replicas", "3", "--clients", "2")
		for _, f := range []string{mapFile, mapFile + ".lock"} {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left behind (%v)", f, err)
			}
		}
	})

	t.Run("replica", func(t *testing.T) {
		d := t.TempDir()
		shmDir := filepath.Join(d, "shm")
		if err := os.Mkdir(shmDir, 0o755); err != nil {
			t.Fatal(err)
		}
		config := filepath.Join(d, "cluster.toml")
		toml := fmt.Sprintf("name = \"sp%d\"\nfabric = \"shm\"\nshm_dir = %q\ndata_dir = %q\n[timing]\nheartbeat = \"5ms\"\nelection_timeout = \"100ms\"\n[[group]]\n[[group.replica]]\nid = 1\n[[clients]]\ncount = 1\n",
			os.Getpid(), shmDir, filepath.Join(d, "data"))
		if err := os.WriteFile(config, []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		runClosedOutput(t, kvserver, "runs (pid", shmDir, "--config", config, "--id", "1", "--control", "-", "--log-level", "info")
	})

	// Replicas of two groups (of one replica each) in one process.
	t.Run("replicas", func(t *testing.T) {
		d := t.TempDir()
		shmDir := filepath.Join(d, "shm")
		if err := os.Mkdir(shmDir, 0o755); err != nil {
			t.Fatal(err)
		}
		config := filepath.Join(d, "cluster.toml")
		toml := fmt.Sprintf("name = \"sq%d\"\nfabric = \"shm\"\nshm_dir = %q\ndata_dir = %q\n[timing]\nheartbeat = \"5ms\"\nelection_timeout = \"100ms\"\n[[group]]\n[[group.replica]]\nid = 1\n[[group]]\n[[group.replica]]\nid = 2\n[[clients]]\ncount = 1\n",
			os.Getpid(), shmDir, filepath.Join(d, "data"))
		if err := os.WriteFile(config, []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		runClosedOutput(t, kvserver, "replicas 1,2 of cluster", shmDir, "--config", config, "--id", "1,2", "--control", "-", "--log-level", "info")
	})
}

// runClosedOutput starts kvserver with args, waits for the stdout line
// containing up, closes the read ends of its stdout and stderr pipes,
// sends it SIGINT and checks that it exits 0 and leaves shmDir empty.
func runClosedOutput(t *testing.T, kvserver, up, shmDir string, args ...string) {
	t.Helper()
	cmd := exec.Command(kvserver, args...)
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outW.Close()
	errW.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	}()
	// Stderr is read until it is closed, up to the moment the test closes
	// it (what kvserver wrote there shows in a failure).
	var stderr strings.Builder
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		b := make([]byte, 4096)
		for {
			n, err := errR.Read(b)
			stderr.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()
	seen := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			if strings.Contains(sc.Text(), up) {
				seen <- true
				return
			}
		}
		seen <- false
	}()
	select {
	case ok := <-seen:
		if !ok {
			t.Fatalf("kvserver's stdout ended before %q", up)
		}
	case err := <-exited:
		exited <- err
		t.Fatalf("kvserver exited before it was up: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("kvserver did not print %q in 60 s", up)
	}
	if files := list(t, shmDir); len(files) == 0 {
		t.Fatalf("no file in the shm dir %s while kvserver runs", shmDir)
	}
	// tee is gone: both pipes have no reader any more.
	outR.Close()
	errR.Close()
	<-stderrDone
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					t.Errorf("kvserver died of %v after SIGINT with its output closed, want exit 0", ws.Signal())
				} else {
					t.Errorf("kvserver exited %v after SIGINT with its output closed, want 0", err)
				}
			} else {
				t.Errorf("kvserver: %v", err)
			}
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("kvserver did not exit in 60 s of SIGINT")
	}
	if files := list(t, shmDir); len(files) > 0 {
		t.Errorf("kvserver left in %s: %v", shmDir, files)
	}
	if t.Failed() {
		t.Logf("kvserver's stderr before its pipe closed:\n%s", stderr.String())
	}
}

func list(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}
