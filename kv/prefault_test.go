package kv

import (
	"bytes"
	"fmt"
	"github.com/rdmakv/rdmakv/internal/planted"
	"strings"
	"testing"
)

// TestPrefaultedSpare: with PrefaultSpare, every capture copies the index
// into a buffer pre-faulted off the polling goroutine (issue 19: a fresh
// buffer's page faults were most of a first capture's time on the poller),
// and captures still persist the snapshot at capture. The table is made,
// filled until its index grows (a capture while it migrates copies both
// generations), captured while a growth happens under a live capture, grown
// again and restored into a second table; after each pre-fault completes
// the capture counts no fresh index copy (Stats.FreshIndexCopies), and its
// bytes are the snapshot walked off the live index at capture. Without
// PrefaultSpare, the first capture is a fresh copy (the counter counts).
// Planted spareKeepsLast (a released capture's smaller buffer replaces the
// spare pre-faulted for the grown index) is caught by the fresh-copy count.
func TestPrefaultedSpare(t *testing.T) {
	planted.Run(t, prefaultedSpare, []planted.Case{
		{Name: "none", Want: ""},
		{Name: "off", Want: "fresh index copies"},
		{Name: "spareKeepsLast", Want: "fresh index copies"},
	})
}

func prefaultedSpare(t *testing.T, knob string) string {
	cfg := TableConfig{LogBuckets: 3, MigrateStep: 1, HeapRegionSize: 1 << 20, MaxValue: 1 << 10, PrefaultSpare: knob != "off"}
	tb, _ := soloTable(t, cfg)
	tb.prefaultWG.Wait() // the knob is read by the pre-fault goroutine
	tb.knobs.spareKeepsLast = knob == "spareKeepsLast"
	idx, key := uint64(0), 0
	apply := func() {
		idx++
		key++
		if res := put(tb, idx, Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", key), Value: fmt.Appendf(nil, "v%d", key)}); res.Status != StatusOK {
			t.Fatalf("entry %d: %+v", idx, res)
		}
	}
	growUntil := func(migrating bool) {
		for tb.Stats().Migrating != migrating {
			apply()
		}
	}
	// take takes a capture once the pre-faults asked so far are done,
	// checks that it copied the index into a spare, and returns it with
	// the snapshot at capture.
	take := func(tb *Table, what string) (*capture, []byte, string) {
		tb.prefaultWG.Wait()
		want := snapshotOfIndex(t, tb)
		fresh := tb.Stats().FreshIndexCopies
		c, err := tb.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if n := tb.Stats().FreshIndexCopies - fresh; n != 0 {
			c.Release()
			return nil, nil, fmt.Sprintf("%s: %d fresh index copies, want 0 (a spare of %d bytes, %d asked, %d pre-faulted; the copy is %d)",
				what, n, spareCap(tb), tb.spareWant.Load(), tb.Stats().SparePrefaults, tb.indexCopySize())
		}
		return c.(*capture), want, ""
	}
	check := func(c *capture, want []byte, what string) string {
		got := make([]byte, c.Size())
		if err := c.Persist(got); err != nil {
			return fmt.Sprintf("%s: persist: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Sprintf("%s: the capture persisted %d bytes unlike the %d of the snapshot at capture", what, len(got), len(want))
		}
		return ""
	}

	for range 20 {
		apply()
	}
	c, want, err := take(tb, "the first capture")
	if err != "" {
		return err
	}
	if err := check(c, want, "the first capture"); err != "" {
		return err
	}
	c.Release()

	// A capture alive while the index grows: the pre-fault for the
	// grown index runs meanwhile, and the capture's Persist, handing its
	// buffer on, must not put it, smaller, in place of that spare.
	c, want, err = take(tb, "the capture before the growth")
	if err != "" {
		return err
	}
	growUntil(true)
	for range 5 {
		apply() // changes after the capture (and a migration step each)
	}
	tb.prefaultWG.Wait() // the grown index's spare, then Persist's offer
	if err := check(c, want, "the capture before the growth"); err != "" {
		return err
	}
	c.Release()
	c, want, err = take(tb, "a capture while the index grows")
	if err != "" {
		return err
	}
	if c.old == nil {
		t.Fatal("the capture while the index grows copied one generation")
	}
	if err := check(c, want, "a capture while the index grows"); err != "" {
		return err
	}
	c.Release()

	// A second growth, finished.
	growUntil(false)
	growUntil(true)
	growUntil(false)
	c, want, err = take(tb, "the capture after two growths")
	if err != "" {
		return err
	}
	snap := make([]byte, c.Size())
	if err := c.Persist(snap); err != nil || !bytes.Equal(snap, want) {
		return fmt.Sprintf("the capture after two growths: persisted bytes unlike the snapshot at capture (err %v)", err)
	}
	c.Release()
	if s := tb.Stats(); s.SparePrefaults < 3 {
		t.Fatalf("%d spares pre-faulted: want one per table and growth", s.SparePrefaults)
	}

	// A table restored from that snapshot captures into a spare too.
	rt, _ := soloTable(t, cfg)
	if err := rt.Restore(snap); err != nil {
		t.Fatal(err)
	}
	c, want, err = take(rt, "the capture after a restore")
	if err != "" {
		return err
	}
	if a, b := mustParse(t, want, cfg.MaxRequest), mustParse(t, snap, cfg.MaxRequest); !a.equal(b) {
		t.Fatalf("the restored table holds %d records, its snapshot %d", len(a.recs), len(b.recs))
	}
	if err := check(c, want, "the capture after a restore"); err != "" {
		return err
	}
	c.Release()

	// Two captures alive at once: the second copies into a fresh buffer
	// (one spare per table), and of the two released the larger stays.
	a, _, err := take(tb, "the first of two captures")
	if err != "" {
		return err
	}
	b, _ := tb.Snapshot()
	if n := tb.Stats().FreshIndexCopies; n != 1 {
		t.Fatalf("two captures alive at once: %d fresh copies, want 1", n)
	}
	a.Release()
	b.Release()
	if got, want := spareCap(tb), tb.indexCopySize(); got < want {
		t.Fatalf("after two captures the spare holds %d bytes, want at least the index copy's %d", got, want)
	}
	return ""
}

// spareCap is the spare's capacity (0: none).
func spareCap(tb *Table) int {
	if p := tb.spare.Load(); p != nil {
		return cap(*p)
	}
	return 0
}

// TestPersistHandsOnIndexCopy: a capture's Persist hands its index copy on
// to the next capture once it has walked it, so a capture kept after its
// Persist (a network snapshot's, released only when a newer one replaces
// it) does not leave the disk captures meanwhile to copy into fresh
// buffers; a second Persist fails. Planted handOnTwice (the Release offers
// the buffer again) lets a third capture copy into the second's buffer
// while it is alive: caught by the second's snapshot, unlike the one at
// its capture.
func TestPersistHandsOnIndexCopy(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			tb, _ := soloTable(t, TableConfig{LogBuckets: 4, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
			tb.knobs.handOnTwice = planted
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
			c1, err := tb.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			buf1 := &c1.(*capture).buf[0]
			if err := c1.Persist(make([]byte, c1.Size())); err != nil {
				t.Fatal(err)
			}
			if err := c1.Persist(make([]byte, c1.Size())); err == nil || !strings.Contains(err.Error(), "persisted twice") {
				t.Fatalf("a second Persist: %v, want an error", err)
			}
			want := snapshotOfIndex(t, tb)
			c2, _ := tb.Snapshot()
			defer c2.Release()
			if &c2.(*capture).buf[0] != buf1 || tb.Stats().FreshIndexCopies != 1 {
				t.Fatalf("the capture after a persisted one (not released) did not copy into its buffer: %d fresh copies", tb.Stats().FreshIndexCopies)
			}
			c1.Release()
			for i := range 200 {
				if i%2 == 0 {
					apply(Op{Kind: OpDelete, Key: fmt.Appendf(nil, "k%d", i)})
				}
			}
			c3, _ := tb.Snapshot()
			defer c3.Release()
			got := make([]byte, c2.Size())
			err = c2.Persist(got)
			same := err == nil && bytes.Equal(got, want)
			if planted {
				if same {
					t.Fatal("planted handOnTwice: the second capture still persisted the snapshot at its capture")
				}
				t.Logf("planted handOnTwice caught: the second capture's snapshot differs from the one at its capture (err %v)", err)
				return
			}
			if !same {
				t.Fatalf("the second capture's snapshot differs from the one at its capture (err %v)", err)
			}
		})
	}
}

// TestSnapshotReady: while the pre-fault goroutine makes the spare a
// capture's index copy needs (after a growth), SnapshotReady is false,
// and a capture taken once it is true copies into no fresh buffer (the
// capture a broadcast replica holds back with Config.CaptureReady).
// The goroutine is held while it makes the spare (knobs.onSpareMaking).
// Planted readyIgnoresSpare
// (true while the spare is made) is caught by "fresh:".
func TestSnapshotReady(t *testing.T) {
	planted.Run(t, snapshotReady, []planted.Case{
		{Name: "none", Want: ""},
		{Name: "readyIgnoresSpare", Want: "fresh:"},
	})
}

func snapshotReady(t *testing.T, knob string) string {
	cfg := TableConfig{LogBuckets: 3, MigrateStep: 1, HeapRegionSize: 1 << 20, MaxValue: 1 << 10, PrefaultSpare: true}
	tb, _ := soloTable(t, cfg)
	tb.prefaultWG.Wait() // the first spare made: no pre-fault goroutine runs while the knobs are set
	tb.knobs.readyIgnoresSpare = knob == "readyIgnoresSpare"
	making, release := make(chan struct{}, 1), make(chan struct{})
	tb.knobs.onSpareMaking = func() {
		making <- struct{}{}
		<-release
	}
	if !tb.SnapshotReady() {
		return "ready: false with the spare made at the start"
	}
	idx := uint64(0)
	for !tb.Stats().Migrating { // a growth asks for a larger spare
		idx++
		if res := put(tb, idx, Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", idx), Value: []byte("v")}); res.Status != StatusOK {
			t.Fatalf("entry %d: %+v", idx, res)
		}
	}
	<-making // the goroutine makes the grown index's spare, held
	ready := tb.SnapshotReady()
	if ready && knob == "" {
		close(release)
		return fmt.Sprintf("ready: true while the spare is made (spare %d bytes, the copy %d)", spareCap(tb), tb.indexCopySize())
	}
	fresh := tb.Stats().FreshIndexCopies
	if ready {
		// What a replica would do: capture now.
		c, err := tb.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
	close(release)
	tb.prefaultWG.Wait()
	if !tb.SnapshotReady() {
		return "ready: false once the spare is made"
	}
	if !ready {
		c, err := tb.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
	if n := tb.Stats().FreshIndexCopies - fresh; n != 0 {
		return fmt.Sprintf("fresh: the capture SnapshotReady let go copied into %d fresh buffers", n)
	}
	return ""
}
