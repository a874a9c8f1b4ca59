package broadcast

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
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
// capture.Persist, 3de1b0c). The Persist is held on a channel until
// Close says it waits for it (knobs.onCloseWait with a running count), so
// the order is fixed, not timed. Planted uncounted=persistDisk (the
// goroutine not counted in persisting) is caught by "close:": Close
// returns while the Persist is held; let go then, it finds the state
// unmapped ("memory:").
func TestCloseWaitsForPersist(t *testing.T) {
	if err := closeUnderPersist(t, 0); err != nil {
		t.Fatal(err)
	}
	err := closeUnderPersist(t, persistDisk)
	if err == nil || !strings.HasPrefix(err.Error(), "close:") || !strings.Contains(err.Error(), "memory:") {
		t.Fatalf("planted uncounted disk Persist: %v, want close: and memory:", err)
	}
	t.Logf("planted uncounted disk Persist caught: %v", err)
}

// closeUnderPersist runs a one-member durable group until its first disk
// snapshot's Persist is under way, closes the replica with the Persist
// held, and reports what went wrong: "close:" Close returned before the
// Persist did; "memory:" the Persist read the state after the owner
// unmapped it.
func closeUnderPersist(t *testing.T, uncounted persistKind) error {
	m := vfs.NewMem()
	for _, d := range []string{"snap", "wal"} {
		if err := m.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	logDev, snapDev := wal.Share(&inlineDevice{x: wal.NewExecutor(m)})
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
		Durability: Sync, WAL: w, Snapshots: NewSnapStore(snapDev, "snap", 1, nil), SnapshotLogBytes: 1}
	f := &heldFSM{entered: make(chan struct{}, 1), release: make(chan struct{}), done: make(chan struct{})}
	r, err := New(cfg, node, f, &MemStable{})
	if err != nil {
		t.Fatal(err)
	}
	r.knobs.uncounted = uncounted
	waits := make(chan int, 2)
	r.knobs.onCloseWait = func(running int) { waits <- running }

	// Virtual time: elect, propose, poll until the capture's Persist runs.
	now, proposed := time.Duration(0), false
	for i := 0; ; i++ {
		if i == 100000 {
			t.Fatalf("no disk snapshot after %d polls (status %+v)", i, r.Status())
		}
		now += 100 * time.Microsecond
		r.Poll(now)
		if e, _ := r.Leading(); e != 0 && !proposed {
			r.Propose([]byte("x"))
			proposed = true
		}
		select {
		case <-f.entered:
		default:
			continue
		}
		break
	}

	closed := make(chan struct{})
	go func() {
		r.Close()
		f.unmapped.Store(true) // the owner frees the state Close handed back
		close(closed)
	}()
	var errs []string
	select {
	case <-closed:
		errs = append(errs, "close: Close returned while a disk snapshot's Persist was still reading the FSM's state")
	case n := <-waits:
		if n == 0 {
			// Close waits for nothing: it returns with the Persist held.
			<-closed
			errs = append(errs, "close: Close found no Persist running (the disk snapshot's is held) and returned")
		}
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
