package broadcast

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/wal"
)

// stepClock is a closeClock that moves on a millisecond at each read.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time {
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

// holdLimit is how many refused fsyncs of a held save a Close may drive
// before the hold gives way: under a stepClock a Close that gives a
// periodic save closeSaveBudget polls it at most once per clock read,
// a tenth of this; one that waits for the save to end reaches it.
var holdLimit = 10 * int(closeSaveBudget/time.Millisecond)

// holdDevice holds every disk snapshot save between its write and its
// fsync: it refuses the fsync of a tmp- file as a full queue does (the
// store submits it again at its next Poll) for as long as the test does
// not release it, which it never does. Once closing, a Close that keeps
// driving the held save past holdLimit refusals gets it released (and
// waited set), so that a planted Close that waits for it still returns.
type holdDevice struct {
	wal.Device
	refused      int // fsyncs refused
	closing      bool
	closeRefused int // of them, once closing
	released     bool
	waited       bool
}

func (d *holdDevice) Submit(op wal.IO) bool {
	if !d.released && op.Kind == wal.IOSync && strings.HasPrefix(filepath.Base(op.Path), "tmp-") {
		d.refused++
		if d.closing {
			d.closeRefused++
			if d.closeRefused >= holdLimit {
				d.released, d.waited = true, true
			}
		}
		if !d.released {
			return false
		}
	}
	return d.Device.Submit(op)
}

// heldDiskReplica is diskReplica (a one-member group in Sync mode with
// a log and disk snapshots on a vfs.Mem, capturing at every entry) whose
// snapshot saves go through a holdDevice, sharing gate (nil: none).
func heldDiskReplica(t *testing.T, f FSM, gate *SaveGate) (*Replica, *vfs.Mem, *holdDevice) {
	t.Helper()
	var hd *holdDevice
	r, m := diskReplicaOn(t, f, func(d wal.Device) wal.Device {
		hd = &holdDevice{Device: d}
		return hd
	}, gate)
	return r, m, hd
}

// TestCloseAbandonsHeldSave: a replica closed while its disk snapshot's
// save is held (its fsync never goes through) closes without waiting for
// it ("waited:"): it abandons the save, removes its tmp file ("tmp:"),
// names it in ClosedUnsaved ("named:"), and leaves a disk from which
// the next start recovers every delivered entry from the log, the save
// never having counted ("saved:", "log:"). Planted closeWaitsSave (Close
// lets the save run on until it ends) must fail "waited:".
func TestCloseAbandonsHeldSave(t *testing.T) {
	if err := closeHeldSave(t, false); err != nil {
		t.Fatal(err)
	}
	err := closeHeldSave(t, true)
	if err == nil || !strings.HasPrefix(err.Error(), "waited:") {
		t.Fatalf("planted closeWaitsSave: %v, want waited:", err)
	}
	t.Logf("planted closeWaitsSave caught: %v", err)
}

// closeHeldSave closes a replica whose save is held, with closeWaitsSave
// planted if waits, and returns the first property that failed.
func closeHeldSave(t *testing.T, waits bool) error {
	r, m, hd := heldDiskReplica(t, &logFSM{}, nil)
	r.knobs.closeWaitsSave = waits
	r.knobs.closeClock = (&stepClock{t: time.Now()}).now
	pollUntil(t, r, func() bool { return hd.refused > 0 }, "held disk snapshot save")
	index := r.Delivered()
	if index == 0 {
		t.Fatal("a save under way with nothing delivered")
	}
	hd.closing = true
	r.Close()
	if hd.waited {
		return fmt.Errorf("waited: Close drove the held save through %d refused fsyncs (a budget of %v allows at most %d) instead of abandoning it", hd.closeRefused, closeSaveBudget, holdLimit/10)
	}
	for _, n := range snapNames(t, m) {
		if strings.HasPrefix(n, "tmp-") {
			return fmt.Errorf("tmp: the close left snap/%s", n)
		}
	}
	if u := r.ClosedUnsaved(); len(u) != 1 || !strings.HasSuffix(u[0], ".snap") {
		return fmt.Errorf("named: ClosedUnsaved %q, want the held save's snapshot", u)
	}
	m.DropUnsynced() // a crash right after the stop
	snap, warn, err := LoadNewest(m, "snap")
	if err != nil || len(warn) > 0 {
		return fmt.Errorf("saved: LoadNewest after the stop: %v, %q", err, warn)
	}
	if snap != nil {
		return fmt.Errorf("saved: the abandoned save left %s", snap.Path)
	}
	rec, err := wal.Recover(m, "wal", 1)
	if err != nil {
		return fmt.Errorf("log: %w", err)
	}
	rc, err := RecoverFrom(rec, nil)
	if err != nil || rc.Repair || uint64(rc.Entries) < index {
		return fmt.Errorf("log: after the stop the log holds %d entries (repair %v, %v) with no snapshot; %d were delivered", rc.Entries, rc.Repair, err, index)
	}
	return nil
}

// TestSaveGateClosed: once a process's stop closed its SaveGate, a
// replica that waited for the gate does not capture when the holder
// closes and gives it back ("queued:"): the process's stop does not
// wait for saves one after another. Planted saveGateOpenAtClose must
// fail "queued:".
func TestSaveGateClosed(t *testing.T) {
	if err := saveGateClosed(t, false); err != nil {
		t.Fatal(err)
	}
	err := saveGateClosed(t, true)
	if err == nil || !strings.HasPrefix(err.Error(), "queued:") {
		t.Fatalf("planted saveGateOpenAtClose: %v, want queued:", err)
	}
	t.Logf("planted saveGateOpenAtClose caught: %v", err)
}

func saveGateClosed(t *testing.T, open bool) error {
	g := NewSaveGate()
	a, _, ha := heldDiskReplica(t, &logFSM{}, g)
	b, _, _ := heldDiskReplica(t, &logFSM{}, g)
	b.knobs.saveGateOpenAtClose = open
	a.knobs.closeClock = (&stepClock{t: time.Now()}).now
	pollUntil(t, a, func() bool { return ha.refused > 0 }, "held save of the gate's holder")
	pollUntil(t, b, func() bool { return b.SnapWork().GateWaits > 0 }, "the second replica refused the gate")
	if !g.Held() || b.SnapWork().Captures != 0 {
		t.Fatalf("before the stop: gate held %v, the waiter captured %d times", g.Held(), b.SnapWork().Captures)
	}
	g.Close()
	ha.closing = true
	a.Close()
	for range 2000 {
		b.Poll(b.now + 100*time.Microsecond)
	}
	if n := b.SnapWork().Captures; n != 0 {
		return fmt.Errorf("queued: the replica that waited for the closed gate captured %d times once its holder closed", n)
	}
	if g.Held() {
		return fmt.Errorf("held: the closed gate is held")
	}
	return nil
}
