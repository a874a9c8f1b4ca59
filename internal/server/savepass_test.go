package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// runSavePasses starts a sync-mode group with bug planted ("": none),
// writes until its replicas took disk snapshots, and returns the first
// property of the save passes' statistics (/status save_pass_*,
// poll_max_saving) that failed, nil if none did.
func runSavePasses(t *testing.T, bug string) error {
	m := &cluster.Map{Name: "savepass", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	p, stop := startProcess(t, m, t.TempDir(), func(pc *server.ProcessConfig) {
		pc.Durable.Mode = broadcast.Sync
		pc.SavePollDetail = true
		if bug != "" {
			server.SetSaveBug(pc, bug)
		}
	})
	defer stop()
	status := func() server.ProcessStatus {
		t.Helper()
		_, body := get(t, "http://"+p.ControlAddr()+"/status")
		var st server.ProcessStatus
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	sum := func(st server.ProcessStatus) (passes, saves, over uint64, maxUs, passMaxUs float64) {
		for _, x := range st.Pollers {
			passes, saves, over = passes+x.Passes, saves+x.SavePasses, over+x.SavePassesOver
			maxUs, passMaxUs = max(maxUs, x.SavePassMaxUs), max(passMaxUs, x.PassMaxUs)
		}
		return
	}
	// waitSaved waits until no replica has a disk snapshot under way
	// (read between its Polls, where it does not change), then checks
	// that every interval in the process's Watch of saves is closed.
	waitSaved := func() error {
		deadline := time.Now().Add(time.Minute)
		for {
			saving := 0
			for i := range 3 {
				if err := p.Do(0, i, func(r *kv.Replica) {
					if r.Multicast().Broadcast().DiskSnapSaving() {
						saving++
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if saving == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d replicas still saving a minute after the last write", saving)
			}
			time.Sleep(time.Millisecond)
		}
		if n := server.SavesOpen(p); n != 0 {
			return fmt.Errorf("open: %d saves open in the Watch with none under way", n)
		}
		return nil
	}
	waitPasses := func(n uint64) {
		t.Helper()
		p0, _, _, _, _ := sum(status())
		deadline := time.Now().Add(time.Minute)
		for {
			if p1, _, _, _, _ := sum(status()); p1 >= p0+n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pollers did not pass %d times in a minute", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	st := status()
	for _, x := range st.Pollers {
		if x.SavePassBoundUs != 2500 { // ElectionTimeout 50 ms / 20
			t.Fatalf("poller %d: save pass bound %.0f µs, want 2500", x.Poller, x.SavePassBoundUs)
		}
	}
	if _, saves, _, _, _ := sum(st); saves != 0 {
		return fmt.Errorf("outside: %d save passes before any write", saves)
	}
	c := openClient(t, p, m)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	val := strings.Repeat("x", 1000)
	for i := range 200 { // 200 KB of log: disk snapshots every 64 KiB
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte(val)); err != nil {
			t.Fatalf("put k%d: %v", i, err)
		}
	}
	if err := waitSaved(); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // /status copies at most 50 ms old
	st = status()
	captures := uint64(0)
	savingPoll := 0.0
	for _, r := range st.Replicas {
		captures += r.Disk.Captures
		savingPoll = max(savingPoll, r.PollMaxSaving.Us)
	}
	_, saves, over, maxUs, passMaxUs := sum(st)
	t.Logf("%d captures; %d save passes, %d over the bound, the longest %.0f µs (every pass: %.0f µs); longest replica Poll in a save %.0f µs", captures, saves, over, maxUs, passMaxUs, savingPoll)
	switch {
	case captures == 0:
		t.Fatal("no disk snapshot captured after 200 KB of log")
	case saves == 0 || maxUs <= 0:
		return fmt.Errorf("none: %d captures and no save pass counted (longest %.0f µs)", captures, maxUs)
	case savingPoll <= 0:
		return fmt.Errorf("poll: no replica Poll counted in a save")
	case over > saves || maxUs > passMaxUs:
		return fmt.Errorf("counts: %d of %d save passes over the bound, the longest %.0f µs of %.0f µs", over, saves, maxUs, passMaxUs)
	}
	// Every capture went through the process's save gate (its
	// replicas save one at a time: broadcast.SaveGate).
	gateWaits := uint64(0)
	for _, r := range st.Replicas {
		gateWaits += r.Disk.CaptureGateWaits
	}
	t.Logf("save gate: %d captures taken, %d Polls held back", server.SaveGateTaken(p), gateWaits)
	if taken := server.SaveGateTaken(p); taken != captures {
		return fmt.Errorf("gate: the process's save gate let %d captures start, the replicas captured %d", taken, captures)
	}
	// A Poll that started in a save has its thread's counters, and
	// its CPU and run delay lie within its wall time.
	read := false
	for _, r := range st.Replicas {
		d := r.PollMaxSavingRead
		if !d.Thread {
			continue
		}
		read = true
		if d.ThreadCPUUs+d.ThreadRunDelayUs > d.Us || d.ThreadCPUUs <= 0 {
			return fmt.Errorf("thread: a Poll of %.0f µs read %.0f µs of CPU and %.0f µs of run delay", d.Us, d.ThreadCPUUs, d.ThreadRunDelayUs)
		}
	}
	if !read {
		return fmt.Errorf("thread: no Poll in a save had its thread read")
	}
	// No save under way: the pollers pass on (heartbeats), and none of
	// those passes counts.
	waitPasses(20)
	_, saves0, _, _, _ := sum(status())
	waitPasses(50)
	if _, saves1, _, _, _ := sum(status()); saves1 != saves0 {
		return fmt.Errorf("outside: %d save passes counted with no save under way", saves1-saves0)
	}
	return nil
}

// TestSavePassStatus: a durable process's /status counts the passes of
// a leader's poller that overlap a disk snapshot's save (issue 19's
// bound is on those), none before the first write or after every save
// ended, and its replicas show their longest Poll in a save; every
// capture went through the process's save gate. Planted: an interval
// never closed (noEnd), no replica watching (noLeader), replicas
// without the gate (noGate).
func TestSavePassStatus(t *testing.T) {
	if err := runSavePasses(t, ""); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ bug, want string }{
		{"noEnd", "open:"},
		{"noLeader", "none:"},
		{"noGate", "gate:"},
	} {
		t.Run(c.bug, func(t *testing.T) {
			err := runSavePasses(t, c.bug)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("planted %s: got %v, want a %q failure", c.bug, err, c.want)
			}
			t.Logf("planted %s caught: %v", c.bug, err)
		})
	}
}
