package sim

import (
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// EventKind says what happened in an Event.
type EventKind uint8

// Event kinds. Op events (Post, Tear, Land, Complete, Fail, Drop) name the
// initiator in Node, the target in Peer, and the op by Conn and Seq.
const (
	// EvPost: Node posted an op on Conn; Seq is its position on the Conn.
	EvPost EventKind = iota + 1
	// EvTear: the first Len bytes of a write landed at Peer; the rest lands
	// later, and Peer may step in between (a torn write).
	EvTear
	// EvLand: the op reached Peer and took effect there (Err: it failed at
	// the target, or was flushed because an earlier op on the Conn failed).
	EvLand
	// EvComplete: the op's acknowledgement reached Node; Err is its
	// completion's error.
	EvComplete
	// EvFail: every op still queued on Conn, from Seq on, failed with Err
	// (the target died or a link stayed cut for the fabric timeout).
	EvFail
	// EvDrop: Node crashed; of the ops it had queued on Conn only those
	// before Seq may still land, Len ops were dropped.
	EvDrop
	// EvStep: Node's process stepped; Progress is what Step returned.
	EvStep
	// EvCrash: Node crashed (incarnation Value).
	EvCrash
	// EvRestart: Node booted a new incarnation (Value); Len is 1 if it got
	// its previous disk back, 0 if it starts with an empty disk.
	EvRestart
	// EvCut: the directed link Node -> Peer is cut.
	EvCut
	// EvHeal: the directed link Node -> Peer works again.
	EvHeal
	// EvSlow: Node's steps and ops are slowed by factor Value (1: normal).
	EvSlow
	// EvOutput: Node's process reported Value (Env.Output), e.g. a
	// delivered entry a checker looks at.
	EvOutput
	// EvPersist: Node wrote key Value (Len bytes) to its disk.
	EvPersist
	// EvHold: the read reached Peer and is held there to overlap Peer's
	// stores (Options.ReadOverlap); its EvLand comes at a Yield of Peer's
	// or when its span ends.
	EvHold
)

var kindNames = [...]string{
	EvPost: "post", EvTear: "tear", EvLand: "land", EvComplete: "complete",
	EvFail: "fail", EvDrop: "drop", EvStep: "step", EvCrash: "crash",
	EvRestart: "restart", EvCut: "cut", EvHeal: "heal", EvSlow: "slow",
	EvOutput: "output", EvPersist: "persist", EvHold: "hold",
}

// String returns the kind's name.
func (k EventKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one step of a simulation's trace, in the order it happened.
type Event struct {
	Time     time.Duration // virtual time
	Kind     EventKind
	Node     rdma.NodeID // the acting node (an op's initiator, a cut link's source)
	Peer     rdma.NodeID // the other node (an op's target, a cut link's destination)
	Conn     uint64      // op events: the connection, numbered from 1 in order of creation
	Seq      uint64      // op events: the op's position on its Conn, from 0
	Op       rdma.OpKind
	Region   rdma.RegionID
	Offset   uint64
	Len      int
	Err      error
	Progress bool // EvStep
	Value    any  // EvOutput, EvPersist, EvCrash, EvRestart, EvSlow
}

// String formats the event for a trace line.
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%12v %-8s n%d", e.Time, e.Kind, e.Node)
	switch e.Kind {
	case EvPost, EvTear, EvLand, EvHold:
		fmt.Fprintf(&b, "->n%d c%d#%d %s r%d[%d,+%d)", e.Peer, e.Conn, e.Seq, e.Op, e.Region, e.Offset, e.Len)
	case EvComplete:
		fmt.Fprintf(&b, "->n%d c%d#%d %s", e.Peer, e.Conn, e.Seq, e.Op)
	case EvFail, EvDrop:
		fmt.Fprintf(&b, "->n%d c%d from #%d", e.Peer, e.Conn, e.Seq)
		if e.Kind == EvDrop {
			fmt.Fprintf(&b, " dropped %d", e.Len)
		}
	case EvCut, EvHeal:
		fmt.Fprintf(&b, "->n%d", e.Peer)
	case EvStep:
		if e.Progress {
			b.WriteString(" progress")
		}
	case EvRestart:
		fmt.Fprintf(&b, " incarnation %v keep-disk=%v", e.Value, e.Len == 1)
	case EvPersist:
		fmt.Fprintf(&b, " %v (%d bytes)", e.Value, e.Len)
	default:
		if e.Value != nil {
			fmt.Fprintf(&b, " %v", e.Value)
		}
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " err=%v", e.Err)
	}
	return b.String()
}

// hash folds the event into h. Cheap fields are mixed directly; errors and
// values are formatted, which is rare (failures, outputs).
func (e *Event) hash(h uint64, scratch []byte) (uint64, []byte) {
	mix := func(h, x uint64) uint64 {
		h ^= x * 0x9e3779b97f4a7c15
		return bits.RotateLeft64(h, 27) * 0xbf58476d1ce4e5b9
	}
	h = mix(h, uint64(e.Time))
	h = mix(h, uint64(e.Kind)|uint64(e.Op)<<8|uint64(e.Node)<<16|uint64(e.Peer)<<40)
	h = mix(h, e.Conn<<32^e.Seq)
	h = mix(h, uint64(e.Region)<<32^uint64(e.Len))
	h = mix(h, e.Offset)
	if e.Progress {
		h = mix(h, 1)
	}
	if e.Err != nil || e.Value != nil {
		scratch = scratch[:0]
		if e.Err != nil {
			scratch = append(scratch, e.Err.Error()...)
		}
		if e.Value != nil {
			scratch = fmt.Appendf(scratch, "|%v", e.Value)
		}
		for _, c := range scratch {
			h = mix(h, uint64(c))
		}
	}
	return h, scratch
}
