package mcproc

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
)

// FSM is a replica process's application state machine: the count of
// messages delivered in its group and a running hash over their payloads.
// The result of a delivery names the group, the index and the hash after
// it ("g1@42:0123456789abcdef"), so that the checker's byte-for-byte
// comparison of results across replicas and replies compares the states.
// Its snapshot is the count and the hash. Every delivery and restore is
// handed to the report functions (nil: not reported).
type FSM struct {
	Group   tree.Group
	Replica uint32
	Inc     int
	// OnDeliver and OnRestore, when set, see every delivery and restore;
	// OnFailure an index out of sequence or a bad snapshot. The pointers
	// are theirs to keep.
	OnDeliver func(*Delivery)
	OnRestore func(*Restore)
	OnFailure func(*Failure)

	n   atomic.Uint64 // delivery index
	h   uint64
	d   *xxhash.Digest
	res []byte
}

// Delivered is the delivery index (safe from any goroutine).
func (f *FSM) Delivered() uint64 { return f.n.Load() }

// Apply implements broadcast.FSM.
func (f *FSM) Apply(e broadcast.Entry) []byte {
	if f.d == nil {
		f.d = xxhash.New()
	}
	if n := f.n.Load(); e.Index != n+1 && f.OnFailure != nil {
		f.OnFailure(&Failure{Err: fmt.Sprintf("group %d replica %d inc %d: Apply index %d after %d", f.Group, f.Replica, f.Inc, e.Index, n), UnixNS: time.Now().UnixNano()})
	}
	var hb [8]byte
	binary.LittleEndian.PutUint64(hb[:], f.h)
	f.d.Reset()
	f.d.Write(hb[:])
	f.d.Write(e.Data)
	f.h = f.d.Sum64()
	f.n.Store(e.Index)
	f.res = fmt.Appendf(f.res[:0], "g%d@%d:%016x", f.Group, e.Index, f.h)
	if f.OnDeliver != nil {
		id, ok := PayloadID(e.Data)
		f.OnDeliver(&Delivery{Group: f.Group, Replica: f.Replica, Inc: f.Inc, Index: e.Index, Msg: id, Result: append([]byte(nil), f.res...), Malformed: !ok})
	}
	return f.res
}

// Snapshot implements broadcast.FSM: [count u64][hash u64].
func (f *FSM) Snapshot() (broadcast.FSMSnapshot, error) {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, f.n.Load())
	binary.LittleEndian.PutUint64(b[8:], f.h)
	return broadcast.BytesSnapshot(b), nil
}

// Restore implements broadcast.FSM.
func (f *FSM) Restore(b []byte) error {
	if len(b) != 16 {
		err := fmt.Errorf("mcproc: group %d replica %d: snapshot of %d bytes, want 16", f.Group, f.Replica, len(b))
		if f.OnFailure != nil {
			f.OnFailure(&Failure{Err: err.Error(), UnixNS: time.Now().UnixNano()})
		}
		return err
	}
	n := binary.LittleEndian.Uint64(b)
	f.h = binary.LittleEndian.Uint64(b[8:])
	f.n.Store(n)
	if f.OnRestore != nil {
		f.OnRestore(&Restore{Group: f.Group, Replica: f.Replica, Inc: f.Inc, Index: n})
	}
	return nil
}

// emitter queues lines from any goroutine; its writer goroutine encodes
// them in order and flushes whenever the queue is empty.
type emitter struct {
	mu      sync.Mutex
	flushed *sync.Cond // signalled when written moves
	q       []Line
	queued  uint64 // lines queued so far
	written uint64 // lines written and flushed so far
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	err     error
}

func newEmitter(w *bufio.Writer) *emitter {
	e := &emitter{wake: make(chan struct{}, 1), done: make(chan struct{})}
	e.flushed = sync.NewCond(&e.mu)
	go e.run(w)
	return e
}

// emit queues l; it returns l's number (1, 2, ...), 0 once closed.
func (e *emitter) emit(l Line) uint64 {
	e.mu.Lock()
	n := uint64(0)
	if !e.closed {
		e.q = append(e.q, l)
		e.queued++
		n = e.queued
	}
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return n
}

// emitSync queues l and returns once it was written and flushed (it is
// in the pipe: a kill -9 of this process does not lose it).
func (e *emitter) emitSync(l Line) {
	n := e.emit(l)
	e.mu.Lock()
	for n != 0 && e.written < n && !e.stopped() {
		e.flushed.Wait()
	}
	e.mu.Unlock()
}

// stopped reports whether the writer ended (with e.mu held).
func (e *emitter) stopped() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

func (e *emitter) run(w *bufio.Writer) {
	defer func() {
		e.mu.Lock()
		close(e.done)
		e.flushed.Broadcast()
		e.mu.Unlock()
	}()
	enc := json.NewEncoder(w)
	var batch []Line
	for {
		<-e.wake
		for {
			e.mu.Lock()
			batch, e.q = e.q, batch[:0]
			closed := e.closed
			e.mu.Unlock()
			if len(batch) == 0 {
				if closed {
					return
				}
				break
			}
			for i := range batch {
				if err := enc.Encode(&batch[i]); err != nil && e.err == nil {
					e.err = err // the parent stopped reading: it is gone, EOF follows
				}
				batch[i] = Line{}
			}
			if err := w.Flush(); err != nil && e.err == nil {
				e.err = err
			}
			e.mu.Lock()
			e.written += uint64(len(batch))
			e.flushed.Broadcast()
			e.mu.Unlock()
		}
	}
}

// close writes what is queued and stops the writer.
func (e *emitter) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	<-e.done
}

func openNode(cfg Config, self rdma.NodeID) (rdma.Node, error) {
	n, err := fabric.Open(fabric.Spec{Fabric: "shm", ShmDir: cfg.ShmDir, Cluster: cfg.ShmCluster, Spin: cfg.Spin, PeerTimeout: cfg.PeerTimeout}, self)
	if err != nil {
		return nil, fmt.Errorf("mcproc: %w", err)
	}
	return n, nil
}

// replicaStats is what only the polling goroutine may read, copied for
// status requests.
type replicaStats struct {
	mu                sync.Mutex
	ctr               multicast.Counters
	dups, gaps, stale uint64
}

// statsEvery is how often the polling goroutine copies its counters.
const statsEvery = 10 * time.Millisecond

// statsPoller polls the replica and copies its counters for status
// requests every statsEvery.
type statsPoller struct {
	r    *multicast.Replica
	st   *replicaStats
	last time.Duration
}

func (p *statsPoller) Poll(now time.Duration) bool {
	progress := p.r.Poll(now)
	if now-p.last >= statsEvery {
		p.last = now
		c := p.r.Counters()
		d, g, s := p.r.Anomalies()
		p.st.mu.Lock()
		p.st.ctr, p.st.dups, p.st.gaps, p.st.stale = c, d, g, s
		p.st.mu.Unlock()
	}
	return progress
}

func (p *statsPoller) NextDeadline() time.Duration { return p.r.NextDeadline() }

// serveReplica runs a replica process after its config line.
func serveReplica(cfg Config, sc *bufio.Scanner, em *emitter) error {
	t, err := tree.Parse(cfg.Tree)
	if err != nil {
		return fmt.Errorf("mcproc: replica: %w", err)
	}
	if int(cfg.Group) >= len(cfg.Members) || int(cfg.Replica) >= len(cfg.Members[cfg.Group]) {
		return fmt.Errorf("mcproc: replica %d of group %d is not in the members %v", cfg.Replica, cfg.Group, cfg.Members)
	}
	self := cfg.Members[cfg.Group][cfg.Replica]
	node, err := openNode(cfg, self)
	if err != nil {
		return err
	}
	fsm := &FSM{Group: cfg.Group, Replica: cfg.Replica, Inc: cfg.Inc,
		OnDeliver: func(d *Delivery) { em.emit(Line{Deliver: d}) },
		OnRestore: func(r *Restore) { em.emit(Line{Restore: r}) },
		OnFailure: func(f *Failure) { em.emit(Line{Failure: f}) },
	}
	tu := cfg.Tuning
	bc := broadcast.Config{Self: self, Start: cfg.Start,
		RingSize: tu.RingSize, MaxRecord: tu.MaxRecord,
		HeartbeatInterval: tu.HeartbeatInterval, ElectionTimeout: tu.ElectionTimeout,
		MaxLogEntries: tu.MaxLogEntries, MaxCatchUpLogEntries: tu.MaxCatchUpLogEntries, MaxUncommitted: tu.MaxUncommitted,
		MaxPending: tu.MaxPending, ProposeTimeout: tu.ProposeTimeout,
		ReconnectMin: cfg.ReconnectMin, ReconnectMax: cfg.ReconnectMax}
	var stable broadcast.Stable = &broadcast.MemStable{}
	if cfg.StablePath != "" {
		stable = broadcast.FileStable{Path: cfg.StablePath}
	} else {
		bc.Start = broadcast.StartNew
	}
	mc := multicast.Config{Group: cfg.Group, Tree: t, Members: cfg.Members, ClientNodes: cfg.ClientNodes,
		ClientSlots: cfg.ClientSlots, ParentSlots: cfg.ParentSlots, SlotSize: cfg.SlotSize, MaxResult: cfg.MaxResult,
		RetransmitAfter: cfg.RetransmitAfter, Broadcast: bc}
	r, err := multicast.New(mc, node, fsm, stable)
	if err != nil {
		node.Close()
		return fmt.Errorf("mcproc: group %d replica %d: %w", cfg.Group, cfg.Replica, err)
	}
	maxPark := tu.HeartbeatInterval
	if maxPark <= 0 {
		maxPark = broadcast.DefaultHeartbeatInterval
	}
	st := &replicaStats{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g := poller.NewGroup(poller.GroupConfig{Pollers: 1, MaxPark: maxPark, Spin: cfg.Spin})
		g.Add(&statsPoller{r: r, st: st, last: -time.Hour}, node)
		g.Run(ctx)
	}()
	em.emit(Line{Ready: true, Pid: os.Getpid()})
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			em.emit(Line{Err: fmt.Sprintf("bad request %q: %v", sc.Text(), err)})
			continue
		}
		switch req.Cmd {
		case CmdStatus:
			s := Status{Group: cfg.Group, Replica: cfg.Replica, Inc: cfg.Inc, Delivered: fsm.Delivered(), Broadcast: r.Broadcast().Status()}
			s.Epoch, s.Leading = r.Broadcast().Leading()
			st.mu.Lock()
			s.Counters, s.Dups, s.Gaps, s.Stale = st.ctr, st.dups, st.gaps, st.stale
			st.mu.Unlock()
			em.emit(Line{ID: req.ID, Status: &s})
		default:
			em.emit(Line{ID: req.ID, Err: fmt.Sprintf("replica: unknown command %q", req.Cmd)})
		}
	}
	cancel()
	<-done
	return errors.Join(sc.Err(), r.Close(), node.Close())
}
