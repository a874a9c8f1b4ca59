package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"testing"

	"github.com/rdmakv/rdmakv/internal/planted"
	"github.com/rdmakv/rdmakv/internal/prefault"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// TestPrefaultHeap: with PrefaultHeap, the pages from the heap's bump
// pointer to PrefaultHeap bytes past it are mapped by the table's goroutine
// before the poller stores records there, as the bump pointer moves across
// a region and into the next; and the goroutine's touches never change a
// record the poller wrote (they run while it writes). The table is on shm
// (regions are files mapped shared, as in kvserver); mappedness is read
// from /proc/self/pagemap (a page's present bit). A grown index generation,
// whose buckets the migration and inserts store into all over at once, is
// mapped in full. Planted prefaultOnce (only the first PrefaultHeap bytes
// are asked for) is caught by "not mapped"; genNotPrefaulted (a new
// generation left to fault on the poller) by "of index generation";
// touchChanges (a plain store of zero as the touch) by "changed". Without
// PrefaultHeap no page past the bump is mapped (the check can fail).
func TestPrefaultHeap(t *testing.T) {
	planted.Run(t, prefaultHeap, []planted.Case{
		{Name: "none", Want: ""},
		{Name: "off", Want: "not mapped"},
		{Name: "prefaultOnce", Want: "not mapped"},
		{Name: "genNotPrefaulted", Want: "of index generation"},
		{Name: "touchChanges", Want: "changed"},
	})
}

func prefaultHeap(t *testing.T, knob string) string {
	const (
		region    = 2 << 20
		lookahead = 256 << 10
		valueLen  = 1000
	)
	n1, err := shm.Open(1, shm.Options{Dir: t.TempDir(), Cluster: fmt.Sprintf("kvpf%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	// LogBuckets 6: the index grows 4 times over the records; with
	// MigrateStep 1 the put that starts a growth stores into a few of
	// the new generation's pages only.
	cfg := TableConfig{HeapRegionSize: region, MaxValue: 1 << 12, LogBuckets: 6, MigrateStep: 1}
	if knob != "off" {
		cfg.PrefaultHeap = lookahead
	}
	tb, err := NewTable(cfg, n1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close(); n1.Close() })
	tb.knobs.prefaultOnce = knob == "prefaultOnce"
	tb.knobs.touchChanges = knob == "touchChanges"
	tb.knobs.genNotPrefaulted = knob == "genNotPrefaulted"
	tb.Promise(5)
	tb.SetServing(5)

	value := func(k int) []byte {
		v := bytes.Repeat([]byte{byte(k) | 1}, valueLen) // no zero byte
		binary.LittleEndian.PutUint64(v, uint64(k)|1<<63)
		return v
	}
	// Each check runs once the chunks asked for so far are faulted in:
	// the property is what the goroutine was asked to do, not how fast.
	checkAhead := func(after int) string {
		if tb.heap.faulter != nil {
			tb.heap.faulter.Wait()
		}
		hp := &tb.heap
		mem := hp.mems[hp.cur]
		page := os.Getpagesize()
		// The pages wholly past the bump, up to the lookahead's last
		// full page (the poller's own stores mapped the bump's page).
		from := (hp.bump + page - 1) &^ (page - 1)
		to := min(hp.bump+lookahead, len(mem)) &^ (page - 1)
		for p := from; p < to; p += page {
			ok, err := pageMapped(mem[p:])
			if err != nil {
				t.Skipf("pagemap: %v", err)
			}
			if !ok {
				return fmt.Sprintf("after %d records: the page at offset %d of heap region %d (bump %d, lookahead %d) is not mapped",
					after, p, hp.cur, hp.bump, lookahead)
			}
		}
		// A generation the index just grew into: all of it.
		if tb.old != nil {
			for p := 0; p < len(tb.cur.mem); p += page {
				if ok, _ := pageMapped(tb.cur.mem[p:]); !ok {
					return fmt.Sprintf("after %d records: the page at offset %d of index generation %d (%d bytes) is not mapped",
						after, p, tb.cur.n, len(tb.cur.mem))
				}
			}
		}
		return ""
	}
	const records = 5000 // ~5.5 MiB: three regions
	migrating := false
	for k := 1; k <= records; k++ {
		if res := put(tb, uint64(k), Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", k), Value: value(k)}); res.Status != StatusOK {
			t.Fatalf("put %d: %+v", k, res)
		}
		growing := tb.old != nil && !migrating
		migrating = tb.old != nil
		if k%250 == 0 || growing {
			if err := checkAhead(k); err != "" {
				return err
			}
		}
	}
	if f := tb.heap.faulter; f != nil {
		// The goroutine may touch pages the poller writes at the same
		// time (it fell behind, or a Restore reuses regions): have it
		// touch the first region, all records, to see that a touch
		// changes nothing whenever it lands.
		f.Ask(tb.heap.mems[0])
		f.Wait()
	}
	if st := tb.Stats(); st.HeapRegions < 3 {
		t.Fatalf("%d heap regions, want the records to span 3", st.HeapRegions)
	}
	// Every record as the poller wrote it.
	tb.finishMigration()
	for k := 1; k <= records; k++ {
		key := fmt.Appendf(nil, "k%d", k)
		w, ok := tb.find(key, hashKey(key))
		if !ok {
			return fmt.Sprintf("record %d not found", k)
		}
		if got, want := tb.recordValue(w.s), value(k); !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			return fmt.Sprintf("record %d changed: its value differs from byte %d on (%d values of %d bytes)", k, i, len(got), len(want))
		}
	}
	if knob != "off" {
		if pf := tb.Stats().HeapPrefaults; pf.Pages == 0 {
			return "no page pre-faulted"
		}
	}
	return ""
}

// pageMapped reports whether the page holding b[0] is mapped in this
// process (prefault.Mapped).
func pageMapped(b []byte) (bool, error) { return prefault.Mapped(b) }
