// Package hostregion is the region a fabric keeps in its own process's
// memory (mem and tcp): the bytes, the per-peer grants, and the one checked
// path by which a remote op touches them.
//
// Remote ops hold mu for reading while they check permission and bounds and
// touch memory; Grant, Revoke and closing take it for writing, so when
// Revoke returns no op of the revoked peer is being applied and none will be.
package hostregion

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmakv/rdmakv/rdma"
)

// Region is registered memory owned by this process. Fabrics embed it and
// add Close (which also unregisters the region from its node).
type Region struct {
	id     rdma.RegionID
	mu     sync.RWMutex
	mem    []byte // size rounded up to 8, from rdma.AllocMemory
	perms  map[rdma.NodeID]rdma.Perm
	closed bool
	gone   atomic.Bool // closed, readable without mu (for lookup caches)
}

// New allocates a zeroed region of size bytes, rounded up to 8.
func New(id rdma.RegionID, size int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma: region %d: size %d must be positive: %w", id, size, rdma.ErrInvalidOp)
	}
	mem, err := rdma.AllocMemory(rdma.Round8(size))
	if err != nil {
		return nil, err
	}
	return &Region{id: id, mem: mem, perms: make(map[rdma.NodeID]rdma.Perm)}, nil
}

// ID implements rdma.Region.
func (r *Region) ID() rdma.RegionID { return r.id }

// Bytes implements rdma.Region.
func (r *Region) Bytes() []byte { return r.mem }

// Grant implements rdma.Region.
func (r *Region) Grant(peer rdma.NodeID, p rdma.Perm) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("rdma: region %d: grant: %w", r.id, rdma.ErrClosed)
	}
	if p&rdma.PermReadWrite == rdma.PermNone {
		delete(r.perms, peer)
	} else {
		r.perms[peer] = p & rdma.PermReadWrite
	}
	return nil
}

// Revoke implements rdma.Region.
func (r *Region) Revoke(peer rdma.NodeID) error { return r.Grant(peer, rdma.PermNone) }

// Gone reports, without locking, whether the region was closed.
func (r *Region) Gone() bool { return r.gone.Load() }

// Apply checks and performs wr from peer from: the only path by which a
// remote op touches region memory.
func (r *Region) Apply(from rdma.NodeID, wr *rdma.WR) (uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return 0, rdma.ErrNoRegion
	}
	need := wr.NeedPerm()
	if r.perms[from]&need != need {
		return 0, rdma.ErrPermission
	}
	if !rdma.InBounds(wr.Offset, wr.Len(), len(r.mem)) {
		return 0, rdma.ErrBounds
	}
	if need == rdma.PermReadWrite && wr.Offset%8 != 0 {
		return 0, rdma.ErrUnaligned // a decoded remote frame skipped Post's check
	}
	return rdma.Apply(r.mem, wr), nil
}

// Shut makes later ops fail with ErrNoRegion but keeps the memory (a
// crashed node's queued writes may still read from it); Free releases it.
func (r *Region) Shut() {
	r.mu.Lock()
	r.closed = true
	r.gone.Store(true)
	r.mu.Unlock()
}

// Free shuts the region and releases its memory; later calls do nothing.
func (r *Region) Free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.gone.Store(true)
	if r.mem == nil {
		return nil
	}
	err := rdma.FreeMemory(r.mem)
	r.mem = nil
	return err
}
