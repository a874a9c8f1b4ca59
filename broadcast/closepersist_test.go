package broadcast

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/wal"
)

// heldFSM is a logFSM whose captures' Persist blocks until the test
// releases it, and which an owner "unmaps" after the replica's Close (as
// kvserver's stop closes a kv table's heap regions): a Persist that reads
// the state after that read memory that is gone.
type heldFSM struct {
	logFSM
	entered  chan struct{} // a Persist started (one send)
	release  chan struct{} // closed: the held Persist goes on
	unmapped atomic.Bool   // the owner unmapped the state (after Close returned)
	sawGone  atomic.Bool   // a Persist read the state after that
	done     chan struct{} // closed: the held Persist returned
}

type heldSnap struct {
	logSnap
	f *heldFSM
}

func (f *heldFSM) Snapshot() (FSMSnapshot, error) {
	s, _ := f.logFSM.Snapshot()
	return &heldSnap{logSnap: *s.(*logSnap), f: f}, nil
}

func (s *heldSnap) Persist(dst []byte) error {
	defer close(s.f.done)
	s.f.entered <- struct{}{}
	<-s.f.release
	if s.f.unmapped.Load() {
		s.f.sawGone.Store(true)
		return errors.New("heldFSM: the state was unmapped")
	}
	return s.logSnap.Persist(dst)
}

// TestCloseWaitsForPersist: Close called while a disk snapshot's Persist
// (a goroutine of its own) reads the FSM's state returns only after that
// Persist did, so the FSM's owner, which frees the state once Close
// returned, never frees it under the writer (capt's SIGSEGV in
// capture.Persist, 3de1b0c). The Persist is held on a channel; the test
// runs in a synctest bubble, so that once every goroutine is durably
// blocked (synctest.Wait: Close in its wait for the Persist goroutines,
// or returned) the order is fixed, not timed. Planted
// uncounted=persistDisk (the goroutine not counted in persisting) is
// caught by "close:": Close returns while the Persist is held; let go
// then, it finds the state unmapped ("memory:").
func TestCloseWaitsForPersist(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if err := closeUnderPersist(t, 0); err != nil {
			t.Fatal(err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		err := closeUnderPersist(t, persistDisk)
		if err == nil || !strings.HasPrefix(err.Error(), "close:") || !strings.Contains(err.Error(), "memory:") {
			t.Fatalf("planted uncounted disk Persist: %v, want close: and memory:", err)
		}
		t.Logf("planted uncounted disk Persist caught: %v", err)
	})
}

// closeUnderPersist runs a one-member durable group until its first disk
// snapshot's Persist is under way, closes the replica with the Persist
// held, and reports what went wrong: "close:" Close returned before the
// Persist did; "memory:" the Persist read the state after the owner
// unmapped it. It runs in a synctest bubble.
func closeUnderPersist(t *testing.T, uncounted persistKind) error {
	f := &heldFSM{entered: make(chan struct{}, 1), release: make(chan struct{}), done: make(chan struct{})}
	r, _ := diskReplica(t, f)
	r.knobs.uncounted = uncounted
	pollUntil(t, r, func() bool {
		select {
		case <-f.entered:
			return true
		default:
			return false
		}
	}, "a disk snapshot's Persist")

	closed := make(chan struct{})
	go func() {
		r.Close()
		f.unmapped.Store(true) // the owner frees the state Close handed back
		close(closed)
	}()
	synctest.Wait() // Close waits for the held Persist, or returned
	var errs []string
	select {
	case <-closed:
		errs = append(errs, "close: Close returned while a disk snapshot's Persist was still reading the FSM's state")
	default:
	}
	select {
	case <-f.done:
		errs = append(errs, "held: the Persist returned before the test let it go")
	default:
	}
	close(f.release)
	<-closed
	<-f.done // the planted run's Persist may still be going
	if f.sawGone.Load() {
		errs = append(errs, "memory: the Persist read the FSM's state after its owner unmapped it")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// diskReplica starts a one-member Sync group over an in-memory disk
// (snap/ and wal/ of m, one inlineDevice shared by the log and the
// snapshot store) that takes a disk snapshot after every log write.
func diskReplica(t *testing.T, f FSM) (*Replica, *vfs.Mem) {
	t.Helper()
	return diskReplicaOn(t, f, nil, nil)
}

// diskReplicaOn is diskReplica with its snapshots written through
// wrap's device (nil: the log's) and sharing gate (nil: none).
func diskReplicaOn(t *testing.T, f FSM, wrap func(wal.Device) wal.Device, gate *SaveGate) (*Replica, *vfs.Mem) {
	t.Helper()
	m := newDataFS(t)
	logDev, snapDev := wal.Share(&inlineDevice{x: wal.NewExecutor(m)})
	if wrap != nil {
		snapDev = wrap(snapDev)
	}
	w, err := wal.Open(logDev, wal.Config{Dir: "wal", Mode: wal.Sync, Member: 1, SegmentBytes: 64 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	node, err := mem.New(mem.Options{}).NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	cfg := Config{Self: 1, Members: []rdma.NodeID{1}, Start: StartNew, RingSize: 1 << 14,
		HeartbeatInterval: time.Millisecond, ElectionTimeout: 10 * time.Millisecond,
		Durability: Sync, WAL: w, Snapshots: NewSnapStore(snapDev, "snap", 1, nil), SnapshotLogBytes: 1, SaveGate: gate}
	r, err := New(cfg, node, f, &MemStable{})
	if err != nil {
		t.Fatal(err)
	}
	return r, m
}

// pollUntil polls r in virtual time, proposing one entry once it leads,
// until cond holds.
func pollUntil(t *testing.T, r *Replica, cond func() bool, what string) {
	t.Helper()
	now, proposed := r.now, false
	for i := 0; !cond(); i++ {
		if i == 100000 {
			t.Fatalf("no %s after %d polls (status %+v)", what, i, r.Status())
		}
		now += 100 * time.Microsecond
		r.Poll(now)
		if e, _ := r.Leading(); e != 0 && !proposed {
			r.Propose([]byte("x"))
			proposed = true
		}
	}
}

// TestCloseLeavesNoTmp: a clean stop (Close) while the snapshot store has
// a save under way leaves no snap/tmp- file: the save runs to its end
// (the snapshot is durable: a crash image right after Close loads it),
// or, once the time Close gives it passed (knob closeSaveExpired), it is
// abandoned and its tmp file removed (no snapshot file either). Before,
// Close left the save where it was and the tmp file for the next start
// to remove (internal/server's TestStartProcessRecoveryFails saw it):
// "close left snap/tmp-1".
func TestCloseLeavesNoTmp(t *testing.T) {
	for _, expired := range []bool{false, true} {
		r, m := diskReplica(t, &logFSM{})
		r.knobs.closeSaveExpired = expired
		r.knobs.closeClock = (&stepClock{t: time.Now()}).now // closeSaveBudget in reads, not in the machine's time
		pollUntil(t, r, r.cfg.Snapshots.Busy, "disk snapshot save under way")
		if !slices.ContainsFunc(snapNames(t, m), func(n string) bool { return strings.HasPrefix(n, "tmp-") }) {
			t.Fatalf("expired %v: a save under way and no tmp- file in snap/: %q", expired, snapNames(t, m))
		}
		index := r.Delivered()
		r.Close()
		for _, n := range snapNames(t, m) {
			if strings.HasPrefix(n, "tmp-") {
				t.Errorf("expired %v: close left snap/%s", expired, n)
			}
		}
		m.DropUnsynced() // a crash right after the stop
		snap, warn, err := LoadNewest(m, "snap")
		switch {
		case err != nil || len(warn) > 0:
			t.Errorf("expired %v: LoadNewest after the stop: %v, %q", expired, err, warn)
		case !expired && (snap == nil || snap.Index != index):
			t.Errorf("expired %v: the save under way did not finish: loaded %+v, want the snapshot at index %d", expired, snap, index)
		case expired && snap != nil:
			t.Errorf("expired %v: the abandoned save left %s", expired, snap.Path)
		}
	}
}

// inlineDevice runs each IO as it is submitted (one goroutine, no queue).
type inlineDevice struct {
	x    *wal.Executor
	done []wal.Done
}

func (d *inlineDevice) Submit(op wal.IO) bool {
	d.done = append(d.done, d.x.Run(op))
	return true
}

func (d *inlineDevice) Reap(dst []wal.Done) []wal.Done {
	dst = append(dst, d.done...)
	d.done = d.done[:0]
	return dst
}
