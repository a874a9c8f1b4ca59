package groupproc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/broadcast"
)

// TestFSMSnapshot checks that a restored FSM continues where the snapshot
// was taken: same digest, same entries in record mode, and the next Apply
// follows; and that a malformed snapshot is refused.
func TestFSMSnapshot(t *testing.T) {
	for _, record := range []bool{false, true} {
		a := NewFSM(record)
		for i, d := range []string{"x", "", "yz"} {
			a.Apply(broadcast.Entry{Index: uint64(i + 1), Data: []byte(d)})
		}
		snap, err := a.snapshotBytes()
		if err != nil {
			t.Fatal(err)
		}
		b := NewFSM(record)
		if err := b.Restore(snap); err != nil {
			t.Fatalf("record=%v: restore: %v", record, err)
		}
		if a.Digest() != b.Digest() || !slices.Equal(a.Entries(), b.Entries()) {
			t.Errorf("record=%v: restored %v %q, want %v %q", record, b.Digest(), b.Entries(), a.Digest(), a.Entries())
		}
		a.Apply(broadcast.Entry{Index: 4, Data: []byte("w")})
		b.Apply(broadcast.Entry{Index: 4, Data: []byte("w")})
		if a.Digest() != b.Digest() {
			t.Errorf("record=%v: digests differ after the same Apply", record)
		}
		if c := NewFSM(record); c.Digest() == a.Digest() {
			t.Errorf("record=%v: empty FSM has the digest of four entries", record)
		}
		if err := b.Restore(snap[:len(snap)-1]); !errors.Is(err, ErrSnapshot) {
			t.Errorf("record=%v: truncated snapshot: %v, want ErrSnapshot", record, err)
		}
	}
}

// applyN applies entries from+1 .. from+n, each derived from its index.
func applyN(f *FSM, from, n uint64) {
	for i := from + 1; i <= from+n; i++ {
		f.Apply(broadcast.Entry{Index: i, Data: fmt.Appendf(nil, "entry-%d", i)})
	}
}

// persist writes a capture into a fresh buffer.
func persist(t *testing.T, s broadcast.FSMSnapshot) []byte {
	t.Helper()
	b := make([]byte, s.Size())
	if err := s.Persist(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFSMStateCopyOnWrite: a capture of the ballast does not change while
// Apply writes every chunk after it (each chunk is copied once, on its
// first write), a Persist taken later is byte for byte the one taken at
// once, and once the capture is released Apply writes in place again.
func TestFSMStateCopyOnWrite(t *testing.T) {
	for _, tc := range []struct {
		state int64
		chunk int
	}{{40, 16}, {3*StateChunk + 5, StateChunk}, {7, 16}} {
		f := newFSM(false, tc.state, tc.chunk)
		nch := uint64(len(f.chunks))
		applyN(f, 0, 2*nch+1)
		s, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if s.Size() != headLen+int(tc.state) {
			t.Fatalf("state %d: capture of %d bytes, want %d", tc.state, s.Size(), headLen+int(tc.state))
		}
		at := persist(t, s)
		d0 := f.Digest()
		applyN(f, 2*nch+1, 3*nch) // every chunk written, some twice
		later := persist(t, s)
		if !bytes.Equal(at, later) {
			t.Fatalf("state %d: the capture changed under %d Applies", tc.state, 3*nch)
		}
		st := f.Stats()
		if st.ChunkCopies != nch {
			t.Errorf("state %d: %d chunk copies while one capture was live, want %d (one per chunk)", tc.state, st.ChunkCopies, nch)
		}
		if f.Digest() == d0 {
			t.Errorf("state %d: digest unchanged by %d Applies", tc.state, 3*nch)
		}
		s.Release()
		applyN(f, 5*nch+1, 2*nch)
		if st := f.Stats(); st.ChunkCopies != nch || st.Live != 0 {
			t.Errorf("state %d: after the release %d copies (want %d, none new), %d live", tc.state, st.ChunkCopies, nch, st.Live)
		}
		// The capture restores to the digest of when it was taken.
		g := newFSM(false, tc.state, tc.chunk)
		if err := g.Restore(at); err != nil {
			t.Fatal(err)
		}
		if g.Digest() != d0 {
			t.Errorf("state %d: capture restores to %+v, want %+v", tc.state, g.Digest(), d0)
		}
	}
}

// TestFSMStateRestore: Restore of a Persist gives the same digest (ballast
// hash included), adopts the buffer without copying it, goes on like the
// original, and refuses a snapshot of another state size.
func TestFSMStateRestore(t *testing.T) {
	for _, record := range []bool{false, true} {
		a := newFSM(record, 100, 32)
		applyN(a, 0, 37)
		snap, err := a.snapshotBytes()
		if err != nil {
			t.Fatal(err)
		}
		b := newFSM(record, 100, 32)
		if err := b.Restore(snap); err != nil {
			t.Fatalf("record=%v: %v", record, err)
		}
		if a.Digest() != b.Digest() || a.Digest().State == 0 || !slices.Equal(a.Entries(), b.Entries()) {
			t.Fatalf("record=%v: restored %+v, want %+v", record, b.Digest(), a.Digest())
		}
		if &b.chunks[0][0] != &snap[len(snap)-100] {
			t.Errorf("record=%v: Restore copied the state instead of adopting the buffer", record)
		}
		applyN(a, 37, 50)
		applyN(b, 37, 50)
		if a.Digest() != b.Digest() {
			t.Errorf("record=%v: digests differ after the same Applies: %+v, %+v", record, a.Digest(), b.Digest())
		}
		for _, other := range []int64{0, 99, 101} {
			c := newFSM(record, other, 32)
			before := c.Digest()
			if err := c.Restore(snap); !errors.Is(err, ErrSnapshot) {
				t.Errorf("record=%v: %d-byte FSM restored a 100-byte state: %v", record, other, err)
			}
			if c.Digest() != before {
				t.Errorf("record=%v: a refused Restore changed the state", record)
			}
		}
	}
}

// TestFSMStateReplicas: FSMs applying the same entries hold the same
// ballast; a different entry makes it differ; the initial fill is the same
// everywhere and not all zero.
func TestFSMStateReplicas(t *testing.T) {
	a, b := NewStateFSM(false, 2*StateChunk+3), NewStateFSM(false, 2*StateChunk+3)
	if a.Digest() != b.Digest() || a.Digest().State == NewStateFSM(false, 2*StateChunk+4).Digest().State {
		t.Fatalf("initial ballasts: %+v, %+v", a.Digest(), b.Digest())
	}
	if !slices.ContainsFunc(a.chunks[1], func(c byte) bool { return c != 0 }) {
		t.Fatal("ballast chunk 1 is all zero")
	}
	applyN(a, 0, 1000)
	applyN(b, 0, 1000)
	if a.Digest() != b.Digest() {
		t.Fatalf("same entries, different states: %+v, %+v", a.Digest(), b.Digest())
	}
	c := NewStateFSM(false, 2*StateChunk+3)
	applyN(c, 0, 999)
	c.Apply(broadcast.Entry{Index: 1000, Data: []byte("other")})
	if c.Digest().State == a.Digest().State {
		t.Fatal("a different last entry left the ballast's hash unchanged")
	}
}

// TestFSMStateConcurrentPersist persists captures on other goroutines
// while Apply goes on (run it with -race): every persisted capture
// restores to the digest it was taken at.
func TestFSMStateConcurrentPersist(t *testing.T) {
	f := newFSM(false, 64<<10, 4<<10)
	var wg sync.WaitGroup
	var idx uint64
	for round := range 20 {
		s, _ := f.Snapshot()
		want := s.(*capture).digest()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Release()
			b := make([]byte, s.Size())
			if err := s.Persist(b); err != nil {
				t.Error(err)
				return
			}
			g := newFSM(false, 64<<10, 4<<10)
			if err := g.Restore(b); err != nil {
				t.Error(err)
				return
			}
			if got := g.Digest(); got != want {
				t.Errorf("round %d: capture restores to %+v, want %+v", round, got, want)
			}
		}()
		applyN(f, idx, 40)
		idx += 40
	}
	wg.Wait()
	if st := f.Stats(); st.Live != 0 {
		t.Errorf("%d captures live after every release", st.Live)
	}
}

// TestFSMPersistPreemptible: a stop of the world (a GC cycle the driver
// goroutine's allocations start, or its mark termination) must not wait
// for a long Persist on another goroutine. Persist into fresh memory
// (mmap, as a registered region is) takes tens of milliseconds for 32
// MiB, and a loop of copies is all memmove, where the runtime cannot
// preempt a goroutine: Persist has to reach a preemption point between
// its chunks. The test asserts that behaviour, not a time: on one P
// (GOMAXPROCS 1) and without asynchronous preemption (the test runs
// itself with GODEBUG=asyncpreemptoff=1, so that only Persist's own
// preemption points count), another goroutine runs while Persist is
// under way (it has written the head into dst and not yet the last
// chunk). Planted
// fsmKnobs.persistNoYield (no yield between chunks): the other goroutine
// runs only once Persist returned. (It measured runtime.GC against
// Persist's end before: at load 40-50 a GC that did not wait still
// returned 0.8 ms after Persist ended, a false failure.) Under -race the
// detector's calls around each copy are preemption points already: it
// skips, make norace runs it.
func TestFSMPersistPreemptible(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's calls are preemption points: make norace runs it")
	}
	if os.Getenv(persistChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestFSMPersistPreemptible$", "-test.v")
		cmd.Env = append(os.Environ(), persistChildEnv+"=1", "GODEBUG=asyncpreemptoff=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("with GODEBUG=asyncpreemptoff=1: %v\n%s", err, out)
		}
		t.Logf("with GODEBUG=asyncpreemptoff=1:\n%s", out)
		return
	}
	for _, planted := range []bool{false, true} {
		ran := persistOtherRan(t, planted)
		switch {
		case !planted && !ran:
			t.Fatal("no other goroutine ran on the one P while Persist was under way: it has no preemption point between its chunks")
		case planted && ran:
			t.Fatal("planted persistNoYield: another goroutine ran during Persist all the same: the check cannot tell a Persist without preemption points")
		case planted:
			t.Log("planted persistNoYield caught: no other goroutine ran during Persist")
		}
	}
}

// persistChildEnv marks TestFSMPersistPreemptible's run of itself.
const persistChildEnv = "GROUPPROC_PERSIST_CHILD"

// persistOtherRan persists a 32 MiB capture into fresh memory on a
// goroutine of its own, with GOMAXPROCS 1, and reports whether this
// goroutine ran while Persist was under way (dst's first bytes written,
// its last ones not yet).
func persistOtherRan(t *testing.T, noYield bool) bool {
	t.Helper()
	f := NewStateFSM(false, 32<<20)
	f.knobs.persistNoYield = noYield
	applyN(f, 0, 10)
	s, _ := f.Snapshot()
	defer s.Release()
	dst, err := unix.Mmap(-1, 0, s.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer unix.Munmap(dst)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var done atomic.Bool
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		if err := s.Persist(dst); err != nil {
			t.Error(err)
		}
		done.Store(true)
	}()
	// Under way: the head (copied first, not all zero) is written and
	// the last chunk (not all zero either, checked after) is not yet.
	nonzero := func(b []byte) bool { return slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) }
	tail := dst[len(dst)-StateChunk/2:]
	ran := false
	for !done.Load() {
		if nonzero(dst[:64]) && !nonzero(tail) {
			ran = true
		}
		runtime.Gosched()
	}
	<-finished
	if !nonzero(dst[:64]) || !nonzero(tail) {
		t.Fatal("a persisted capture's head or last chunk is all zero: the check cannot tell how far Persist got")
	}
	return ran
}
