package shm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// Region is a registered region of an shm node: a file mapped by its owner
// and, lazily, by every peer that operates on it. It implements rdma.Region.
type Region struct {
	node *Node
	id   rdma.RegionID
	path string
	// target is the file in HugeDir that path links to ("" if path is
	// the file).
	target string
	file   []byte // the whole file: header, peer table, data, padding
	data   []byte

	mu     sync.Mutex // serialises Grant, Revoke and Close
	closed bool
	// undrained: peers whose last reduction of access timed out
	// (ErrRevokeTimeout), so an op the old grant allowed may still land.
	// A later Grant that does not widen their access drains again instead
	// of returning nil at once.
	undrained map[rdma.NodeID]bool
}

var _ rdma.Region = (*Region)(nil)

// ID implements rdma.Region.
func (r *Region) ID() rdma.RegionID { return r.id }

// Bytes implements rdma.Region. The slice is invalid after Close.
func (r *Region) Bytes() []byte { return r.data }

// Grant implements rdma.Region. Granting less than before (PermNone is
// Revoke) returns nil only when no op of peer that the old grant allowed
// can still land, and ErrRevokeTimeout otherwise; see Revoke. After such a
// timeout, granting the same or less again waits again (a retried Revoke
// returns nil only once the op drained); granting more forgets it.
func (r *Region) Grant(peer rdma.NodeID, p rdma.Perm) error {
	p &= rdma.PermReadWrite
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return rdma.ErrClosed
	}
	off := findSlot(r.file, regionSlots, peer)
	if off < 0 {
		if p == rdma.PermNone {
			return nil
		}
		return r.insertSlot(peer, p)
	}
	old := rdma.Perm(rdma.Load64(r.file, off+slotGrant))
	rdma.Store64(r.file, off+slotGrant, uint64(p))
	if old&^p == 0 && (!r.undrained[peer] || p&^old != 0) {
		delete(r.undrained, peer)
		return nil
	}
	if err := r.drain(peer, off); err != nil {
		if r.undrained == nil {
			r.undrained = map[rdma.NodeID]bool{}
		}
		r.undrained[peer] = true
		return err
	}
	delete(r.undrained, peer)
	return nil
}

// insertSlot gives peer a slot with grant p. Only the owner inserts, under
// r.mu; the key is published last, so a peer that finds its key sees the
// grant.
func (r *Region) insertSlot(peer rdma.NodeID, p rdma.Perm) error {
	for i, h := 0, slotHome(peer, regionSlots); i < regionSlots; i, h = i+1, (h+1)%regionSlots {
		off := regionTableOff + h*regionSlotSize
		if rdma.Load64(r.file, off+slotKey) == 0 {
			rdma.Store64(r.file, off+slotGrant, uint64(p))
			rdma.Store64(r.file, off+slotKey, slotKeyPresent|uint64(peer))
			return nil
		}
	}
	return fmt.Errorf("shm: node %d region %d: grant to node %d: peer table full (%d peers)", r.node.id, r.id, peer, regionSlots)
}

// drain waits, after the grant of the slot at off was reduced, until the
// peer has no op in flight or the process that announced it is gone. It
// gives up after the revoke timeout with ErrRevokeTimeout.
func (r *Region) drain(peer rdma.NodeID, off int) error {
	timeout := r.node.opts.revokeTimeout()
	start := time.Now()
	sleep := time.Duration(0)
	for i := 0; ; i++ {
		if rdma.Load64(r.file, off+slotInflight) == 0 {
			return nil
		}
		if i < 64 {
			runtime.Gosched() // a live peer's op takes nanoseconds
			continue
		}
		w := procIdent(rdma.Load64(r.file, off+slotWriter))
		if !w.alive() {
			// The process died mid-op; a successor of the same node id
			// resets the word before its first op (remoteRegion.claim).
			return nil
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("shm: node %d region %d: revoke node %d: live %v: %w after %v", r.node.id, r.id, peer, w, ErrRevokeTimeout, timeout)
		}
		sleep = min(max(2*sleep, 10*time.Microsecond), time.Millisecond)
		time.Sleep(sleep)
	}
}

// Revoke implements rdma.Region. It clears peer's grant at once, so every
// op of peer that starts after that fails with rdma.ErrPermission. Then it
// waits for the ops already in flight (announced in the peer's in-flight
// word before the grant was cleared): at most one window per Conn of peer
// to this node, each a run of consecutive work requests of one Post or
// PostList on this region.
//
//   - nil: every op in flight has finished or its process is dead (pid
//     gone, a zombie, or a new process with the same pid): no op of peer
//     lands any more.
//   - an error wrapping ErrRevokeTimeout: a live process of peer (e.g.
//     stopped by SIGSTOP, or never scheduled) kept an op in flight for the
//     whole revoke timeout, max(2*Options.PeerTimeout, 1s). The grant is
//     cleared, but those in-flight ops may still land, whenever that
//     process runs again. Revoke again to wait again: it returns nil only
//     once they drained. Or Close the region: this node's memory is then
//     unmapped, and what lands goes to the unlinked file only.
//   - rdma.ErrClosed: the region was closed (nothing lands in its memory).
func (r *Region) Revoke(peer rdma.NodeID) error { return r.Grant(peer, rdma.PermNone) }

// Close implements rdma.Region: peers' later ops fail with
// rdma.ErrNoRegion, the file is removed and the owner's mapping released.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	rdma.Store64(r.file, regionClosedW, 1)
	n := r.node
	n.mu.Lock()
	if n.regions[r.id] == r {
		delete(n.regions, r.id)
	}
	n.mu.Unlock()
	var errs []error
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("shm: remove region file: %w", err))
	}
	if r.target != "" {
		if err := os.Remove(r.target); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("shm: remove region file: %w", err))
		}
	}
	errs = append(errs, unix.Munmap(r.file))
	r.file, r.data = nil, nil
	return errors.Join(errs...)
}
