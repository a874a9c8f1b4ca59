package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// TestCaptureIsStateAtCapture: a capture (Snapshot) taken while the index
// migrates, then followed by applies that overwrite records (small with
// large, large with small), delete, add keys and grow the index twice,
// persists exactly the bytes of a snapshot persisted at the capture, and
// its Size is that length. Records of a MiB, whose slots cannot say their
// size (unitsLarge), are among them. The capture walks no index on the
// polling goroutine (issue 19: the walk stalled the poller): it copies
// the index, which Persist walks. Planted bugs: persistLive (Persist walks
// the live index) is caught by Persist's own check of the records it
// walked against the count at capture; staleLiveBytes (an
// overwrite leaves the old record's size in liveBytes) by the size check.
func TestCaptureIsStateAtCapture(t *testing.T) {
	for _, tc := range []struct {
		knob string
		want string // the check that must fail
	}{
		{"", ""},
		{"persistLive", "captured index holds"},
		{"staleLiveBytes", "capture size"},
	} {
		t.Run("planted="+tc.knob, func(t *testing.T) {
			err := captureAtCapture(t, tc.knob)
			if tc.knob == "" {
				if err != "" {
					t.Fatal(err)
				}
				return
			}
			t.Logf("planted %s: %s", tc.knob, err)
			if !strings.Contains(err, tc.want) {
				t.Fatalf("planted %s: got %q, want the %q check to fail", tc.knob, err, tc.want)
			}
		})
	}
}

func captureAtCapture(t *testing.T, knob string) string {
	cfg := TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 8 << 20, MaxValue: 1 << 20}
	tb, _ := soloTable(t, cfg)
	tb.knobs.persistLive = knob == "persistLive"
	tb.knobs.staleLiveBytes = knob == "staleLiveBytes"
	idx := uint64(0)
	apply := func(ops ...Op) {
		idx++
		if res := put(tb, idx, ops...); res.Status != StatusOK {
			t.Fatalf("entry %d: %+v", idx, res)
		}
	}
	large := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	for i := range 30 {
		apply(Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d-%s", i, make([]byte, i*5))})
	}
	apply(Op{Kind: OpPut, Key: []byte("big1"), Value: large(1<<20, 'a')})
	apply(Op{Kind: OpPut, Key: []byte("big2"), Value: large(1<<20-40, 'b')})
	apply(Op{Kind: OpDelete, Key: []byte("k3")})
	apply(Op{Kind: OpPut, Key: []byte("k4"), Value: large(300, 'o')}) // an overwrite, larger
	apply(Op{Kind: OpPut, Key: []byte("k29"), Value: []byte("o")})    // and smaller
	// Grow until a capture sees both generations.
	for i := 100; !tb.Stats().Migrating; i++ {
		apply(Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("g")})
	}
	walks := tb.slotWalks
	c, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if n := tb.slotWalks - walks; n != 0 {
		t.Fatalf("the capture walked the index %d times on the polling goroutine, want 0", n)
	}
	tb.knobs.persistLive, tb.knobs.staleLiveBytes = false, false
	want := snapshotOfIndex(t, tb) // a walk of the index at capture, as designed
	tb.knobs.persistLive = knob == "persistLive"
	if c.Size() != len(want) {
		return fmt.Sprintf("capture size %d, the snapshot at capture holds %d bytes", c.Size(), len(want))
	}
	// After the capture: overwrite both ways, delete, add, grow.
	apply(Op{Kind: OpPut, Key: []byte("big1"), Value: []byte("small now")})
	apply(Op{Kind: OpPut, Key: []byte("k1"), Value: large(1<<20, 'c')})
	apply(Op{Kind: OpDelete, Key: []byte("big2")})
	apply(Op{Kind: OpDelete, Key: []byte("k2")})
	gen := tb.Stats().Gen
	for i := 0; tb.Stats().Gen < gen+2; i++ {
		apply(Op{Kind: OpPut, Key: fmt.Appendf(nil, "n%d", i), Value: fmt.Appendf(nil, "after%d", i)})
	}
	for i := range 30 {
		apply(Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "over%d", i)})
	}
	got := make([]byte, c.Size())
	if err := c.Persist(got); err != nil {
		return fmt.Sprintf("persist: %v", err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Sprintf("the capture persisted %d bytes unlike the %d of the snapshot at capture", len(got), len(want))
	}
	restored, _ := soloTable(t, cfg)
	if err := restored.Restore(got); err != nil {
		return fmt.Sprintf("restore: %v", err)
	}
	if a, b := stateOf(t, restored), mustParse(t, want, tb.cfg.MaxRequest); !a.equal(b) {
		return fmt.Sprintf("restored %d records, the snapshot at capture %d", len(a.recs), len(b.recs))
	}
	return ""
}

// snapshotOfIndex is the table's snapshot as a walk of its live index
// (eachSlot) writes it, independent of Snapshot's copy and liveBytes:
// the records in index order, no staged requests, no ordered section.
func snapshotOfIndex(t *testing.T, tb *Table) []byte {
	t.Helper()
	if len(tb.stages) != 0 || tb.cfg.Ordered != nil {
		t.Fatal("snapshotOfIndex: staged requests or an ordered part")
	}
	b := make([]byte, 32)
	n := 0
	tb.eachSlot(func(s Slot) {
		b = append(b, tb.record(s)...)
		n++
	})
	binary.LittleEndian.PutUint64(b, snapMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	binary.LittleEndian.PutUint64(b[16:], uint64(tb.cur.log))
	binary.LittleEndian.PutUint64(b[24:], tb.applied)
	return append(b, make([]byte, 16)...) // no staged requests, no ordered section
}

// mustParse is the state a snapshot holds (as stateOf reads a table's).
func mustParse(t *testing.T, b []byte, maxRequest int) tableState {
	t.Helper()
	c, err := parseSnapshot(b, maxRequest)
	if err != nil {
		t.Fatal(err)
	}
	s := tableState{recs: map[string]snapRec{}, stages: c.stages}
	for i, k := range c.keys {
		s.recs[k] = c.recs[i]
	}
	return s
}

// TestCaptureReusesIndexCopy: a capture after a released one copies the
// index into the released one's buffer (no fresh pages to fault in: issue
// 19), and two captures alive at once (a network and a disk snapshot)
// never share one: the first, persisted after the second was taken and
// the table changed, still writes the snapshot at its own capture.
// Planted shareSpare (a reused buffer is left for the next capture too)
// makes the second capture overwrite the first's index copy, caught by
// the comparison with the snapshot at the first capture (or by Persist's
// count check).
func TestCaptureReusesIndexCopy(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			tb, _ := soloTable(t, TableConfig{LogBuckets: 4, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
			tb.knobs.shareSpare = planted
			idx := uint64(0)
			apply := func(ops ...Op) {
				idx++
				if res := put(tb, idx, ops...); res.Status != StatusOK {
					t.Fatalf("entry %d: %+v", idx, res)
				}
			}
			for i := range 200 {
				apply(Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
			}
			c0, err := tb.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			buf0 := &c0.(*capture).buf[0]
			c0.Release()
			want := snapshotOfIndex(t, tb)
			a, _ := tb.Snapshot()
			defer a.Release()
			if &a.(*capture).buf[0] != buf0 {
				t.Fatal("the capture after a released one did not reuse its index copy")
			}
			for i := range 200 {
				if i%2 == 0 {
					apply(Op{Kind: OpDelete, Key: fmt.Appendf(nil, "k%d", i)})
				}
			}
			b, _ := tb.Snapshot()
			defer b.Release()
			got := make([]byte, a.Size())
			err = a.Persist(got)
			same := err == nil && bytes.Equal(got, want)
			if planted {
				if same {
					t.Fatal("planted shareSpare: the first capture still persisted the snapshot at its capture")
				}
				t.Logf("planted shareSpare caught: the first capture's snapshot differs from the one at its capture (err %v)", err)
				return
			}
			if !same {
				t.Fatalf("the first capture's snapshot differs from the one at its capture (err %v)", err)
			}
		})
	}
}
