package kv

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// errAbandoned is what a held walk panics with when the test lets it go
// after its table was unmapped: walking on would fault (SIGSEGV), which
// would end the test binary instead of failing one check.
var errAbandoned = errors.New("walk abandoned: the table's memory is unmapped")

// TestCloseWaitsForWalks: Table.Close waits for the captures' Persist
// walks under way (they read the heap regions it unmaps) and a Persist
// that starts after Close refuses with ErrTableClosed. The walk is held
// at its start (knobs.onPersistWalk) until Close says it waits for one
// walk (knobs.onCloseWait): the order is fixed, no timing. Planted
// closeNoWait (Close unmaps at once) is caught by "close:"; planted
// walkAfterClose (a late Persist walks the unmapped table) by "refuse:".
func TestCloseWaitsForWalks(t *testing.T) {
	heldWalkRuns(t, closeDuringWalk, "closeNoWait", "close:")
	heldWalkRuns(t, walkAfterClose, "walkAfterClose", "refuse:")
}

// heldWalkRuns runs check without its planted bug (it must pass), then
// with it (it must fail with the check's prefix, want).
func heldWalkRuns(t *testing.T, check func(t *testing.T, planted bool) error, bug, want string) {
	t.Helper()
	if err := check(t, false); err != nil {
		t.Fatal(err)
	}
	err := check(t, true)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("planted %s: %v, want %s", bug, err, want)
	}
	t.Logf("planted %s caught: %v", bug, err)
}

// closedTestTable is a table of 300 records and its snapshot now.
func closedTestTable(t *testing.T) (*Table, []byte) {
	tb, _ := soloTable(t, TableConfig{LogBuckets: 4})
	for k := range 300 {
		if res := put(tb, uint64(k+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", k), Value: fmt.Appendf(nil, "v%d", k)}); res.Status != StatusOK {
			t.Fatalf("put %d: %+v", k, res)
		}
	}
	c, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	want := make([]byte, c.Size())
	if err := c.Persist(want); err != nil {
		t.Fatal(err)
	}
	return tb, want
}

// persistHeld runs c.Persist on a goroutine of its own and returns its
// outcome on a channel; a panic of errAbandoned (the test's hook) comes
// back as that error.
func persistHeld(c *capture, dst []byte) <-chan error {
	out := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				if p != errAbandoned {
					panic(p)
				}
				out <- errAbandoned
			}
		}()
		out <- c.Persist(dst)
	}()
	return out
}

// closeDuringWalk closes a table while a capture's Persist is held at
// the start of its walk and reports "close:" if Close returned under it.
func closeDuringWalk(t *testing.T, planted bool) error {
	tb, want := closedTestTable(t)
	tb.knobs.closeNoWait = planted
	c, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	entered, release := make(chan struct{}), make(chan struct{})
	closed := make(chan struct{})
	tb.knobs.onPersistWalk = func() func() {
		close(entered)
		<-release
		select {
		case <-closed:
			panic(errAbandoned)
		default:
		}
		return func() {}
	}
	waits := make(chan int, 1)
	tb.knobs.onCloseWait = func(n int) { waits <- n }
	got := make([]byte, c.Size())
	res := persistHeld(c.(*capture), got)
	<-entered
	go func() {
		tb.Close()
		close(closed)
	}()
	var errs []string
	select {
	case <-closed:
		errs = append(errs, "close: Table.Close returned (its memory unmapped) while a capture's Persist walk was under way")
	case n := <-waits:
		if n != 1 {
			errs = append(errs, fmt.Sprintf("count: Close waits for %d walks, one is under way", n))
		}
	}
	close(release)
	perr := <-res
	<-closed
	switch {
	case errors.Is(perr, errAbandoned):
		errs = append(errs, "memory: the walk would have read the unmapped table")
	case perr != nil:
		errs = append(errs, fmt.Sprintf("persist: %v", perr))
	case !bytes.Equal(got, want):
		errs = append(errs, "persist: the snapshot written beside Close is not the table's")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// walkAfterClose persists a capture after its table's Close and reports
// "refuse:" if the Persist started its walk.
func walkAfterClose(t *testing.T, planted bool) error {
	tb, _ := closedTestTable(t)
	tb.knobs.walkAfterClose = planted
	c, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	tb.knobs.onPersistWalk = func() func() { panic(errAbandoned) }
	tb.Close()
	perr := <-persistHeld(c.(*capture), make([]byte, c.Size()))
	switch {
	case errors.Is(perr, errAbandoned):
		return errors.New("refuse: a Persist after Close started walking the unmapped table")
	case !errors.Is(perr, ErrTableClosed):
		return fmt.Errorf("refuse: a Persist after Close returned %v, want ErrTableClosed", perr)
	}
	return nil
}
