package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/rdma"
)

// testMap is groups x 3 replicas and clients client slots on fabric.
func testMap(name, fabric string, groups, clients int) *cluster.Map {
	m := &cluster.Map{Name: name, Fabric: fabric}
	id := rdma.NodeID(1)
	for range groups {
		m.Groups = append(m.Groups, []rdma.NodeID{id, id + 1, id + 2})
		id += 3
	}
	for range clients {
		m.ClientNodes = append(m.ClientNodes, 100+id)
		id++
	}
	return m
}

func startLocal(t testing.TB, m *cluster.Map) *localcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bc := broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
	c, err := localcluster.Start(ctx, m, bc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func open(t testing.TB, lc *localcluster.Cluster, slot int, opts ...client.Option) *client.Client {
	t.Helper()
	n, err := lc.ClientNode(slot)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Open(ctx, append([]client.Option{client.WithMap(lc.Map), client.WithNode(n), client.WithSlot(slot)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestOperations(t *testing.T) {
	lc := startLocal(t, testMap("ops", "mem", 2, 1))
	c := open(t, lc, 0)
	ctx := context.Background()
	k := []byte("alpha")
	if _, err := c.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of a missing key: %v, want ErrNotFound", err)
	}
	w1, err := c.Put(ctx, k, []byte("one"))
	if err != nil || w1.Prev != 0 || w1.Version == 0 {
		t.Fatalf("put: %+v %v", w1, err)
	}
	for _, mode := range []client.Consistency{client.Linearizable, client.StaleOK} {
		it, err := c.GetItem(ctx, k, mode)
		if mode == client.StaleOK && (errors.Is(err, client.ErrNotFound) || err == nil && it.Version < w1.Version) {
			continue // a lagging replica may not have it yet
		}
		if err != nil || string(it.Value) != "one" || it.Version != w1.Version {
			t.Fatalf("%v get: %q v%d %v, want one v%d", mode, it.Value, it.Version, err, w1.Version)
		}
	}
	w2, err := c.Put(ctx, k, []byte("two"))
	if err != nil || w2.Prev != w1.Version || w2.Version <= w1.Version {
		t.Fatalf("second put: %+v %v (first %+v)", w2, err, w1)
	}
	if _, err := c.CompareAndSwap(ctx, k, []byte("one"), []byte("three")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("CAS on a stale value: %v, want ErrCASMismatch", err)
	}
	if _, err := c.CompareAndSwap(ctx, k, []byte("two"), []byte("three")); err != nil {
		t.Fatalf("CAS: %v", err)
	}
	if _, err := c.CompareAndSwap(ctx, []byte("beta"), nil, []byte("new")); err != nil {
		t.Fatalf("CAS on an absent key: %v", err)
	}
	if _, err := c.CompareAndSwap(ctx, []byte("beta"), nil, []byte("again")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("CAS expecting absence on a present key: %v", err)
	}
	it, _ := c.GetItem(ctx, k, client.Linearizable)
	if _, err := c.CompareVersionAndSwap(ctx, k, it.Version, []byte("four")); err != nil {
		t.Fatalf("CompareVersionAndSwap: %v", err)
	}
	if _, err := c.CompareVersionAndSwap(ctx, k, it.Version, []byte("five")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("CompareVersionAndSwap on an old version: %v", err)
	}
	d, err := c.Delete(ctx, k)
	if err != nil || d.Prev == 0 {
		t.Fatalf("delete: %+v %v", d, err)
	}
	if _, err := c.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	// A batch over both groups.
	var b client.Batch
	keys := map[uint32][]byte{}
	for i := 0; len(keys) < 2; i++ {
		key := []byte(fmt.Sprintf("batch-%d", i))
		keys[lc.Map.GroupOf(key)] = key
	}
	for _, key := range keys {
		b.Put(key, append([]byte("v-"), key...))
	}
	b.Delete([]byte("beta"))
	br, err := c.Commit(ctx, &b)
	if err != nil || len(br.Groups) != 2 {
		t.Fatalf("batch: %+v %v", br, err)
	}
	for _, key := range keys {
		v, err := c.Get(ctx, key)
		if err != nil || !bytes.Equal(v, append([]byte("v-"), key...)) {
			t.Fatalf("get %s after the batch: %q %v", key, v, err)
		}
	}
	// Values larger than a request slot travel in parts.
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if _, err := c.Put(ctx, []byte("big"), big); err != nil {
		t.Fatalf("1 MiB put: %v", err)
	}
	for _, mode := range []client.Consistency{client.Linearizable, client.StaleOK} {
		it, err := c.GetItem(ctx, []byte("big"), mode)
		if mode == client.StaleOK && errors.Is(err, client.ErrNotFound) {
			continue
		}
		if err != nil || !bytes.Equal(it.Value, big) {
			t.Fatalf("%v get of the 1 MiB value: %d bytes, %v", mode, len(it.Value), err)
		}
	}
	var bb client.Batch
	for i := range 3 {
		bb.Put([]byte(fmt.Sprintf("big-%d", i)), big[i*1000:i*1000+200<<10])
	}
	if _, err := c.Commit(ctx, &bb); err != nil {
		t.Fatalf("batch of 600 KiB: %v", err)
	}
	for i := range 3 {
		v, err := c.Get(ctx, []byte(fmt.Sprintf("big-%d", i)))
		if err != nil || !bytes.Equal(v, big[i*1000:i*1000+200<<10]) {
			t.Fatalf("get big-%d: %d bytes, %v", i, len(v), err)
		}
	}
	// Limits.
	if _, err := c.Put(ctx, make([]byte, 2000), nil); !errors.Is(err, client.ErrKeyTooLarge) {
		t.Fatalf("oversized key: %v", err)
	}
	if _, err := c.Put(ctx, []byte{}, nil); !errors.Is(err, client.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := c.Put(ctx, k, make([]byte, 2<<20)); !errors.Is(err, client.ErrValueTooLarge) {
		t.Fatalf("oversized value: %v", err)
	}
}

// TestGetsWithoutServerCPU pauses every replica's polling loop and shows
// that both kinds of get still answer, with the values written before.
func TestGetsWithoutServerCPU(t *testing.T) {
	lc := startLocal(t, testMap("pause", "mem", 2, 1))
	c := open(t, lc, 0)
	ctx := context.Background()
	want := map[string]string{}
	for i := range 50 {
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
}

// TestCombinedWrites drives one client from many goroutines, so that its
// window fills and single-key writes travel combined in multi requests:
// compare-and-swap increments of shared counters must add up exactly, and
// every put must be readable.
func TestCombinedWrites(t *testing.T) {
	lc := startLocal(t, testMap("combine", "mem", 2, 1))
	c := open(t, lc, 0)
	ctx := context.Background()
	const workers, incs = 24, 25
	counters := [][]byte{[]byte("counter-a"), []byte("counter-b"), []byte("counter-c")}
	errc := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range incs {
				k := counters[(w+i)%len(counters)]
				for {
					it, err := c.GetItem(ctx, k, client.Linearizable)
					n := 0
					if err == nil {
						fmt.Sscan(string(it.Value), &n)
					} else if !errors.Is(err, client.ErrNotFound) {
						errc <- err
						return
					}
					_, err = c.CompareVersionAndSwap(ctx, k, it.Version, []byte(fmt.Sprint(n+1)))
					if err == nil {
						break
					}
					if !errors.Is(err, client.ErrCASMismatch) {
						errc <- err
						return
					}
				}
				if _, err := c.Put(ctx, []byte(fmt.Sprintf("w%d-%d", w, i)), []byte(fmt.Sprint(w*1000+i))); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range workers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for _, k := range counters {
		v, err := c.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		fmt.Sscan(string(v), &n)
		total += n
	}
	if total != workers*incs {
		t.Fatalf("counters add up to %d, want %d", total, workers*incs)
	}
	st := c.Stats()
	t.Logf("%d single-key writes in %d messages", st.WriteOps, st.WriteMessages)
	if st.WriteOps <= st.WriteMessages {
		t.Fatalf("no write was combined: %d writes in %d messages", st.WriteOps, st.WriteMessages)
	}
	for w := range workers {
		for i := range incs {
			v, err := c.Get(ctx, []byte(fmt.Sprintf("w%d-%d", w, i)))
			if err != nil || string(v) != fmt.Sprint(w*1000+i) {
				t.Fatalf("w%d-%d: %q %v", w, i, v, err)
			}
		}
	}
}
