package kv

import "github.com/rdmakv/rdmakv/btree"

// The ordered keyspace's hook (issue 18; package btree implements it):
// a Table routes the requests whose format byte is OrderedFormat to its
// Ordered part, publishes that part's header once per batch as it does
// its own, and carries the part's section in its snapshots. The Table
// knows nothing of trees: the part decodes its requests and encodes their
// results (btree/request.go reuses this package's op encoding and result
// layout), and package kv does not import btree.

// OrderedFormat is the format byte of ordered requests (btree.RequestFormat).
const OrderedFormat = 5

// Statuses of an ordered request's result besides kv's four (btree's
// StatusMoved and StatusMixed).
const (
	// StatusMoved: an op's key (Result.FailedOp) is in no key range this
	// group owns; nothing applied. Refresh the directory and send again.
	StatusMoved = 4
	// StatusMixed: the request mixes ops on hashed and ordered keys;
	// nothing applied.
	StatusMixed = 5
	// StatusMoving: an op's key is in a tablet frozen for a move to
	// another group; nothing applied. Wait and send again (after
	// reading the directory again).
	StatusMoving = 6

	maxStatus = StatusMoving
)

// Ordered is the ordered part of a replica's state (btree.Store), called
// on the polling goroutine.
type Ordered interface {
	// Apply applies an ordered request delivered as entry index and
	// returns its result.
	Apply(index uint64, data []byte) []byte
	// Publish makes the part's header say that every entry up to
	// applied is applied (its node writes done).
	Publish(applied uint64)
	// CaptureSection captures the part's snapshot section at this
	// point: quick (the polling goroutine waits for it), its Persist
	// runs later on another goroutine while Apply goes on, and writes
	// the section of the state at capture.
	CaptureSection() OrderedCapture
	// Restore validates a section (nil: empty) and returns the commit
	// that installs it, called once nothing else of the restore can
	// fail; b stays unchanged until then.
	Restore(b []byte) (commit func(applied uint64), err error)
}

// OrderedCapture is an ordered part's capture (btree.SectionCapture):
// its section's Size now, Persist (once, any goroutine) later, Release
// when done.
type OrderedCapture = interface {
	Size() int
	Persist(dst []byte) error
	Release()
}

// applyOrdered routes an ordered request, or refuses it as malformed if
// the table has no ordered part.
func (t *Table) applyOrdered(index uint64, data []byte) []byte {
	if t.cfg.Ordered == nil {
		res := Result{Status: StatusMalformed}
		t.requestDone()
		return encodeResult(t.res[:], &res)
	}
	out := t.cfg.Ordered.Apply(index, data)
	if !t.batching && !t.knobs.skipOrderedPublish {
		t.cfg.Ordered.Publish(t.applied)
	}
	t.requestDone()
	return out
}

// OrderedPart is the table's ordered part (nil: none).
func (t *Table) OrderedPart() Ordered { return t.cfg.Ordered }

// orderedStater is an ordered part that reports its size and work
// (btree.Store does).
type orderedStater interface{ Stats() btree.StoreStats }

// orderedStats is the ordered part's size and work for Stats (nil: no
// ordered part, or one that reports none).
func (t *Table) orderedStats() *btree.StoreStats {
	if o, ok := t.cfg.Ordered.(orderedStater); ok {
		st := o.Stats()
		return &st
	}
	return nil
}
