package kv

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// postLog records a reader's posts: which member, how many work requests
// in one call, and in which Poll pass.
type postLog struct {
	pass  int
	posts []postRec
	conns []*mem.Conn
}

// deliver lands and completes every op posted (queued mem fabric).
func (l *postLog) deliver() {
	for _, c := range l.conns {
		for c.Deliver() {
		}
	}
}

type postRec struct {
	member rdma.NodeID
	wrs    int
	pass   int
	single bool // Post, not PostList
}

type logNode struct {
	rdma.Node
	log *postLog
}

func (n *logNode) Connect(p rdma.NodeID) (rdma.Conn, error) {
	c, err := n.Node.Connect(p)
	if err != nil {
		return nil, err
	}
	n.log.conns = append(n.log.conns, c.(*mem.Conn))
	return &logConn{Conn: c, log: n.log}, nil
}

type logConn struct {
	rdma.Conn
	log *postLog
}

func (c *logConn) Post(wr rdma.WR) error {
	c.log.posts = append(c.log.posts, postRec{member: c.Peer(), wrs: 1, pass: c.log.pass, single: true})
	return c.Conn.Post(wr)
}

func (c *logConn) PostList(wrs []rdma.WR) (int, error) {
	c.log.posts = append(c.log.posts, postRec{member: c.Peer(), wrs: len(wrs), pass: c.log.pass})
	return c.Conn.PostList(wrs)
}

// TestGetPostsTogether pins how a get posts its reads: each round's
// independent reads go in one PostList per member, and a linearizable
// round's promise reads to other members in the same Poll pass as the
// round (nothing waits for the round's completion before asking):
//   - stale-ok, cached header fresh: round 1 (2 bucket pairs + the closing
//     header) in one list, then round 2 (the record);
//   - stale-ok, cached header older than FreshHeader: round 1 is the
//     opening header + pairs + closing header, still one list;
//   - linearizable, leader known: round 1 to the leader in one list and
//     f promise reads to other members, all in one pass, then the record.
func TestGetPostsTogether(t *testing.T) {
	f := mem.New(mem.Options{Queued: true}) // ops complete when the test delivers them, between passes
	for id := rdma.NodeID(1); id <= 3; id++ {
		n, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := NewTable(TableConfig{Readers: []rdma.NodeID{9}}, n)
		if err != nil {
			t.Fatal(err)
		}
		defer tb.Close()
		tb.Promise(5)
		if id == 1 {
			tb.SetServing(5)
		}
		tb.Apply(broadcast.Entry{Index: 1, Data: AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("k"), Value: []byte("v")}})})
	}
	rn, err := f.NewNode(9)
	if err != nil {
		t.Fatal(err)
	}
	log := &postLog{}
	r := NewGroupReader(&logNode{Node: rn, log: log}, 0, []rdma.NodeID{1, 2, 3}, 1)
	defer r.Close()
	get := func(mode Consistency, now time.Duration) []postRec {
		t.Helper()
		log.posts = log.posts[:0]
		r.Begin([]byte("k"), mode)
		for i := 0; ; i++ {
			log.pass++
			if r.Poll(now) {
				break
			}
			log.deliver()
			if i > 100000 {
				t.Fatalf("%v get did not finish", mode)
			}
		}
		res, err := r.Result()
		if err != nil || !res.Found || string(res.Value) != "v" || res.Retries != 0 {
			t.Fatalf("%v get: %+v %v", mode, res, err)
		}
		return append([]postRec(nil), log.posts...)
	}
	check := func(what string, got []postRec, want []postRec) {
		t.Helper()
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			g, w := got[i], want[i]
			ok = g.member == w.member && g.wrs == w.wrs && !g.single && g.pass-got[0].pass == w.pass
		}
		if !ok {
			t.Errorf("%s: posts %+v, want (member, work requests, passes after the first post) %+v", what, got, want)
		}
	}
	const second = time.Second
	// The reader's first stale-ok get reads its member's header alone
	// (no geometry known yet); then the first round.
	get(StaleOK, second)
	check("stale-ok, fresh header", get(StaleOK, second+FreshHeader/2),
		[]postRec{{member: 2, wrs: 3}, {member: 2, wrs: 1, pass: 1}})
	check("stale-ok, header not fresh", get(StaleOK, 2*second),
		[]postRec{{member: 2, wrs: 4}, {member: 2, wrs: 1, pass: 1}})
	get(Linearizable, 3*second) // finds the leader
	check("linearizable", get(Linearizable, 4*second),
		[]postRec{{member: 1, wrs: 3}, {member: 2, wrs: 1}, {member: 1, wrs: 1, pass: 1}})
}
