package sim_test

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

// pinger writes an increasing counter into its peer's region every
// millisecond; the peer outputs each new value it sees.
type pinger struct {
	env  *sim.Env
	peer rdma.NodeID
	reg  rdma.Region
	conn rdma.Conn
	n    uint64
	next time.Duration
	seen uint64
}

func (p *pinger) Start(env *sim.Env) error {
	p.env = env
	r, err := env.Node().Register(1, 8)
	if err != nil {
		return err
	}
	p.reg = r
	if p.peer == 0 {
		return r.Grant(1, rdma.PermWrite) // the receiver
	}
	p.conn, err = env.Node().Connect(p.peer)
	return err
}

func (p *pinger) Step(now time.Duration) bool {
	if p.conn == nil { // receiver: poll own memory
		if v := rdma.Load64(p.reg.Bytes(), 0); v != p.seen {
			p.seen = v
			p.env.Output(v)
		}
		return false
	}
	var cs [4]rdma.Completion
	for k := p.conn.Poll(cs[:]); k > 0; k = p.conn.Poll(cs[:]) {
		for _, c := range cs[:k] {
			if c.Err != nil {
				p.env.Output(fmt.Sprintf("write failed: %v", c.Err))
			}
		}
	}
	if p.conn.Err() != nil { // broken: reconnect, as after an RC QP error
		c, err := p.env.Node().Connect(p.peer)
		if err != nil {
			return false
		}
		p.conn = c
	}
	if now >= p.next {
		p.n++
		buf := binary.LittleEndian.AppendUint64(nil, p.n)
		p.conn.Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Buf: buf})
		p.next = now + time.Millisecond
	}
	p.env.WakeAt(p.next)
	return false
}

// A scripted partition: node 1 writes to node 2 every millisecond; the link
// is cut from 2.5ms to 5ms, longer than the 1ms fabric timeout, so held
// writes fail with ErrPeerDead and break the Conn; node 1 reconnects and,
// once the link heals, its writes land again. The output is the same on
// every run.
func Example() {
	s := sim.New(sim.Options{Seed: 42, Tick: -1})
	defer s.Close()
	s.AddNode(1, func() sim.Process { return &pinger{peer: 2} })
	s.AddNode(2, func() sim.Process { return &pinger{} })
	s.Observe(func(ev sim.Event) {
		switch ev.Kind {
		case sim.EvOutput:
			fmt.Printf("%v node %d: %v\n", ev.Time.Round(100*time.Microsecond), ev.Node, ev.Value)
		case sim.EvCut, sim.EvHeal:
			fmt.Printf("%v link %d->%d %v\n", ev.Time.Round(100*time.Microsecond), ev.Node, ev.Peer, ev.Kind)
		}
	})
	s.At(2500*time.Microsecond, func() { s.Cut(1, 2) })
	s.At(5*time.Millisecond, func() { s.Heal(1, 2) })
	if err := s.RunUntil(7 * time.Millisecond); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 0s node 2: 1
	// 1ms node 2: 2
	// 2ms node 2: 3
	// 2.5ms link 1->2 cut
	// 4ms node 1: write failed: rdma: write node 2 region 1 [0,+8): rdma: peer unreachable or dead
	// 4ms node 1: write failed: rdma: write node 2 region 1 [0,+8): rdma: peer unreachable or dead
	// 5ms link 1->2 heal
	// 5ms node 2: 6
	// 6ms node 2: 7
}
