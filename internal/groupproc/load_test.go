package groupproc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// memGroup starts three members on the mem fabric in this process and
// returns them with the index of the leader once it committed in its epoch.
func memGroup(t *testing.T, record bool) ([]*Member, int) {
	t.Helper()
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	var ms []*Member
	for _, id := range ids {
		n, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Start(Config{Self: id, Members: ids, Record: record, Tuning: Tuning{ElectionTimeout: 200 * time.Millisecond}}, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		ms = append(ms, m)
	}
	deadline := time.Now().Add(testWait)
	for time.Now().Before(deadline) {
		for i, m := range ms {
			if s := m.Replica().Status(); s.Role == broadcast.Leader && s.Committed.E == s.ECur {
				return ms, i
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no leader committed in its epoch within %v%s", testWait, memberStatuses(ms))
	return nil, 0
}

// loadWithin runs ms[i].Load with a context that ends after d and fails
// the test if the load was still running then: Load waits for its
// proposals, which must resolve (the context bounds the wait: Load stops,
// drains within its drain bound and returns).
func loadWithin(t *testing.T, ms []*Member, i int, spec LoadSpec, d time.Duration) LoadResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	res, err := ms[i].Load(ctx, spec)
	if err != nil {
		t.Fatalf("load %+v at member %d: %v after %v%s", spec, i+1, err, time.Since(start).Round(time.Millisecond), memberStatuses(ms))
	}
	if ctx.Err() != nil {
		t.Fatalf("load %+v at member %d still running after %v (bound %v): %+v%s", spec, i+1, time.Since(start).Round(time.Millisecond), d, res, memberStatuses(ms))
	}
	return res
}

func memberStatuses(ms []*Member) string {
	var b strings.Builder
	for _, m := range ms {
		s := m.Replica().Status()
		fmt.Fprintf(&b, "\n\tmember %d: %+v", s.Self, s)
	}
	return b.String()
}

// TestLoad runs the closed-loop client at the leader: every measured
// proposal is delivered (at every member, in the same order), latencies are
// positive and ordered, the window bounds what is outstanding, and the
// load ends by itself after Duration.
func TestLoad(t *testing.T) {
	ms, ldr := memGroup(t, true)
	const window = 8
	spec := LoadSpec{Window: window, Size: 16, Warmup: 20 * time.Millisecond, Duration: 100 * time.Millisecond}
	res := loadWithin(t, ms, ldr, spec, spec.Warmup+spec.Duration+testWait)
	if res.N == 0 || res.Failed != 0 || res.FirstErr != "" {
		t.Fatalf("load: %+v, want deliveries and no failures", res)
	}
	if res.P50 <= 0 || res.P99 < res.P50 || res.OpsPerS <= 0 {
		t.Fatalf("load: p50 %v p99 %v ops/s %v", res.P50, res.P99, res.OpsPerS)
	}
	if res.Elapsed < spec.Duration || res.Elapsed > spec.Duration+2*time.Second {
		t.Fatalf("load: measured for %v, want about %v", res.Elapsed, spec.Duration)
	}
	// Load returns once its outstanding proposals resolved: the leader
	// delivered every one of them, and no message twice.
	ents := ms[ldr].FSM().Entries()
	if uint64(len(ents)) < res.N {
		t.Fatalf("leader delivered %d entries, load counted %d", len(ents), res.N)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		if seen[e] {
			t.Fatalf("entry %x delivered twice", e)
		}
		seen[e] = true
	}
	// The followers deliver the same sequence (prefixes of the leader's).
	deadline := time.Now().Add(testWait)
	for i, m := range ms {
		for len(m.FSM().Entries()) < len(ents) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		got := m.FSM().Entries()
		if len(got) < len(ents) {
			t.Fatalf("member %d delivered %d entries, leader %d, after %v%s", i+1, len(got), len(ents), testWait, memberStatuses(ms))
		}
		for k := range ents {
			if got[k] != ents[k] {
				t.Fatalf("member %d entry %d differs from the leader's", i, k)
			}
		}
	}
}

// TestLoadStop: a load without a Duration runs until its context ends,
// then drains its window and reports what it measured.
func TestLoadStop(t *testing.T) {
	ms, ldr := memGroup(t, false)
	// The context ends once the leader delivered more entries than the
	// window holds: the fifth proposal is only made by a completion, which
	// counts. (A fixed 150 ms could end before anything completed on a
	// loaded machine.) testWait bounds it all the same.
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	idx0 := ms[ldr].Replica().Status().Index
	go func() {
		for ctx.Err() == nil && ms[ldr].Replica().Status().Index < idx0+5 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	// Load returns an error if its window does not drain within its drain
	// bound once stopped.
	res, err := ms[ldr].Load(ctx, LoadSpec{Window: 4, Size: 8})
	if err != nil {
		t.Fatal(err)
	}
	if res.N == 0 || res.Failed != 0 {
		t.Fatalf("load: %+v", res)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), testWait)
	defer wcancel()
	if _, err := ms[ldr].Load(wctx, LoadSpec{Window: 0, Size: 8}); err == nil {
		t.Fatal("window 0 accepted")
	}
	// A message the replica refuses at once ends the load with the error
	// (not the hour: loadWithin fails the test after testWait).
	res = loadWithin(t, ms, ldr, LoadSpec{Window: 4, Size: 1 << 20, Duration: time.Hour}, testWait)
	if !strings.Contains(res.FirstErr, "larger than the record limit") || res.N != 0 {
		t.Fatalf("oversized load: %+v, want it refused as too large", res)
	}
}

// TestStateCatchupSegments: a mem group whose FSMs carry a 4 MiB ballast;
// a follower crashes while the leader's client runs, the leader's Log is
// pruned past it, and the follower restarts with empty memory and its
// stable file: it catches up by snapshot, and every member ends with the
// same digest, ballast hash included. The client's load is cut into
// segments by Mark at the crash and the restart.
func TestStateCatchupSegments(t *testing.T) {
	const state = 4<<20 + 3
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	dir := t.TempDir()
	cfgs := make([]Config, len(ids))
	ms := make([]*Member, len(ids))
	start := func(i int) {
		t.Helper()
		n, err := f.NewNode(cfgs[i].Self)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Start(cfgs[i], n)
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = m
	}
	for i, id := range ids {
		cfgs[i] = Config{Self: id, Members: ids, StateBytes: state, StablePath: fmt.Sprintf("%s/stable.%d", dir, id), Start: broadcast.StartNew,
			Tuning: Tuning{ElectionTimeout: 500 * time.Millisecond, MaxLogEntries: 64}}
		start(i)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
	})
	statuses := func() string {
		var b strings.Builder
		for i, m := range ms {
			if m != nil {
				fmt.Fprintf(&b, "\n\tmember %d: %+v", i+1, m.Replica().Status())
			}
		}
		return b.String()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(testWait)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v%s", what, testWait, statuses())
			}
			time.Sleep(time.Millisecond)
		}
	}
	ldr := -1
	waitFor("a leader", func() bool {
		for i, m := range ms {
			if s := m.Replica().Status(); s.Role == broadcast.Leader && s.Committed.E == s.ECur {
				ldr = i
				return true
			}
		}
		return false
	})
	fol := (ldr + 1) % len(ids)
	lm := ms[ldr]

	ctx, cancel := context.WithTimeout(context.Background(), 2*testWait)
	defer cancel()
	type out struct {
		r   LoadResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := lm.Load(ctx, LoadSpec{Window: 2, Size: 16, Segments: true})
		done <- out{r, err}
	}()
	index := func(i int) uint64 { return ms[i].Replica().Status().Index }
	waitFor("200 commits", func() bool { return index(ldr) >= 200 })
	if n := lm.Mark("down"); n != 1 {
		t.Fatalf("Mark marked %d loads, want 1", n)
	}
	at := ms[fol].Replica().Status().Committed
	if err := ms[fol].Crash(); err != nil {
		t.Fatal(err)
	}
	ms[fol] = nil
	waitFor("the Log pruned past the crashed follower", func() bool { return at.Less(lm.Replica().Status().Pruned) })
	lm.Mark("catch-up")
	target := index(ldr)
	cfgs[fol].Start = broadcast.StartExisting
	start(fol)
	waitFor("the restarted follower's catch-up", func() bool { return index(fol) >= target })
	lm.Mark("after")
	after := index(ldr)
	waitFor("commits after the catch-up", func() bool { return index(ldr) >= after+100 })
	cancel()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if fs := ms[fol].Replica().Status(); fs.Counters.SnapshotsRestored == 0 {
		t.Errorf("follower caught up without a snapshot: %+v", fs.Counters)
	}
	if st := ms[fol].FSM().Stats(); st.Restores == 0 || st.StateBytes != state {
		t.Errorf("follower FSM stats %+v: want a restore of the %d-byte state", st, state)
	}
	if st := lm.FSM().Stats(); st.Captures == 0 || st.Persists == 0 {
		t.Errorf("leader FSM stats %+v: want a capture persisted", st)
	}
	// Quiesced: the same digest, ballast included, everywhere.
	var ds []Digest
	waitFor("equal digests", func() bool {
		ds = ds[:0]
		for _, m := range ms {
			ds = append(ds, m.FSM().Digest())
		}
		return ds[0] == ds[1] && ds[1] == ds[2] && ds[0].Index == index(ldr)
	})
	if ds[0].State == 0 || ds[0].StateBytes != state {
		t.Errorf("digest %+v lacks the ballast", ds[0])
	}

	segs := o.r.Segments
	var labels []string
	for _, s := range segs {
		labels = append(labels, s.Label)
	}
	if strings.Join(labels, ",") != "start,down,catch-up,after" {
		t.Fatalf("segments %v, want start, down, catch-up, after", labels)
	}
	for i, s := range segs {
		if s.N == 0 || s.P50 <= 0 || s.P99 < s.P50 || s.Max < s.P99 || s.MaxGap <= 0 || s.MaxAtNS < s.StartNS || s.EndNS < s.StartNS || s.OpsPerS <= 0 {
			t.Errorf("segment %+v", s)
		}
		if i > 0 && s.StartNS != segs[i-1].EndNS {
			t.Errorf("segment %s starts at %d, the previous one ended at %d", s.Label, s.StartNS, segs[i-1].EndNS)
		}
	}
}
