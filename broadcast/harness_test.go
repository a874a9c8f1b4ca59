package broadcast

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// logFSM is a test state machine whose state is the delivered sequence
// itself, so snapshots carry it and every replica's sequence is comparable.
type logFSM struct {
	ballast   int // bytes of ballast in every snapshot (large snapshots)
	seq       [][]byte
	hdrs      []MsgHdr // the header of each entry of seq delivered by Apply (not restored)
	restores  int
	rollbacks int // restores that shortened the delivered sequence
	// reply makes Apply return a result, "index epoch data", from a
	// buffer it reuses (the replica must copy what it keeps).
	reply bool
	out   []byte
}

func (f *logFSM) Apply(e Entry) []byte {
	if e.Index != uint64(len(f.seq))+1 {
		panic(fmt.Sprintf("apply index %d after %d entries", e.Index, len(f.seq)))
	}
	f.seq = append(f.seq, append([]byte(nil), e.Data...))
	for len(f.hdrs) < len(f.seq)-1 {
		f.hdrs = append(f.hdrs, MsgHdr{}) // restored by a snapshot: unknown
	}
	f.hdrs = append(f.hdrs, e.Hdr)
	if !f.reply {
		return nil
	}
	f.out = fmt.Appendf(f.out[:0], "%d %v %s", e.Index, e.Hdr.E, e.Data)
	return f.out
}

// Snapshot captures the sequence (its entries never change, and later
// appends do not show through the capped slice); Persist lays it out,
// followed by ballast bytes, if any, to make large snapshots.
func (f *logFSM) Snapshot() (FSMSnapshot, error) {
	return &logSnap{seq: f.seq[:len(f.seq):len(f.seq)], ballast: f.ballast}, nil
}

type logSnap struct {
	seq     [][]byte
	ballast int
}

const ballastMark = ^uint32(0)

func (s *logSnap) Size() int {
	n := 0
	for _, d := range s.seq {
		n += 4 + len(d)
	}
	if s.ballast > 0 {
		n += 4 + s.ballast
	}
	return n
}

func (s *logSnap) Persist(dst []byte) error {
	b := bytes.NewBuffer(dst[:0])
	for _, d := range s.seq {
		binary.Write(b, binary.LittleEndian, uint32(len(d)))
		b.Write(d)
	}
	if s.ballast > 0 {
		binary.Write(b, binary.LittleEndian, ballastMark)
		for k := range s.ballast {
			b.WriteByte(byte(k))
		}
	}
	if b.Len() != len(dst) || len(dst) > 0 && &b.Bytes()[0] != &dst[0] { // an empty state: nothing delivered yet
		return fmt.Errorf("logSnap: wrote %d bytes of %d", b.Len(), len(dst))
	}
	return nil
}

func (s *logSnap) Release() {}

func (f *logFSM) Restore(s []byte) error {
	f.restores++
	delivered := len(f.seq)
	defer func() {
		if len(f.seq) < delivered {
			f.rollbacks++
		}
	}()
	f.seq, f.hdrs = nil, nil
	for len(s) > 0 {
		if len(s) < 4 {
			return fmt.Errorf("short snapshot")
		}
		if binary.LittleEndian.Uint32(s) == ballastMark {
			for k, c := range s[4:] {
				if c != byte(k) {
					return fmt.Errorf("ballast byte %d is %d", k, c)
				}
			}
			break
		}
		n := int(binary.LittleEndian.Uint32(s))
		if len(s) < 4+n {
			return fmt.Errorf("short snapshot entry")
		}
		f.seq = append(f.seq, append([]byte(nil), s[4:4+n]...))
		s = s[4+n:]
	}
	return nil
}

// qnode is one member of a queued-mode cluster.
type qnode struct {
	id     rdma.NodeID
	node   *mem.Node
	r      *Replica
	fsm    *logFSM
	stable Stable
	up     bool
}

// qcluster drives replicas on the mem fabric in queued mode: the test
// decides exactly when each posted op lands, so traces are exact.
type qcluster struct {
	t     testing.TB
	f     *mem.Fabric
	conns []*mem.Conn
	seen  map[*mem.Conn]bool
	nodes []*qnode
	cfg   Config
	now   time.Duration
	trace []string
}

func newQCluster(t testing.TB, ids []rdma.NodeID, mod func(*Config)) *qcluster {
	c := &qcluster{t: t, seen: map[*mem.Conn]bool{}}
	c.f = mem.New(mem.Options{Queued: true, OnPost: func(mc *mem.Conn) {
		if !c.seen[mc] {
			c.seen[mc] = true
			c.conns = append(c.conns, mc)
		}
	}})
	c.cfg = Config{Members: ids, Start: StartNew, RingSize: 1 << 14, HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
	if mod != nil {
		mod(&c.cfg)
	}
	for _, id := range ids {
		n := &qnode{id: id, stable: &MemStable{}}
		c.nodes = append(c.nodes, n)
		c.boot(n)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n.up {
				n.r.Close()
				n.node.Close()
			}
		}
	})
	return c
}

func (c *qcluster) boot(n *qnode) {
	var err error
	if n.node, err = c.f.NewNode(n.id); err != nil {
		c.t.Fatal(err)
	}
	cfg := c.cfg
	cfg.Self = n.id
	cfg.Trace = func(format string, args ...any) {
		c.trace = append(c.trace, fmt.Sprintf(format, args...))
	}
	n.fsm = &logFSM{}
	if n.r, err = New(cfg, n.node, n.fsm, n.stable); err != nil {
		c.t.Fatal(err)
	}
	n.r.runPersist = func(fn func()) { fn() } // exact traces: the snapshot is ready at the next Poll
	n.up = true
}

func (c *qcluster) get(id rdma.NodeID) *qnode {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	c.t.Fatalf("no node %d", id)
	return nil
}

// crash stops node id; of its queued ops only the first keep of each Conn
// may still land.
func (c *qcluster) crash(id rdma.NodeID, keep int) {
	n := c.get(id)
	for _, mc := range c.conns {
		if mc.Initiator() == n.node {
			mc.DropPending(keep)
		}
	}
	n.up = false
	n.r.Close()
	n.node.Close()
	c.trace = append(c.trace, fmt.Sprintf("node %d crashes", id))
}

func (c *qcluster) pollAll() bool {
	progress := false
	for _, n := range c.nodes {
		if n.up && n.r.Poll(c.now) {
			progress = true
		}
	}
	return progress
}

// deliver lands every queued op on the conns allowed by ok (all if nil).
func (c *qcluster) deliver(ok func(from, to rdma.NodeID) bool) bool {
	progress := false
	for _, mc := range c.conns {
		if ok != nil && !ok(mc.Initiator().ID(), mc.Target().ID()) {
			continue
		}
		for mc.Deliver() {
			progress = true
		}
	}
	return progress
}

// settle advances the clock by one heartbeat interval (far below the
// election timeout), then polls and delivers until nothing moves.
func (c *qcluster) settle(ok func(from, to rdma.NodeID) bool) {
	c.now += c.cfg.HeartbeatInterval
	for i := 0; i < 10000; i++ {
		p := c.pollAll()
		if !c.deliver(ok) && !p {
			return
		}
	}
	c.t.Fatal("cluster did not settle")
}

func (c *qcluster) delivered(id rdma.NodeID) []string {
	var out []string
	for _, d := range c.get(id).fsm.seq {
		out = append(out, string(d))
	}
	return out
}

// loseLeader makes the followers ids time out on their leader (as if its
// heartbeat stopped an election timeout ago), polls them, and lands what
// they post: with the pre-vote they defer, and say to every member that
// they hear no leader, so that another member's vote may start.
func (c *qcluster) loseLeader(ok func(from, to rdma.NodeID) bool, ids ...rdma.NodeID) {
	for _, id := range ids {
		n := c.get(id)
		n.r.leaderHBAt = c.now - c.cfg.ElectionTimeout - 1
		n.r.Poll(c.now)
	}
	c.deliver(ok)
}

// newLeader reports whether a node leads an epoch above e.
func (c *qcluster) newLeader(e Epoch) bool {
	for _, n := range c.nodes {
		if s := n.r.Status(); n.up && s.Role == Leader && s.ECur > e {
			return true
		}
	}
	return false
}

func (c *qcluster) takeTrace() string {
	s := strings.Join(c.trace, "\n")
	c.trace = nil
	return s
}
