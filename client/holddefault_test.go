package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

// TestCombineHoldDefault: a client chooses its write-combining hold by the
// map's durability when WithCombineHold does not say: the whole window
// (client_slots) on a memory or async cluster or a map that does not say,
// DefaultSyncCombineHold on a sync cluster; an explicit WithCombineHold
// wins either way. On the sync map a lone writer still posts each put at
// once (its own message: nothing of its group is in flight when it
// writes, so the hold never makes it wait). A sync cluster started from
// a map without the field (the embedded cluster's) fills it in, so the
// map it serves and kvserver saves tells clients the mode.
func TestCombineHoldDefault(t *testing.T) {
	lc := startLocal(t, testMap("holddef", "mem", 1, 6))
	window := lc.Map.Limits.ClientSlots
	if lc.Map.Durability != "" {
		t.Fatalf("a memory cluster's map says durability %q, want nothing", lc.Map.Durability)
	}
	with := func(d string) *cluster.Map {
		m := *lc.Map
		m.Durability = d
		return &m
	}
	for slot, tc := range []struct {
		durability string
		opts       []client.Option
		want       int
	}{
		{"", nil, window},
		{cluster.DurabilityMemory, nil, window},
		{cluster.DurabilityAsync, nil, window},
		{cluster.DurabilitySync, nil, client.DefaultSyncCombineHold},
		{cluster.DurabilitySync, []client.Option{client.WithCombineHold(0)}, window},
		{cluster.DurabilitySync, []client.Option{client.WithCombineHold(3)}, 3},
	} {
		n, err := lc.ClientNode(slot)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := client.Open(ctx, append([]client.Option{client.WithMap(with(tc.durability)), client.WithNode(n), client.WithSlot(slot)}, tc.opts...)...)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := client.CombineHold(c); got != tc.want {
			t.Errorf("durability %q, %d options: hold %d, want %d", tc.durability, len(tc.opts), got, tc.want)
		}
		if tc.durability != cluster.DurabilitySync || tc.opts != nil {
			continue
		}
		before := c.Stats()
		for i := range 20 {
			if _, err := c.Put(context.Background(), fmt.Appendf(nil, "lone%d", i), []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
		st := c.Stats()
		if msgs, ops := st.WriteMessages-before.WriteMessages, st.WriteOps-before.WriteOps; msgs != 20 || ops != 20 {
			t.Errorf("a lone writer's 20 puts on the sync map: %d writes in %d messages, want each in its own", ops, msgs)
		}
	}

	// A sync cluster fills in its map's durability.
	m := testMap("holdsync", "mem", 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bc := broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
	sc, err := localcluster.StartWith(ctx, m, bc, localcluster.Options{DataDir: t.TempDir(), Durable: server.DurableConfig{Mode: broadcast.Sync, SegmentBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Close)
	if m.Durability != cluster.DurabilitySync {
		t.Fatalf("a sync cluster's map says durability %q, want sync", m.Durability)
	}
	c := open(t, sc, 0)
	if got := client.CombineHold(c); got != client.DefaultSyncCombineHold {
		t.Errorf("a client of the sync cluster: hold %d, want %d", got, client.DefaultSyncCombineHold)
	}
	if _, err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
}
