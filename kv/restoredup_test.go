package kv

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// TestRestoreRefusesKeyTwice: a snapshot holding one key in two records
// (never from a correct table) is refused with the key named, and the
// table is left as it was. Restore finds the earlier record among the
// run of records of its first bucket (placeRecords) instead of in a map of every
// record's hash; the cases put the two copies next to each other, far
// apart, with other versions and values, and among many keys so that
// they share buckets with others. Planted restoreDupUnchecked (the
// search skipped) must let such a snapshot in ("accepted:").
func TestRestoreRefusesKeyTwice(t *testing.T) {
	for _, c := range []struct{ n, first, second int }{{2, 0, 1}, {300, 0, 299}, {300, 150, 151}, {5000, 17, 4321}} {
		name := fmt.Sprintf("%d-records-%d-and-%d", c.n, c.first, c.second)
		t.Run(name, func(t *testing.T) {
			if err := restoreKeyTwice(t, c.n, c.first, c.second, testingKnobs{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	err := restoreKeyTwice(t, 300, 0, 299, testingKnobs{restoreDupUnchecked: true})
	if err == nil || !strings.HasPrefix(err.Error(), "accepted:") {
		t.Fatalf("planted restoreDupUnchecked: got %v, want the accepted: check to fail", err)
	}
}

// restoreKeyTwice restores a snapshot of n records whose record second
// holds record first's key, into a table of a few records, and returns the
// first property that failed: "accepted:" (Restore took it), "message:"
// (its error does not name the key), "changed:" (the failed Restore
// changed the table), or a distinct-keys snapshot refused ("distinct:").
func restoreKeyTwice(t *testing.T, n, first, second int, knobs testingKnobs) error {
	build := func(dup bool) []byte {
		snap := make([]byte, 32)
		binary.LittleEndian.PutUint64(snap, snapMagic)
		binary.LittleEndian.PutUint64(snap[8:], uint64(n))
		binary.LittleEndian.PutUint64(snap[16:], 10)
		binary.LittleEndian.PutUint64(snap[24:], 7)
		for i := range n {
			key := fmt.Appendf(nil, "key-%06d", i)
			if dup && i == second {
				key = fmt.Appendf(nil, "key-%06d", first)
			}
			value := fmt.Appendf(nil, "value-%d", i)
			rec := make([]byte, recordSize(len(key), len(value)))
			encodeRecord(rec, uint64(i+1)<<16, key, value)
			snap = append(snap, rec...)
		}
		return append(snap, make([]byte, 16)...) // no staged requests, no ordered section
	}
	tb, _ := soloTable(t, TableConfig{})
	tb.knobs = knobs
	for i := range 3 {
		put(tb, uint64(i+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "before-%d", i), Value: []byte("v")})
	}
	before := stateOf(t, tb)
	err := tb.Restore(build(true))
	switch {
	case err == nil:
		return fmt.Errorf("accepted: a snapshot holding key-%06d in records %d and %d (Len now %d)", first, first, second, tb.Len())
	case !strings.Contains(err.Error(), fmt.Sprintf("key-%06d", first)) || !strings.Contains(err.Error(), "twice"):
		return fmt.Errorf("message: %v does not name key-%06d twice", err, first)
	}
	if got := stateOf(t, tb); !got.equal(before) {
		return fmt.Errorf("changed: the failed Restore (%v) left %d records, want %d", err, len(got.recs), len(before.recs))
	}
	if err := tb.Restore(build(false)); err != nil || tb.Len() != n {
		return fmt.Errorf("distinct: the snapshot without the copy: %v, Len %d, want %d", err, tb.Len(), n)
	}
	return nil
}

// TestRestoreCrowdedBuckets: Restore places a record in its first pair
// while that pair has room (restoreSlot), else where a put would
// (freeSlot), and starts over with twice the buckets when a key finds all
// four places full. Snapshots of 40 keys of one first bucket at the index
// size Restore picks (the first pair holds 14) force the overflow into
// the second pairs; 40 keys of one first and one second bucket (the four
// places hold 28) force the retry. Every key must then be found, with its
// value, by the one-sided reader (which reads both of a key's pairs), by a
// stale-ok and a linearizable get alike.
func TestRestoreCrowdedBuckets(t *testing.T) {
	const n = 40
	// Restore's index size for n records (its loop).
	log := 2
	for float64(n) > DefaultMaxLoad/2*float64(int(slotsPer)<<log) {
		log++
	}
	for _, c := range []struct {
		name    string
		sameB2  bool
		wantLog int
	}{{"first-pair-full", false, log}, {"four-places-full", true, log + 1}} {
		t.Run(c.name, func(t *testing.T) {
			var keys [][]byte
			b2 := -1
			for i := 0; len(keys) < n; i++ {
				k := fmt.Appendf(nil, "crowd-%d", i)
				x1, x2 := candidates(hashKey(k), log)
				if x1 != 0 {
					continue
				}
				if b2 < 0 {
					b2 = x2
				}
				if !c.sameB2 || x2 == b2 {
					keys = append(keys, k)
				}
			}
			snap := make([]byte, 32)
			binary.LittleEndian.PutUint64(snap, snapMagic)
			binary.LittleEndian.PutUint64(snap[8:], n)
			binary.LittleEndian.PutUint64(snap[16:], uint64(log))
			binary.LittleEndian.PutUint64(snap[24:], 7)
			for i, k := range keys {
				v := fmt.Appendf(nil, "value-%d", i)
				rec := make([]byte, recordSize(len(k), len(v)))
				encodeRecord(rec, uint64(i+1)<<16, k, v)
				snap = append(snap, rec...)
			}
			snap = append(snap, make([]byte, 16)...) // no staged requests, no ordered section
			tb, r := soloTable(t, TableConfig{})
			if err := tb.Restore(snap); err != nil {
				t.Fatal(err)
			}
			if got := tb.cur.log; got != c.wantLog {
				t.Fatalf("an index of 2^%d buckets after the restore, want 2^%d", got, c.wantLog)
			}
			for i, k := range keys {
				for _, mode := range []Consistency{StaleOK, Linearizable} {
					g, err := r.Get(k, mode)
					if err != nil || !g.Found || string(g.Value) != fmt.Sprintf("value-%d", i) {
						t.Fatalf("get %s (%v) after the restore: found %v %q, err %v; want value-%d", k, mode, g.Found, g.Value, err, i)
					}
				}
			}
		})
	}
}
