package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestClosedOutputKeepsCleanup is kvycsb loadrun --embedded | head -1 with
// real processes: kvycsb's stdout is a pipe whose reader closes after the
// first line. kvycsb's later writes fail; it must not die of SIGPIPE (the
// Go runtime's default for a write to a closed stdout), nor panic (go-ycsb
// panics when it cannot write its measurements), before it closed its
// embedded cluster: no cluster process and no shm file of the cluster may
// be left.
func TestClosedOutputKeepsCleanup(t *testing.T) {
	cmd := exec.Command(kvycsbBin(t), "loadrun", "a", "--embedded", "--records", "2000", "--ops", "2000", "--threads", "2")
	cmd.Dir = t.TempDir()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuilder
	cmd.Stdout, cmd.Stderr = outW, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outW.Close()
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
	// head -1: one line, then the pipe's only reader is gone.
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(outR).ReadString('\n')
		outR.Close()
		line <- s
	}()
	select {
	case s := <-line:
		if s == "" {
			t.Fatalf("kvycsb's stdout ended before a line; stderr:\n%s", stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("no line on kvycsb's stdout in 2 minutes; stderr:\n%s", stderr.String())
	}
	select {
	case err = <-exited:
		exited <- err
	case <-time.After(3 * time.Minute):
		t.Fatalf("kvycsb did not end in 3 minutes with its stdout closed; stderr:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
		t.Errorf("kvycsb died of %v with its stdout closed, want it to end on its own after closing its cluster", ee.Sys().(syscall.WaitStatus).Signal())
	}
	if strings.Contains(stderr.String(), "panic:") {
		t.Errorf("kvycsb panicked with its stdout closed, want a one-line error")
	}
	// What it left, in the way TestLoadRunEmbedded looks: its cluster is
	// named for its pid.
	if m := regexp.MustCompile(`in process ([0-9]+),`).FindStringSubmatch(stderr.String()); m != nil {
		if _, err := os.Stat("/proc/" + m[1]); err == nil {
			t.Errorf("the cluster's process %s still exists", m[1])
		}
	}
	name := fmt.Sprintf("kvycsb-%d.", cmd.Process.Pid)
	ents, _ := os.ReadDir("/dev/shm")
	var left []string
	for _, e := range ents {
		if strings.Contains(e.Name(), name) {
			left = append(left, e.Name())
			os.Remove("/dev/shm/" + e.Name()) // not to leave them to the next test
		}
	}
	if len(left) > 0 {
		t.Errorf("left in /dev/shm: %d files, %s...", len(left), left[0])
	}
	if t.Failed() {
		t.Logf("kvycsb's stderr:\n%s", stderr.String())
	}
}

// syncBuilder is a strings.Builder a process writes while the test reads.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuilder) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuilder) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
