package kv

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
)

// TestReplayGrowthKeepsRecords: while the log is replayed (Table.replaying,
// NewReplica), a growth migrates the whole old generation at once and asks
// for no pre-faulted spare; the table must end holding what the same
// requests applied outside a replay leave, record for record (issue 19:
// the incremental migration was half a 1 M-record replay's CPU). The
// planted replayDropsOld (the old generation dropped unmigrated) must fail
// the check with "lost:".
func TestReplayGrowthKeepsRecords(t *testing.T) {
	if err := replayGrowth(t, testingKnobs{}); err != nil {
		t.Fatal(err)
	}
	err := replayGrowth(t, testingKnobs{replayDropsOld: true})
	if err == nil || !strings.HasPrefix(err.Error(), "lost:") {
		t.Fatalf("planted replayDropsOld: got %v, want the lost: check to fail", err)
	}
}

// replayGrowth applies one sequence of puts, deletes and multi requests to
// a table in replay mode (with knobs) and to one outside it, and returns
// the first property that failed: "migrating:" (the replaying table kept
// an old generation after an apply), "spare:" (it asked for a spare while
// replaying, or none after), "lost:" (a key of the map missing or wrong in
// it), "differ:" (its records are not the other table's).
func replayGrowth(t *testing.T, knobs testingKnobs) error {
	cfg := TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 1 << 10, PrefaultSpare: true}
	rep, _ := soloTable(t, cfg)
	ref, _ := soloTable(t, cfg)
	rep.knobs = knobs
	rep.replaying = true
	rep.spareWant.Store(0) // NewTable's own ask, before the replay began
	model := map[string]string{}
	idx := uint64(0)
	const keys = 400
	for round := range 5 {
		for k := range keys {
			key := fmt.Sprintf("key-%d", k)
			val := fmt.Sprintf("v%d-%d", round, k)
			idx++
			var data []byte
			switch {
			case round%3 == 2 && k%5 == 0:
				data = AppendRequest(nil, []Op{{Kind: OpDelete, Key: []byte(key)}})
				delete(model, key)
			case round%2 == 1 && k%3 == 0 && k+1 < keys:
				// a request of two ops: a growth may come between them
				key2 := fmt.Sprintf("key-%d", k+1)
				data = AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte(key), Value: []byte(val)}, {Kind: OpPut, Key: []byte(key2), Value: []byte(val + "b")}})
				model[key], model[key2] = val, val+"b"
			default:
				data = AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte(key), Value: []byte(val)}})
				model[key] = val
			}
			for _, tb := range []*Table{rep, ref} {
				if res, err := DecodeResult(tb.Apply(broadcast.Entry{Index: idx, Data: data})); err != nil || res.Status != StatusOK {
					return fmt.Errorf("request %d: %+v %v", idx, res, err)
				}
			}
			if rep.old != nil {
				return fmt.Errorf("migrating: after request %d the replaying table still migrates (%d of %d old buckets moved)", idx, rep.cursor, rep.old.buckets())
			}
		}
	}
	if rep.geometry().LogBuckets <= cfg.LogBuckets {
		return errors.New("the index never grew: the test did not cover a growth in replay")
	}
	if n := rep.spareWant.Load(); n != 0 {
		return fmt.Errorf("spare: a spare of %d bytes asked for during the replay", n)
	}
	rep.endReplay()
	if n := rep.spareWant.Load(); n != int64(rep.indexCopySize()) {
		return fmt.Errorf("spare: after the replay a spare of %d bytes asked for, want the index's %d", n, rep.indexCopySize())
	}
	records := func(tb *Table) map[string][]byte {
		m := map[string][]byte{}
		tb.eachSlot(func(s Slot) { m[string(tb.recordKey(s))] = bytes.Clone(tb.record(s)) })
		return m
	}
	got, want := records(rep), records(ref)
	for k, v := range model {
		r, ok := got[k]
		if !ok {
			return fmt.Errorf("lost: key %s (of %d) missing after the replay's growths (table holds %d records)", k, len(model), len(got))
		}
		if _, _, val, err := DecodeRecord(r); err != nil || string(val) != v {
			return fmt.Errorf("lost: key %s holds %q (%v), want %q", k, val, err, v)
		}
	}
	if len(got) != len(model) || rep.Len() != len(model) {
		return fmt.Errorf("lost: %d records (count %d), the map has %d", len(got), rep.Len(), len(model))
	}
	for k, v := range want {
		if !bytes.Equal(got[k], v) {
			return fmt.Errorf("differ: key %s: %x replayed, %x applied", k, got[k], v)
		}
	}
	return nil
}

// BenchmarkReplayGrowth applies 200 k puts of 16+100-byte records, in
// requests of 25, to an empty table as a log's replay does (Table.replaying:
// each growth migrates at once) or as the live path does (incremental
// migration): the index's growths are the replay's largest cost after the
// puts themselves (issue 19).
func BenchmarkReplayGrowth(b *testing.B) {
	for _, mode := range []string{"replay", "live"} {
		b.Run(mode, func(b *testing.B) {
			const n, per = 200000, 25
			reqs := make([][]byte, 0, n/per)
			val := bytes.Repeat([]byte{'v'}, 100)
			for i := 0; i < n; i += per {
				ops := make([]Op, per)
				for k := range ops {
					ops[k] = Op{Kind: OpPut, Key: fmt.Appendf(nil, "key-%012d", i+k), Value: val}
				}
				reqs = append(reqs, AppendRequest(nil, ops))
			}
			var cpu time.Duration // the process's CPU time in the applies
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				tb, _ := soloTable(b, TableConfig{})
				tb.replaying = mode != "live"
				c0 := cpuTime()
				b.StartTimer()
				for i, r := range reqs {
					tb.Apply(broadcast.Entry{Index: uint64(i + 1), Data: r})
				}
				b.StopTimer()
				cpu += cpuTime() - c0
				if tb.Len() != n {
					b.Fatalf("%d records, want %d", tb.Len(), n)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/put")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/put")
		})
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
