package btree

import (
	"slices"

	"github.com/rdmakv/rdmakv/kv/opwire"
)

// Memory-level parallelism in the apply (issue 18; kv's prefetch.go does
// the same for hashed keys). An insert's apply starts with a descent whose
// last step, the leaf's first load, is a TLB and cache miss: the leaves
// of a group's three trees are tens of MiB of 4 KiB pages, and an insert
// of a random key finds its leaf in no cache. Applied one after the other,
// a batch's inserts pay those misses in series (on this VM a dependent
// miss on a random page costs ~0.4-0.8 µs, the same loads made
// independent ~50 ns each).
//
// So before a batch entry's applies, the replica descends the inner nodes
// for every key of the batch (they are few and stay in cache), keeping
// each key's path, and then loads a word of each leaf's first lines in a
// loop of independent loads, so that the CPU overlaps the leaves' misses.
// The apply then runs as before, in order: its descent takes the kept
// path when no node write changed the tree's shape since (shape, below),
// and a put or a lookup, which need only the leaf, take the kept leaf
// when the leaf is still alive and its fences hold the key. Anything else
// descends from the root as before. Nothing else changes: every result
// and every node's bytes are what the apply without it gives
// (TestPrefetchSameBytes; planted prefetchIgnoreShape and
// prefetchSkipFence).

// maxPrefetch bounds the keys a batch keeps paths for; keys past it are
// descended in their apply as before.
const maxPrefetch = 1024

// maxPrePath is the longest path kept (a tree deeper than this descends
// in the apply as before): 4 KiB nodes hold a group's millions of keys in
// 4 levels.
const maxPrePath = 8

// prePath is a key's path from the root to its leaf, found before the
// batch's applies, and the shape of the tree it was found in.
type prePath struct {
	key   []byte // aliases the request (the log entry), valid for the batch
	shape uint64
	n     int // path[:n]; 0: not kept
	path  [maxPrePath]NodeID
}

// prefetchWindow bounds how far past the last path taken a descent looks
// for its key's (requests the apply skips leave their keys' paths
// unused).
const prefetchWindow = 16

// touchLines is how many of a leaf's first 64-byte lines the touch loads:
// the header (its used word, which the descent reads first), the fences,
// the offsets and the first entries, which the in-place put's copy of
// the leaf reads first; the hardware prefetcher streams the rest of the
// copy.
const touchLines = 4

// prefetch finds the paths of keys (the ops of a batch, in apply order)
// and touches their leaves, replacing the paths kept before. Fewer than
// two keys have nothing to overlap: none is kept.
func (t *Tree) prefetch(keys [][]byte) {
	t.pre = t.pre[:0]
	t.preCur = 0
	if len(keys) < 2 || t.knobs.noPrefetch {
		return
	}
	keys = keys[:min(len(keys), maxPrefetch)]
	t.pre = append(t.pre, make([]prePath, len(keys))...)
	for i, k := range keys {
		p := &t.pre[i]
		p.key, p.shape, p.n = k, t.shape, 1
		p.path[0] = t.root
	}
	// Level by level, all keys at once: first the lines of the level's
	// nodes that the keys' searches will read (the same few inner nodes
	// for many keys: each once), in loops of independent loads, then the
	// searches.
	var sink uint64
	level := int(leU16(t.a.bytes(t.root.Slot())[offLevel:]))
	for d := 0; level > 0; d, level = d+1, level-1 {
		if d+1 >= maxPrePath {
			for i := range t.pre {
				t.pre[i].n = 0 // too deep: descended in the apply
			}
			break
		}
		seen := t.preSeen[:0]
		for i := range t.pre {
			if id := t.pre[i].path[d]; !slices.Contains(seen, id) {
				seen = append(seen, id)
			}
		}
		t.preSeen = seen[:0]
		if d > 0 { // (the root is read by every descent: it is in cache)
			// (A node with a memo is searched in the memo: its lines
			// are not read.)
			k := 0
			for _, id := range seen {
				if !t.hasMemo(id) {
					seen[k] = id
					k++
				}
			}
			seen = seen[:k]
			for _, id := range seen {
				sink += uint64(t.a.bytes(id.Slot())[offUsed])
			}
			for _, id := range seen {
				b := t.a.bytes(id.Slot())
				for o := 64 + offUsed; o < int(leU16(b[offUsed:])); o += 64 {
					sink += uint64(b[o])
				}
			}
		}
		for i := range t.pre {
			p := &t.pre[i]
			p.path[d+1] = t.childFor(p.path[d], p.key)
			p.n = d + 2
		}
	}
	// The leaves' first lines, in a loop of a few instructions per load:
	// the CPU's reorder window then holds many keys' misses at once.
	for i := range t.pre {
		if p := &t.pre[i]; p.n > 0 {
			b := t.a.bytes(p.path[p.n-1].Slot())
			for l := range touchLines {
				sink += uint64(b[l*64+offUsed])
			}
		}
	}
	t.sink += sink
	t.prefetchedKeys += uint64(len(t.pre))
}

// prefetched is the kept path of key, nil if none: the paths are taken in
// the order they were kept, and a key looks at most prefetchWindow paths
// past the last one taken (a lookup and the put after it take the same).
func (t *Tree) prefetched(k []byte) *prePath {
	for i := t.preCur; i < len(t.pre) && i < t.preCur+prefetchWindow; i++ {
		if p := &t.pre[i]; string(p.key) == string(k) {
			t.preCur = i
			if p.n == 0 {
				return nil
			}
			return p
		}
	}
	return nil
}

// prefetchDone forgets the kept paths (their keys alias the batch's
// requests): called when the batch's applies are over.
func (t *Tree) prefetchDone() {
	clear(t.pre)
	t.pre = t.pre[:0]
	t.preCur = 0
}

// kept is the kept path of key k when its leaf is the leaf whose fences
// hold k (alive, a leaf, k within its fences: a split since may have
// moved k to a new node, which the fences say), nil otherwise; exact says
// that no write changed the tree's shape since it was kept, so the inner
// nodes on it are the descent's too (a split writes the parent: its
// path's parents may be stale). The key only finds the path: the leaf
// check alone decides whether it is used.
func (t *Tree) kept(k []byte) (path []NodeID, exact bool) {
	p := t.prefetched(k)
	if p == nil {
		return nil, false
	}
	id := p.path[p.n-1]
	n, err := decodeOwn(t.a.bytes(id.Slot()), id)
	if err != nil || !n.Leaf || n.Dead || !n.Covers(k) && !t.knobs.prefetchSkipFence {
		return nil, false
	}
	t.prefetchUsed++
	if p.shape != t.shape {
		t.prefetchLate++
	}
	return p.path[:p.n:p.n], p.shape == t.shape || t.knobs.prefetchIgnoreShape
}

// leafFor is the leaf whose fences hold k: the kept path's (kept), or a
// descent's. A put and a lookup need only the leaf; a split needs the
// path, which descend gives.
func (t *Tree) leafFor(k []byte) NodeID {
	if path, _ := t.kept(k); path != nil {
		return path[len(path)-1]
	}
	path := t.descend(k)
	return path[len(path)-1]
}

// Prefetch keeps the keys of an ordered request (a write request or a
// multi request; reads and control requests are left alone) for
// TouchBatch: kv.Table calls it for each ordered message of a batch entry
// before the batch's applies. data is the request as Apply will get it
// (a slice of the log entry, valid until the batch's Publish). It changes
// nothing the replica applies or publishes.
func (s *Store) Prefetch(data []byte) {
	if len(data) < 2 || data[0] != RequestFormat || data[1] != 0 && data[1] != FlagMulti {
		return
	}
	d, n, err := opwire.NewDecoder(data, RequestFormat, data[1], ErrMalformedRequest)
	if err != nil {
		return
	}
	for range n {
		h, err := d.Header()
		if err != nil || len(s.preKeys) >= maxPrefetch {
			return
		}
		key, _, _, err := d.Parts(h)
		if err != nil || len(key) == 0 {
			return
		}
		if h.Kind != OpGet && h.Kind != OpScan {
			s.preKeys = append(s.preKeys, key)
		}
	}
}

// TouchBatch finds the paths of the keys Prefetch kept and touches their
// leaves (Tree.prefetch), for the batch's applies that follow until
// Publish. With fewer than two keys it keeps none, and a multi request
// then touches its own.
func (s *Store) TouchBatch() {
	s.t.prefetch(s.preKeys)
	s.touched = len(s.t.pre) > 0
	if s.touched {
		s.work.PrefetchBatches++
	}
	clear(s.preKeys)
	s.preKeys = s.preKeys[:0]
}
