package broadcast

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/wal"
)

// gateDevice is a wal.Device whose IOs run only when the test says
// (step, run), on a vfs.Mem; fail makes the next IO of a kind fail with
// an error instead of running.
type gateDevice struct {
	x     *wal.Executor
	queue []wal.IO
	done  []wal.Done
	fail  map[wal.IOKind]error
	ran   []wal.IOKind
}

func newGateDevice(fs vfs.FS) *gateDevice {
	return &gateDevice{x: wal.NewExecutor(fs), fail: map[wal.IOKind]error{}}
}

func (d *gateDevice) Submit(op wal.IO) bool { d.queue = append(d.queue, op); return true }

func (d *gateDevice) Reap(dst []wal.Done) []wal.Done {
	dst = append(dst, d.done...)
	d.done = d.done[:0]
	return dst
}

// step runs the oldest queued IO; false if none.
func (d *gateDevice) step() bool {
	if len(d.queue) == 0 {
		return false
	}
	op := d.queue[0]
	d.queue = d.queue[1:]
	err, ok := d.fail[op.Kind]
	if ok {
		delete(d.fail, op.Kind)
	} else {
		err = d.x.Do(op)
		d.ran = append(d.ran, op.Kind)
	}
	d.done = append(d.done, wal.Done{Tag: op.Tag, Err: err})
	return true
}

// run runs every queued IO.
func (d *gateDevice) run() {
	for d.step() {
	}
}

func loadOn(t *testing.T, fs vfs.FS) StableState {
	t.Helper()
	st, err := FileStable{Path: "stable", FS: fs}.Load()
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return st
}

// TestAsyncFileStable: a save is durable once reported, not before; the
// file is the old one or the new one at every instant a crash may strike
// (never torn, never missing); a save asked for while one runs waits, and
// a later one replaces it; a write that finds the disk full is reported
// and renames nothing over the stable file.
func TestAsyncFileStable(t *testing.T) {
	fs := vfs.NewMem()
	dev := newGateDevice(fs)
	a := NewAsyncFileStable(FileStable{Path: "stable", FS: fs}, dev)
	old := StableState{Incarnation: 1, ENew: MakeEpoch(1, 1)}
	if err := a.Save(old); err != nil {
		t.Fatal(err)
	}
	next := StableState{Incarnation: 1, ENew: MakeEpoch(2, 1)}
	a.SaveAsync(next)
	for k := 0; ; k++ {
		// A crash now (every unsynced page kept or lost at random, the
		// last one torn) leaves the old state or the new one.
		for seed := range uint64(8) {
			img := fs.Clone()
			img.Crash(rand.New(rand.NewPCG(seed, uint64(k))))
			if st := loadOn(t, img); st != old && st != next {
				t.Fatalf("after %d IOs, crash %d: the stable file holds %+v, neither %+v nor %+v", k, seed, st, old, next)
			}
		}
		done := a.Saved(nil)
		if len(done) > 0 {
			if len(done) != 1 || done[0].State != next || done[0].Err != nil {
				t.Fatalf("completions %+v, want one of %+v", done, next)
			}
			img := fs.Clone()
			img.DropUnsynced()
			if st := loadOn(t, img); st != next {
				t.Fatalf("reported saved, but a crash leaves %+v", st)
			}
			break
		}
		if !dev.step() {
			t.Fatalf("after %d IOs: no IO queued and no completion", k)
		}
	}

	// Coalescing: e3 runs, e4 waits, e5 replaces it.
	e3, e4, e5 := StableState{1, MakeEpoch(3, 1)}, StableState{1, MakeEpoch(4, 1)}, StableState{1, MakeEpoch(5, 1)}
	a.SaveAsync(e3)
	a.SaveAsync(e4)
	a.SaveAsync(e5)
	var got []StableSaved
	for range 100 {
		dev.run()
		got = a.Saved(got)
	}
	if len(got) != 2 || got[0].State != e3 || got[1].State != e5 || got[0].Err != nil || got[1].Err != nil {
		t.Fatalf("completions %+v, want %+v then %+v", got, e3, e5)
	}
	if st := loadOn(t, fs); st != e5 {
		t.Fatalf("stable file %+v, want %+v", st, e5)
	}

	// A full disk: the temporary file's write fails; nothing is renamed.
	dev.fail[wal.IOWrite] = syscall.ENOSPC
	dev.ran = nil
	a.SaveAsync(StableState{1, MakeEpoch(6, 1)})
	got = nil
	for range 10 {
		dev.run()
		got = a.Saved(got)
	}
	if len(got) != 1 || !errors.Is(got[0].Err, syscall.ENOSPC) {
		t.Fatalf("completions %+v, want one failed with ENOSPC", got)
	}
	for _, k := range dev.ran {
		if k == wal.IORename {
			t.Fatalf("a failed write was followed by a rename (IOs run: %v)", dev.ran)
		}
	}
	if st := loadOn(t, fs); st != e5 {
		t.Fatalf("after the failed save the stable file holds %+v, want %+v", st, e5)
	}
}

// asyncCluster is a qcluster whose node 1 keeps its stable state in an
// AsyncFileStable on a gateDevice.
func asyncCluster(t *testing.T) (*qcluster, *gateDevice, *vfs.Mem) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	fs := vfs.NewMem()
	dev := newGateDevice(fs)
	n1 := c.get(1)
	c.crash(1, 0)
	n1.stable = NewAsyncFileStable(FileStable{Path: "stable", FS: fs}, dev)
	c.cfg.Start = StartNew
	c.boot(n1)
	c.settle(nil)
	return c, dev, fs
}

// TestAsyncStableVote: with an AsyncStable, a vote for a new epoch is not
// published (VoteSST row, Status.Vote) while its save runs, and the
// replica does not ask for a Poll at once meanwhile (the completion wakes
// it); once the save completed the vote goes out and the candidate wins.
func TestAsyncStableVote(t *testing.T) {
	c, dev, fs := asyncCluster(t)
	r := c.get(1).r
	r.startElection(true)
	for range 5 {
		c.settle(nil)
	}
	if r.saves.asked == 0 || len(dev.queue) == 0 {
		t.Fatalf("no save asked for: asked %v, queue %d", r.saves.asked, len(dev.queue))
	}
	if e := Epoch(r.myRows[tVote][0]); e != 0 || r.Status().Vote.ENew != 0 || r.eNew != 0 {
		t.Fatalf("vote published before its save completed: row e_new %v, status %+v, e_new %v", e, r.Status().Vote, r.eNew)
	}
	if d := r.NextDeadline(); d <= c.now {
		t.Fatalf("waiting for its save, NextDeadline %v is not after now %v (it would poll in a loop)", d, c.now)
	}
	if st := loadOn(t, fs); st.ENew != 0 {
		t.Fatalf("stable file %+v before its save ran", st)
	}
	// The save's first phase, then its second (submitted by a Poll).
	for range 10 {
		dev.run()
		c.settle(nil)
	}
	if st := loadOn(t, fs); st.ENew != r.saves.asked {
		t.Fatalf("stable file %+v, asked %v", st, r.saves.asked)
	}
	s := r.Status()
	if s.Role != Leader || s.ECur != r.saves.asked || s.Counters.StableSaves == 0 || s.StableSaveMax <= 0 {
		t.Fatalf("after the save: %+v; want leader of the saved epoch %v, a save counted with its time\n%s", s, r.saves.asked, c.takeTrace())
	}
}

// TestAsyncStableAccept: a follower whose stable state saves
// asynchronously accepts a new epoch's diff (Fig. 5 l.54-66) only once
// its E_new is durable: until then the diff waits in the ring.
func TestAsyncStableAccept(t *testing.T) {
	c, dev, fs := asyncCluster(t)
	c.get(2).r.startElection(true)
	for range 5 {
		c.settle(nil)
	}
	r := c.get(1).r
	if s := c.get(2).r.Status(); s.Role != Leader {
		t.Fatalf("node 2: %+v, want leader", s)
	}
	e := c.get(2).r.Status().ECur
	if r.Status().Role == Follower || Epoch(r.myRows[tAccept][0]) == e {
		t.Fatalf("node 1 follows %v before its E_new was saved: %+v", e, r.Status())
	}
	if len(dev.queue) == 0 {
		t.Fatalf("node 1 asked for no save")
	}
	for range 10 {
		dev.run()
		c.settle(nil)
	}
	if s := r.Status(); s.Role != Follower || s.ECur != e || loadOn(t, fs).ENew < e {
		t.Fatalf("node 1 after its save: %+v, stable %+v; want a follower of %v\n%s", s, loadOn(t, fs), e, c.takeTrace())
	}
	p := c.get(2).r.Propose([]byte("x"))
	for range 5 {
		c.settle(nil)
	}
	if i, err := p.Result(); err != nil || i != 1 || len(c.delivered(1)) != 1 {
		t.Fatalf("x: %d, %v; node 1 delivered %q", i, err, c.delivered(1))
	}
}

// electOnFailingSaves starts an election at node 1 of an asyncCluster
// whose device fails op with errno, and runs the device and the cluster
// rounds times.
func electOnFailingSaves(t *testing.T, op wal.IOKind, errno error, rounds int) (*qcluster, *gateDevice, *vfs.Mem, *Replica) {
	c, dev, fs := asyncCluster(t)
	r := c.get(1).r
	dev.fail[op] = errno
	r.startElection(true)
	for range rounds {
		dev.run()
		c.settle(nil)
	}
	return c, dev, fs, r
}

// TestAsyncStableFailStop: a save that fails (EIO on the temporary
// file's fsync) stops the replica, as a failed fsync of the log does:
// the vote is not published, Status.DiskErr wraps ErrDisk and the cause,
// Poll does nothing more, and it asks for no Poll.
func TestAsyncStableFailStop(t *testing.T) {
	c, _, _, r := electOnFailingSaves(t, wal.IOSync, syscall.EIO, 10)
	s := r.Status()
	if !errors.Is(s.DiskErr, ErrDisk) || !errors.Is(s.DiskErr, syscall.EIO) {
		t.Fatalf("DiskErr %v, want ErrDisk wrapping EIO", s.DiskErr)
	}
	if Epoch(r.myRows[tVote][0]) != 0 || s.Role == Leader {
		t.Fatalf("published after a failed save: row e_new %v, %+v", Epoch(r.myRows[tVote][0]), s)
	}
	if r.Poll(c.now+time.Second) || r.NextDeadline() != wal.Never {
		t.Fatalf("a stopped replica polls on (deadline %v)", r.NextDeadline())
	}
}

// TestAsyncStableDiskFull: a save that finds the disk full is not
// published and is asked again ElectionTimeout/8 later (the replica asks
// for that Poll); once space returns the vote goes out.
func TestAsyncStableDiskFull(t *testing.T) {
	c, dev, fs, r := electOnFailingSaves(t, wal.IOWrite, syscall.ENOSPC, 3)
	s := r.Status()
	if s.Counters.StableSavesFull != 1 || !errors.Is(s.StableFullErr, syscall.ENOSPC) || s.DiskErr != nil {
		t.Fatalf("after ENOSPC: %+v; want one full save, StableFullErr ENOSPC, no DiskErr", s)
	}
	if Epoch(r.myRows[tVote][0]) != 0 || loadOn(t, fs).ENew != 0 {
		t.Fatalf("published or saved on a full disk: row %v, file %+v", Epoch(r.myRows[tVote][0]), loadOn(t, fs))
	}
	if d := r.NextDeadline(); d > r.saves.retryAt || r.saves.retryAt <= c.now {
		t.Fatalf("NextDeadline %v, retry at %v (now %v)", d, r.saves.retryAt, c.now)
	}
	for range 20 {
		dev.run()
		c.settle(nil)
	}
	if s := r.Status(); s.Role != Leader || s.StableFullErr != nil || loadOn(t, fs).ENew != s.ECur {
		t.Fatalf("after space returned: %+v, file %+v; want leader of the saved epoch\n%s", s, loadOn(t, fs), c.takeTrace())
	}
}
