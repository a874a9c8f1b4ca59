package shm

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/rdmakv/rdmakv/rdma"
)

// File names. Every file of a cluster starts with "rdmakv.<cluster>."; the
// cluster name has no dots, so the parts split unambiguously:
//
//	rdmakv.<cluster>.<node>.node             node file
//	rdmakv.<cluster>.<node>.<region>.region  region file of <node>
const filePrefix = "rdmakv."

var clusterRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func nodeFileName(cluster string, id rdma.NodeID) string {
	return fmt.Sprintf("%s%s.%d.node", filePrefix, cluster, id)
}

func regionFileName(cluster string, id rdma.NodeID, rid rdma.RegionID) string {
	return fmt.Sprintf("%s%s.%d.%d.region", filePrefix, cluster, id, rid)
}

// parseFileName reports whether name is a node or region file of cluster.
func parseFileName(cluster, name string) (node rdma.NodeID, isNode, isRegion bool) {
	rest, ok := strings.CutPrefix(name, filePrefix+cluster+".")
	if !ok {
		return 0, false, false
	}
	parts := strings.Split(rest, ".")
	num := func(s string) (uint32, bool) {
		v, err := strconv.ParseUint(s, 10, 32)
		return uint32(v), err == nil
	}
	switch {
	case len(parts) == 2 && parts[1] == "node":
		n, ok := num(parts[0])
		return rdma.NodeID(n), ok, false
	case len(parts) == 3 && parts[2] == "region":
		n, ok1 := num(parts[0])
		_, ok2 := num(parts[1])
		return rdma.NodeID(n), false, ok1 && ok2
	}
	return 0, false, false
}

// Node file layout (one page; every field a native-endian 8-byte word):
//
//	off  field
//	  0  magic   "RDMAKVND"
//	  8  version (1)
//	 16  node id
//	 24  owner  process identity: start time << 22 | pid (see procIdent)
//	 32  closed 1 once the node is closed; peers then fail with ErrPeerDead
//	 64  seq    doorbell ring count; FUTEX_WAIT/WAKE act on its low 32 bits
//	 72  parked number of doorbell waiters parked in FUTEX_WAIT
//	 80  woken  1 once a ring made a wake call; a waiter clears it when it
//	     announces its park (wakeOnce)
//	 88  features the owner's protocol features (featWakeOnce), written
//	     once with the header
//	     ... zero up to nodeFileSize
//
// magic, version, node id, owner and features are written once before
// the file gets its name (encodeNodeHeader); closed, seq, parked and
// woken are live words accessed only atomically.
//
// wakeOnce (featWakeOnce): a ring makes the wake call only if no ring
// made one since the last waiter announced its park. A ringer bumps seq,
// and if parked is not 0 and woken is 0, sets woken and wakes every
// waiter; a waiter adds itself to parked, clears woken, and looks at seq
// once more before it sleeps (all sequentially consistent). A ring that
// finds woken set comes after the last announce's clear, so that
// waiter's last look already sees its seq, or a wake call made after
// the clear wakes it. Without the feature (an owner built before it,
// which never clears woken) a ring wakes whenever parked is not 0. At 64
// writers 86% of a client's wake calls woke no thread: the poller was
// woken by the first message's ring and had not run yet.
const (
	nodeMagic     = 0x444e564b414d4452 // "RDMAKVND" little-endian
	regionMagic   = 0x47524b56414d4452 // "RDMAKVRG" little-endian
	layoutVersion = 1

	nodeFileSize = 4096
	nodeClosedW  = 32
	nodeSeqW     = 64
	nodeParkedW  = 72
	nodeWokenW   = 80
	nodeFeatW    = 88

	featWakeOnce = 1 // the owner's waiters clear woken (see above)
)

// nodeHeader is the static part of a node file.
type nodeHeader struct {
	id    rdma.NodeID
	owner procIdent
}

func encodeNodeHeader(b []byte, h nodeHeader) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], nodeMagic)
	le.PutUint64(b[8:], layoutVersion)
	le.PutUint64(b[16:], uint64(h.id))
	le.PutUint64(b[24:], uint64(h.owner))
	le.PutUint64(b[nodeFeatW:], nodeFeatures)
}

// nodeFeatures are the features this process's nodes announce (a test
// clears them to act as an owner built before them).
var nodeFeatures uint64 = featWakeOnce

// decodeNodeHeader validates and decodes the node file b (the whole file).
func decodeNodeHeader(b []byte) (nodeHeader, error) {
	le := binary.LittleEndian
	if len(b) != nodeFileSize {
		return nodeHeader{}, fmt.Errorf("%w: size %d, want %d", ErrCorrupt, len(b), nodeFileSize)
	}
	if m := le.Uint64(b[0:]); m != nodeMagic {
		return nodeHeader{}, fmt.Errorf("%w: bad magic %#x", ErrCorrupt, m)
	}
	if v := le.Uint64(b[8:]); v != layoutVersion {
		return nodeHeader{}, fmt.Errorf("%w: layout version %d, want %d", ErrCorrupt, v, layoutVersion)
	}
	id := le.Uint64(b[16:])
	if id > 0xFFFFFFFF {
		return nodeHeader{}, fmt.Errorf("%w: node id %d out of range", ErrCorrupt, id)
	}
	return nodeHeader{id: rdma.NodeID(id), owner: procIdent(le.Uint64(b[24:]))}, nil
}

// Region file layout: a header of regionDataOff bytes, then the region's
// size bytes (Region.Bytes), then, for a region on huge pages, padding to
// a multiple of the huge page size (huge.go). Words are native-endian
// 8-byte words.
//
//	off  field
//	  0  magic   "RDMAKVRG"
//	  8  version (1)
//	 16  size    data bytes (a multiple of 8)
//	 24  node id | region id << 32
//	 32  owner   process identity of the owning node's process
//	 40  closed  1 once the owner closed the region (peers: ErrNoRegion)
//	 48  slots   number of peer slots (regionSlots)
//	 56  dataOff offset of the data (regionDataOff)
//	 64  peer table: slots of 32 bytes, open addressing by peer id
//	     +0  key      0 = empty, else 1<<32 | peer id; set by the owner
//	                  only, never cleared, so a slot index stays valid
//	     +8  grant    rdma.Perm the owner grants the peer
//	     +16 inflight ops the peer has in progress on this region
//	     +24 writer   process identity of the peer process using inflight
//	dataOff  data
//
// Revocation handshake: a peer increments inflight, loads grant, touches
// the data only if grant allows, then decrements inflight. The revoker
// stores the new grant, then waits until inflight is 0 or the writer's
// process is gone. With sequentially consistent atomics either the peer's
// increment precedes the revoker's look at inflight (and the revoker waits
// for it) or the peer's grant load follows the revoker's store (and the
// peer sees the revocation).
const (
	regionClosedW   = 40
	regionTableOff  = 64
	regionSlotSize  = 32
	regionDataOff   = 32768
	regionSlots     = (regionDataOff - regionTableOff) / regionSlotSize
	slotKey         = 0
	slotGrant       = 8
	slotInflight    = 16
	slotWriter      = 24
	slotKeyPresent  = 1 << 32
	maxRegionLength = 1 << 40
)

// regionHeader is the static part of a region file.
type regionHeader struct {
	size    int
	node    rdma.NodeID
	region  rdma.RegionID
	owner   procIdent
	slots   int
	dataOff int
}

func encodeRegionHeader(b []byte, h regionHeader) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], regionMagic)
	le.PutUint64(b[8:], layoutVersion)
	le.PutUint64(b[16:], uint64(h.size))
	le.PutUint64(b[24:], uint64(h.node)|uint64(h.region)<<32)
	le.PutUint64(b[32:], uint64(h.owner))
	le.PutUint64(b[48:], uint64(h.slots))
	le.PutUint64(b[56:], uint64(h.dataOff))
}

// decodeRegionHeader validates and decodes the header b (at least its
// first regionTableOff bytes) of a region file of fileSize bytes, so that
// every later access within the header's bounds is safe.
func decodeRegionHeader(b []byte, fileSize int) (regionHeader, error) {
	le := binary.LittleEndian
	if len(b) < regionTableOff || fileSize < regionTableOff {
		return regionHeader{}, fmt.Errorf("%w: region file of %d bytes is too short", ErrCorrupt, fileSize)
	}
	if m := le.Uint64(b[0:]); m != regionMagic {
		return regionHeader{}, fmt.Errorf("%w: bad magic %#x", ErrCorrupt, m)
	}
	if v := le.Uint64(b[8:]); v != layoutVersion {
		return regionHeader{}, fmt.Errorf("%w: layout version %d, want %d", ErrCorrupt, v, layoutVersion)
	}
	size, ids := le.Uint64(b[16:]), le.Uint64(b[24:])
	slots, dataOff := le.Uint64(b[48:]), le.Uint64(b[56:])
	switch {
	// slots is bounded by what fits before dataOff (a division: slots *
	// regionSlotSize could wrap around 2^64 and pass a product check).
	case slots == 0 || dataOff > uint64(fileSize) || dataOff%8 != 0 || dataOff < regionTableOff || slots > (dataOff-regionTableOff)/regionSlotSize:
		return regionHeader{}, fmt.Errorf("%w: bad peer table (%d slots, data at %d)", ErrCorrupt, slots, dataOff)
	case size%8 != 0 || size > maxRegionLength || dataOff+size > uint64(fileSize) || uint64(fileSize)-(dataOff+size) >= hugePageSize:
		// The data ends inside the file; what follows it is at most the
		// padding of a region on huge pages (less than one huge page).
		return regionHeader{}, fmt.Errorf("%w: size %d and data offset %d do not match file size %d", ErrCorrupt, size, dataOff, fileSize)
	}
	return regionHeader{
		size:    int(size),
		node:    rdma.NodeID(ids),
		region:  rdma.RegionID(ids >> 32),
		owner:   procIdent(le.Uint64(b[32:])),
		slots:   int(slots),
		dataOff: int(dataOff),
	}, nil
}

// slotHome is the first slot probed for peer.
func slotHome(peer rdma.NodeID, slots int) int {
	return int((uint64(peer) * 0x9E3779B97F4A7C15 >> 32) % uint64(slots))
}

// findSlot returns the offset of peer's slot in the region file hdr, or -1.
// Keys are inserted by the owner only and never removed, so a probe that
// meets an empty slot proves absence at that moment.
func findSlot(hdr []byte, slots int, peer rdma.NodeID) int {
	key := slotKeyPresent | uint64(peer)
	for i, h := 0, slotHome(peer, slots); i < slots; i, h = i+1, (h+1)%slots {
		off := regionTableOff + h*regionSlotSize
		switch rdma.Load64(hdr, off+slotKey) {
		case key:
			return off
		case 0:
			return -1
		}
	}
	return -1
}
