package server_test

import (
	"context"
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

// TestDurableTablesPrefaultSpare: a durable replica's table keeps a spare
// for its captures' index copies, pre-faulted off the polling goroutine
// (kv.TableConfig.PrefaultSpare, issue 19); a memory-mode one does not
// (its captures are rare: a member behind the log), so it pays no spare
// before its first capture.
func TestDurableTablesPrefaultSpare(t *testing.T) {
	for _, mode := range []broadcast.Durability{broadcast.Memory, broadcast.Sync} {
		t.Run(mode.String(), func(t *testing.T) {
			m := &cluster.Map{Name: "prefault", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
			if err := m.Fill(); err != nil {
				t.Fatal(err)
			}
			p, stop := startDurableMode(t, m, t.TempDir(), mode, nil)
			defer stop()
			c := openClient(t, p, m)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			val := strings.Repeat("x", 1000)
			for i := range 200 { // 200 KB of log: disk snapshots every 64 KiB in sync mode
				if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte(val)); err != nil {
					t.Fatalf("put k%d: %v", i, err)
				}
			}
			for i := range 3 {
				var st kv.Stats
				if err := p.Do(0, i, func(r *kv.Replica) { st = r.Table().Stats() }); err != nil {
					t.Fatal(err)
				}
				t.Logf("replica %d: %d spares pre-faulted, %d captures into a fresh index copy", i, st.SparePrefaults, st.FreshIndexCopies)
				if got := st.SparePrefaults > 0; got != (mode != broadcast.Memory) {
					t.Errorf("replica %d in %v mode: %d spares pre-faulted", i, mode, st.SparePrefaults)
				}
			}
		})
	}
}

// TestCaptureCPUStatus: a durable replica's /status counts its disk
// snapshot captures and shows the longest one's wall time and the most
// CPU time one took on its polling thread, no more than that wall time
// (the thread's clock, read on one thread around the capture); and the
// thread locks the CPU clock takes for a capture are undone after its
// Poll.
func TestCaptureCPUStatus(t *testing.T) {
	m := &cluster.Map{Name: "capcpu", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	p, stop := startDurableMode(t, m, t.TempDir(), broadcast.Sync, nil)
	defer stop()
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
	time.Sleep(100 * time.Millisecond) // /status copies at most 50 ms old
	captures := uint64(0)
	for _, r := range p.Replicas() {
		rs := r.Status()
		d := rs.Disk
		if d == nil {
			t.Fatalf("replica %d: no disk status in sync mode", rs.Index)
		}
		t.Logf("replica %d: %d captures, longest %.0f µs, most CPU %.0f µs", rs.Index, d.Captures, d.CaptureMaxUs, d.CaptureCPUMaxUs)
		captures += d.Captures
		if d.Captures > 0 && (d.CaptureCPUMaxUs <= 0 || d.CaptureCPUMaxUs > d.CaptureMaxUs+50) {
			t.Errorf("replica %d: capture CPU max %.1f µs against a longest capture of %.1f µs: want more than 0 and no more than it", rs.Index, d.CaptureCPUMaxUs, d.CaptureMaxUs)
		}
		n, err := server.CaptureThreadLocks(p, 0, rs.Index)
		if err != nil || n != 0 {
			t.Errorf("replica %d: %d thread locks held between Polls (%v)", rs.Index, n, err)
		}
	}
	if captures == 0 {
		t.Fatal("no disk snapshot captured after 200 KB of log")
	}
}
