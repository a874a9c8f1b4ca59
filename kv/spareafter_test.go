package kv

import (
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/internal/planted"
)

// TestSpareAfter: with TableConfig.SpareAfter a table restored from a
// snapshot makes no spare while the gate is shut (a process's start keeps
// the spares' page faults off its replicas' builds: issue 19): closed with
// the gate still shut it made none, and once the gate opens it makes one,
// of the restored index's size (the size last asked, not the new table's
// first). Planted spareIgnoresAfter (the pre-fault goroutine does not wait)
// is caught as a spare made while the gate was shut.
func TestSpareAfter(t *testing.T) {
	planted.Run(t, spareAfter, []planted.Case{
		{Name: "none", Want: ""},
		{Name: "spareIgnoresAfter", Want: "made while the gate was shut"},
	})
}

func spareAfter(t *testing.T, knob string) string {
	src, _ := soloTable(t, TableConfig{})
	// 200 records: an index of 16 KiB, under prefaulted's first yield
	// (64 KiB), so the planted goroutine makes its spare whole even when
	// Close comes meanwhile (it gives up only at a yield).
	const n = 200
	for i := range n {
		put(src, uint64(i+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%06d", i), Value: fmt.Appendf(nil, "v%d", i)})
	}
	snap := snapshotOf(t, src)
	// restored is a table whose spare pre-fault waits for gate, with a
	// snapshot restored into it. The table is made without PrefaultSpare
	// and given it, the gate and the knob before Restore starts the
	// pre-fault goroutine (which reads them).
	restored := func(gate chan struct{}) *Table {
		tb, _ := soloTable(t, TableConfig{})
		tb.cfg.PrefaultSpare, tb.cfg.SpareAfter = true, gate
		tb.knobs.spareIgnoresAfter = knob == "spareIgnoresAfter"
		if err := tb.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if tb.Len() != n {
			t.Fatalf("restored %d records, want %d", tb.Len(), n)
		}
		if c := tb.indexCopySize(); c >= prefaultYield {
			t.Fatalf("an index copy of %d bytes: a planted spare could give up at a yield", c)
		}
		return tb
	}

	tb := restored(make(chan struct{}))
	tb.Close() // the gate still shut (Close waits for the goroutine)
	if k := tb.Stats().SparePrefaults; k != 0 {
		return fmt.Sprintf("%d spares made while the gate was shut (closed before it opened)", k)
	}

	gate := make(chan struct{})
	tb = restored(gate)
	close(gate)
	tb.prefaultWG.Wait()
	if k, c, want := tb.Stats().SparePrefaults, spareCap(tb), tb.indexCopySize(); k < 1 || c < want {
		return fmt.Sprintf("after the gate opened: %d spares made, the spare holds %d bytes, want one of the index copy's %d", k, c, want)
	}
	return ""
}
