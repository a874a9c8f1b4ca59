package backupcheck

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// TestCheckCut: a cut that puts a batch spanning two groups on both
// sides (one group's index moved past it) is ErrCut; the right cut
// passes; Expected takes the last write at or below each group's index.
func TestCheckCut(t *testing.T) {
	r := NewRecorder()
	r.batches = [][]Write{
		{{Key: "a", Value: "1", Group: 0, Index: 1}, {Key: "b", Value: "1", Group: 1, Index: 1}},
		{{Key: "b", Value: "2", Group: 1, Index: 2}},
		{{Key: "a", Value: "3", Group: 0, Index: 2}, {Key: "b", Value: "3", Group: 1, Index: 3}},
	}
	if err := r.CheckCut(map[int]uint64{0: 1, 1: 2}); err != nil {
		t.Fatal(err)
	}
	if err := r.CheckCut(map[int]uint64{0: 1, 1: 3}); !errors.Is(err, ErrCut) {
		t.Fatalf("a cut through the third batch: %v, want ErrCut", err)
	}
	exp := r.Expected(map[int]uint64{0: 1, 1: 2})
	if exp["a"].Value != "1" || exp["b"].Value != "2" {
		t.Fatalf("expected %+v %+v", exp["a"], exp["b"])
	}
}

// FuzzTableRecords: tableRecords never panics on any bytes, and the
// records it returns are decodable from where it found them: a key it
// returns has the value and version of a record in b.
func FuzzTableRecords(f *testing.F) {
	snap := make([]byte, 32)
	binary.LittleEndian.PutUint64(snap[8:], 1)
	rec := make([]byte, 64)
	binary.LittleEndian.PutUint64(rec, 7)
	binary.LittleEndian.PutUint64(rec[8:], 1|1<<32)
	rec[16], rec[17] = 'k', 'v'
	f.Add(append(snap, rec...))
	f.Add(snap)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs := map[string]record{}
		if err := tableRecords(b, recs); err != nil {
			return
		}
		for k, r := range recs {
			if !bytes.Contains(b, []byte(k+r.value)) {
				t.Fatalf("key %q value %q: not in the bytes", k, r.value)
			}
		}
	})
}
