package client_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// TestKeyspaceMergeLinearizable: concurrent field merges (UpdateFields),
// puts of fielded and of plain values, deletes, gets and scans of a few
// ordered keys, checked by porcupine with kvcheck's ordered-map model,
// whose Merge is the hashed keyspace's (fields set, the others kept; an
// absent key takes the fields; a plain value refuses the merge).
func TestKeyspaceMergeLinearizable(t *testing.T) {
	lc := startLocal(t, orderedMap("ksmerge", 1))
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	h := runKsHistory(t, c.Keyspace("users"), 5, 17, []string{"a", "b", "c"}, func(rng *rand.Rand, op *kvcheck.Op, w, i int) {
		switch r := rng.IntN(10); {
		case r < 4:
			op.Kind = kvcheck.Merge
			op.Fields = map[string]string{fmt.Sprintf("f%d", rng.IntN(3)): fmt.Sprintf("w%d-%d", w, i)}
		case r < 6:
			op.Kind, op.Value = kvcheck.Put, kvcheck.EncodeFields(map[string]string{"f0": fmt.Sprintf("p%d-%d", w, i)})
			if rng.IntN(4) == 0 {
				op.Value = fmt.Sprintf("plain%d-%d", w, i) // not fielded: merges fail on it
			}
		case r < 7:
			op.Kind = kvcheck.Delete
		case r < 9:
			op.Kind = kvcheck.Get
		default:
			op.Kind, op.Key, op.End = kvcheck.Scan, "a", "d"
		}
	}, nil)
	merges, refused := 0, 0
	for _, op := range h.ops {
		if op.Kind == kvcheck.Merge {
			merges++
			if !op.Out.OK {
				refused++
			}
		}
	}
	if merges-refused == 0 {
		t.Fatalf("no merge applied (%d merges)", merges)
	}
	if err := h.check(t); err != nil {
		t.Fatalf("%d ops: %v", len(h.ops), err)
	}
	t.Logf("%d ops, %d merges (%d refused: a plain value)", len(h.ops), merges, refused)
}
