package btree

import "errors"

// ErrStale: a pointer led to a node that does not hold the key below its
// low fence, or to a node of the wrong level: the pointer came from a
// stale copy of the parent. A client drops that parent from its cache
// (Alg. 2 lines 9-12: one level) and descends again.
var ErrStale = errors.New("btree: stale pointer (node no longer holds the key)")

// ErrRetry: the read kept landing on nodes being written or moved; read
// again.
var ErrRetry = errors.New("btree: too many moves right; read again")

// maxSteps bounds the nodes one lookup reads: the height plus moves right.
const maxSteps = 64

// ReadFunc returns a copy of the bytes of a node slot (a one-sided read in
// a client; the arena itself in a process). The copy must not change while
// the caller decodes it.
type ReadFunc func(slot uint32) ([]byte, error)

// Lookup finds key by reading nodes from start (the root, or the deepest
// cached node whose fences hold key) at level want (-1: any), moving right
// through sibling links where a node's high fence is at or below key
// (Lehman-Yao), and down through children. Every node it uses validates
// (Decode) and holds key inside its fences; anything else is an error for
// the caller to act on (ErrTorn, ErrNotNode: read again; ErrStale: drop the
// pointer's source and descend again), never an answer. reads counts the
// nodes read.
func Lookup(read ReadFunc, start NodeID, key []byte) (e Entry, found bool, reads int, err error) {
	e, found, reads, _, err = noCache.descend(read, start, -1, key)
	return e, found, reads, err
}

// noCache is a cache of nothing: Lookup is a descent that caches nothing.
var noCache = NewCache(0)
