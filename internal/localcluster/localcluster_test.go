package localcluster_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

func startShm(t *testing.T, name string, groups int) *localcluster.Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-lctest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m := &cluster.Map{Name: name, Fabric: "shm", ShmDir: dir}
	id := rdma.NodeID(1)
	for range groups {
		m.Groups = append(m.Groups, []rdma.NodeID{id, id + 1, id + 2})
		id += 3
	}
	m.ClientNodes = []rdma.NodeID{100, 101}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lc, err := localcluster.Start(ctx, m, broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Close)
	return lc
}

func openClient(t *testing.T, lc *localcluster.Cluster, slot int) *client.Client {
	t.Helper()
	n, err := lc.ClientNode(slot)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Open(ctx, client.WithMap(lc.Map), client.WithNode(n), client.WithSlot(slot))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLinearizableOnPollers: an shm cluster of three groups whose nine
// replicas share the process's pollers (a group's replicas stay on one
// poller, so with two pollers one of them owns two groups' replicas,
// parked on all their nodes' doorbells at once) serves concurrent puts,
// deletes and linearizable gets from two clients, while followers are
// paused and resumed; the history is linearizable (porcupine).
func TestLinearizableOnPollers(t *testing.T) {
	lc := startShm(t, "lin", 3)
	tasks := 0
	for _, st := range lc.PollerStats() {
		tasks += st.Tasks
	}
	if tasks != 9 {
		t.Fatalf("pollers own %d tasks, want the 9 replicas", tasks)
	}
	cs := []*client.Client{openClient(t, lc, 0), openClient(t, lc, 1)}
	rec := kvcheck.NewRecorder(nil)
	const workers, ops = 4, 120
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stopPauser := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		for {
			select {
			case <-stopPauser:
				return
			default:
			}
			g := rng.IntN(3)
			i := rng.IntN(3)
			if lc.Leader(g) == i {
				continue
			}
			lc.Pause(g, i)
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
			lc.ResumeReplica(g, i)
		}
	})
	var wg sync.WaitGroup
	for w := range workers {
		c := cs[w%2]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for n := range ops {
				key := fmt.Sprintf("k%d", rng.IntN(9))
				switch rng.IntN(3) {
				case 0:
					v := fmt.Sprintf("w%d-%d", w, n)
					id := rec.Begin(w, kvcheck.Op{Kind: kvcheck.Put, Key: key, Value: v})
					_, err := c.Put(ctx, []byte(key), []byte(v))
					rec.End(id, kvcheck.Output{Unknown: err != nil})
				case 1:
					id := rec.Begin(w, kvcheck.Op{Kind: kvcheck.Delete, Key: key})
					_, err := c.Delete(ctx, []byte(key))
					rec.End(id, kvcheck.Output{Unknown: err != nil})
				case 2:
					id := rec.Begin(w, kvcheck.Op{Kind: kvcheck.Get, Key: key})
					it, err := c.GetItem(ctx, []byte(key), client.Linearizable)
					switch {
					case errors.Is(err, client.ErrNotFound):
						rec.End(id, kvcheck.Output{})
					case err != nil:
						rec.End(id, kvcheck.Output{Unknown: true})
					default:
						rec.End(id, kvcheck.Output{Found: true, Value: string(it.Value)})
					}
				}
			}
		})
	}
	wg.Wait()
	close(stopPauser)
	pwg.Wait()
	h := rec.History()
	unknown := 0
	for _, o := range h {
		if o.Out.Unknown {
			unknown++
		}
	}
	if unknown > len(h)/2 {
		t.Fatalf("%d of %d operations failed", unknown, len(h))
	}
	res, err := kvcheck.CheckLinearizable(h, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ops (%d unknown) linearizable; pollers %+v", len(h), unknown, lc.PollerStats())
}

// TestPausedMemoryReadable: with every replica paused (no Poll runs), an
// shm cluster's memory still answers both kinds of get one-sided, with the
// values written before; resumed, it takes writes again.
func TestPausedMemoryReadable(t *testing.T) {
	lc := startShm(t, "pause", 2)
	c := openClient(t, lc, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := map[string]string{}
	for i := range 30 {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		if _, err := c.Put(ctx, []byte(k), []byte(v)); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	for g := range lc.Map.Groups {
		for i := range lc.Map.Groups[g] {
			lc.Pause(g, i)
		}
	}
	for k, v := range want {
		for _, mode := range []client.Consistency{client.Linearizable, client.StaleOK} {
			it, err := c.GetItem(ctx, []byte(k), mode)
			if mode == client.StaleOK && errors.Is(err, client.ErrNotFound) {
				continue // a follower may lag behind the acknowledged writes
			}
			if err != nil || string(it.Value) != v {
				t.Fatalf("%v get %s with every replica paused: %q %v", mode, k, it.Value, err)
			}
		}
	}
	for g := range lc.Map.Groups {
		for i := range lc.Map.Groups[g] {
			lc.ResumeReplica(g, i)
		}
	}
	if _, err := c.Put(ctx, []byte("after"), []byte("resume")); err != nil {
		t.Fatalf("put after Resume: %v", err)
	}
}

// TestDurableRestart: a local cluster started with a data dir in sync mode
// comes back with its data after Close (every replica at once), with a
// log per replica and with one shared log (the layout it asked for: a
// replica's status names the shared log or none); one of another shape
// is refused on the same dir.
func TestDurableRestart(t *testing.T) {
	for _, layout := range []string{cluster.WALPerReplica, cluster.WALShared} {
		t.Run(layout, func(t *testing.T) { durableRestart(t, layout) })
	}
}

func durableRestart(t *testing.T, layout string) {
	dir := t.TempDir()
	m := &cluster.Map{Name: "dur", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
	bc := broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
	o := localcluster.Options{DataDir: dir, Durable: server.DurableConfig{Mode: broadcast.Sync, SegmentBytes: 1 << 20}, WALLayout: layout}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lc, err := localcluster.StartWith(ctx, m, bc, o)
	if err != nil {
		t.Fatal(err)
	}
	c := openClient(t, lc, 0)
	for i := range 100 {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	lc.Close()
	other := &cluster.Map{Name: "dur", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	if _, err := localcluster.StartWith(ctx, other, bc, o); err == nil || !strings.Contains(err.Error(), "holds the data of cluster") {
		t.Fatalf("a map of another shape on the same data dir: %v", err)
	}
	lc, err = localcluster.StartWith(ctx, m, bc, o)
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: cleanups run after defers, last first, so
	// the client openClient registers below closes before the cluster
	// frees the regions its keeper goroutine reads (a defer ran first:
	// a data race the race detector caught in CI).
	t.Cleanup(lc.Close)
	want := ""
	if layout == cluster.WALShared {
		want = filepath.Join(dir, "wal")
	}
	if st := lc.Replicas()[4].Status(); st.Disk == nil || st.Disk.SharedLog != want {
		t.Errorf("wal layout %s: replica 5's disk status %+v, want shared log %q", layout, st.Disk, want)
	}
	c = openClient(t, lc, 0)
	for i := range 100 {
		v, err := c.Get(ctx, fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("after the restart k%d: %q, %v", i, v, err)
		}
	}
}
