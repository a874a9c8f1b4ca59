package btree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/regions"
)

// A group's ordered keyspace registers, at ids from regions.BTree(g):
//
//	BTree(g)+0       the header (hdrRegionSize bytes)
//	BTree(g)+1+k     arena chunk k (k < maxChunks): ChunkSlots node slots
//
// Slot s lies in chunk s / ChunkSlots at offset (s % ChunkSlots) *
// NodeSize. Slot 0 is never a node.
//
// Header (64 bytes, sealed by a check word; written after every node of
// the applies it reports), followed by the directory area (DirBytes: the
// group's tablets, directory.go) and the load area (LoadBytes: their
// write and key counts, load.go):
//
//	0       8           16        24       32       40 ... 56      64
//	[root  ][geometry  ][applied ][dirver ][ownver ][0    ][check ]
//
//	root      the root's node id
//	geometry  [node size u32][chunk slots u32]
//	applied   the index of the last apply whose node writes all precede
//	          this header: a node stamped at most applied holds its state
//	          as of applied (scans)
//	dirver    the version of the directory area written before it
//	ownver    the version of the keys the group serves (Store.OwnVersion:
//	          changes when a tablet leaves the group or is installed in
//	          it; a reader checks it around its node reads)
//	check     xxhash of words 0..6
const (
	hdrRegionSize = 64
	hRoot         = 0
	hGeometry     = 8
	hApplied      = 16
	hOwnVer       = 32
	hCheck        = 56
	maxChunks     = regions.BTreeIDs - 1
)

func headerRegion(g uint32) rdma.RegionID { return regions.BTree(g) }

func chunkRegion(g uint32, k int) rdma.RegionID { return regions.BTree(g) + 1 + rdma.RegionID(k) }

// Header is a decoded header.
type Header struct {
	Root       NodeID
	NodeSize   int
	ChunkSlots int
	Applied    uint64
	// DirVersion is the version of the group's tablets (the directory
	// area's).
	DirVersion uint64
	// OwnVersion is the version of the keys the group serves
	// (Store.OwnVersion).
	OwnVersion uint64
}

func (h Header) encode(b []byte) {
	le := binary.LittleEndian
	clear(b[:hdrRegionSize])
	le.PutUint64(b[hRoot:], uint64(h.Root))
	le.PutUint64(b[hGeometry:], uint64(uint32(h.NodeSize))|uint64(uint32(h.ChunkSlots))<<32)
	le.PutUint64(b[hApplied:], h.Applied)
	le.PutUint64(b[hDirVer:], h.DirVersion)
	le.PutUint64(b[hOwnVer:], h.OwnVersion)
	le.PutUint64(b[hCheck:], xxhash.Sum64(b[:hCheck]))
}

// DecodeHeader validates and decodes a header read one-sided.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < hdrRegionSize {
		return h, ErrTorn
	}
	le := binary.LittleEndian
	if xxhash.Sum64(b[:hCheck]) != le.Uint64(b[hCheck:]) {
		return h, ErrTorn
	}
	g := le.Uint64(b[hGeometry:])
	h = Header{Root: NodeID(le.Uint64(b[hRoot:])), NodeSize: int(uint32(g)), ChunkSlots: int(g >> 32), Applied: le.Uint64(b[hApplied:]), DirVersion: le.Uint64(b[hDirVer:]), OwnVersion: le.Uint64(b[hOwnVer:])}
	if h.NodeSize < MinNodeSize || h.NodeSize > MaxNodeSize || h.NodeSize%64 != 0 || h.ChunkSlots < 1 || h.Root == 0 {
		return h, ErrMalformed
	}
	return h, nil
}

// Regions is a group's tree in registered memory: the header region and
// the arena's chunks, each granted read access to the readers.
type Regions struct {
	node    rdma.Node
	group   uint32
	readers []rdma.NodeID
	hdr     rdma.Region
	chunks  []rdma.Region
	Arena   *Arena
}

// NewRegions registers group g's header on node and returns an arena
// whose chunks (chunkSlots slots of nodeSize bytes) it registers as the
// tree grows.
func NewRegions(node rdma.Node, g uint32, nodeSize, chunkSlots int, readers []rdma.NodeID) (*Regions, error) {
	r := &Regions{node: node, group: g, readers: readers}
	var err error
	if r.hdr, err = node.Register(headerRegion(g), regionLen); err != nil {
		return nil, fmt.Errorf("btree: register header: %w", err)
	}
	if err := r.grant(r.hdr); err != nil {
		r.Close()
		return nil, err
	}
	r.Arena = NewArena(nodeSize, chunkSlots, r.grow)
	return r, nil
}

func (r *Regions) grant(reg rdma.Region) error {
	for _, p := range r.readers {
		if p == r.node.ID() {
			continue
		}
		if err := reg.Grant(p, rdma.PermRead); err != nil {
			return fmt.Errorf("btree: grant node %d: %w", p, err)
		}
	}
	return nil
}

func (r *Regions) grow(n int) ([]byte, error) {
	k := len(r.chunks)
	if k >= maxChunks {
		return nil, fmt.Errorf("btree: group %d has all %d arena chunks", r.group, maxChunks)
	}
	reg, err := r.node.Register(chunkRegion(r.group, k), n)
	if err != nil {
		return nil, fmt.Errorf("btree: register arena chunk %d: %w", k, err)
	}
	if err := r.grant(reg); err != nil {
		reg.Close()
		return nil, err
	}
	r.chunks = append(r.chunks, reg)
	return reg.Bytes()[:n], nil
}

// Publish writes the header: the tree's root and geometry and the applied
// index all of whose node writes are done. The writer calls it after the
// last node write of an apply (or of a batch of them). With tablets not
// nil it first writes the directory area (the group's tablets at
// version dirVer).
func (r *Regions) Publish(t *Tree, applied, dirVer, ownVer uint64, tablets []Tablet) {
	b := r.hdr.Bytes()
	if tablets != nil {
		encodeDir(b[hdrRegionSize:regionLen], dirVer, tablets)
	}
	Header{Root: t.root, NodeSize: r.Arena.size, ChunkSlots: r.Arena.per, Applied: applied, DirVersion: dirVer, OwnVersion: ownVer}.encode(b)
}

// LocalDir decodes the directory area as this replica last published it
// (checks between simulator steps).
func (r *Regions) LocalDir() (uint64, []Tablet, error) {
	return DecodeDir(r.hdr.Bytes()[hdrRegionSize:regionLen])
}

// Close deregisters every region.
func (r *Regions) Close() error {
	if r.hdr != nil {
		r.hdr.Close()
	}
	for _, c := range r.chunks {
		c.Close()
	}
	return nil
}

// Remote reads a group's tree one-sided over one connection to a replica.
// It is used by one goroutine at a time.
type Remote struct {
	conn  rdma.Conn
	group uint32
	hdr   Header
	cs    [4]rdma.Completion
	hbuf  []byte
	// Timeout bounds one read; 0 means 1 s.
	Timeout time.Duration
}

// NewRemote reads over conn, to a replica of group g.
func NewRemote(conn rdma.Conn, g uint32) *Remote {
	return &Remote{conn: conn, group: g, hbuf: make([]byte, hdrRegionSize)}
}

// ErrReadTimeout: a one-sided read did not complete in time.
var ErrReadTimeout = errors.New("btree: read timed out")

func (r *Remote) read(reg rdma.RegionID, off uint64, buf []byte) error {
	if err := r.conn.Post(rdma.WR{Kind: rdma.OpRead, Flags: rdma.Signaled, Region: reg, Offset: off, Buf: buf}); err != nil {
		return err
	}
	d := r.Timeout
	if d == 0 {
		d = time.Second
	}
	deadline := time.Now().Add(d)
	for {
		if n := r.conn.Poll(r.cs[:1]); n > 0 {
			return r.cs[0].Err
		}
		if time.Now().After(deadline) {
			return ErrReadTimeout
		}
		r.conn.Wait(r.cs[:0], 50*time.Microsecond)
	}
}

// Header reads and validates the replica's header (it also learns the
// geometry that Read needs).
func (r *Remote) Header() (Header, error) {
	if err := r.read(headerRegion(r.group), 0, r.hbuf); err != nil {
		return Header{}, err
	}
	h, err := DecodeHeader(r.hbuf)
	if err == nil {
		r.hdr = h
	}
	return h, err
}

// Read is a ReadFunc: a fresh copy of the node slot, read one-sided.
func (r *Remote) Read(slot uint32) ([]byte, error) {
	if r.hdr.NodeSize == 0 {
		if _, err := r.Header(); err != nil {
			return nil, err
		}
	}
	per := uint32(r.hdr.ChunkSlots)
	buf := make([]byte, r.hdr.NodeSize)
	if err := r.read(chunkRegion(r.group, int(slot/per)), uint64(slot%per)*uint64(r.hdr.NodeSize), buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// Local decodes the header as this replica last published it and returns
// a ReadFunc over its own registered chunks: the bytes a one-sided read
// of this replica would return now (checks in a simulator, whose reads
// are events, read through it between steps).
func (r *Regions) Local() (Header, ReadFunc, error) {
	h, err := DecodeHeader(r.hdr.Bytes()[:hdrRegionSize])
	if err != nil {
		return h, nil, err
	}
	read := func(slot uint32) ([]byte, error) {
		per := uint32(r.Arena.per)
		if int(slot/per) >= len(r.chunks) {
			return nil, ErrNotNode
		}
		o := int(slot%per) * r.Arena.size
		return append([]byte(nil), r.chunks[slot/per].Bytes()[o:o+r.Arena.size]...), nil
	}
	return h, read, nil
}
