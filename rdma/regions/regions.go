// Package regions is the one scheme that hands out rdma region ids to the
// layers of rdmakv. Every region a layer registers has its id from a
// function here; no package computes region ids of another layer.
//
// It belongs to rdma, the layer below every protocol: it imports only
// rdma, so broadcast, multicast, kv, clients and benchmarks all take their
// ids from it and no layer imports one above it to learn them.
//
// A node (an rdma.Node: one process, or one simulated host) owns regions
// of three kinds, in disjoint ranges of the 32-bit id space:
//
//	0x0000_0000 .. 0x0000_FFFF   reserved: tests, the fabric benchmarks,
//	                             and broadcast's single-group default
//	                             (broadcast.DefaultRegionBase = 0x1000)
//	0x0001_0000 .. 0x000F_FFFF   client regions: Client(k), k < 1<<20 - 1<<16
//	0x0010_0000 ..               group blocks: Group(g), 1024 ids per group
//
// A group block of 1024 ids is split between the layers that run the group:
//
//	Group(g) + 0    .. + 383     broadcast (Acuerdo): SST, rings, snapshots
//	                             (n+5 ids for n members: n <= 255 fits)
//	Group(g) + 384  .. + 511     btree: the ordered keyspace's header and
//	                             node arena chunks
//	Group(g) + 512  .. + 767     multicast (TRAM): input rings, credits
//	Group(g) + 768  .. + 1023    kv: the table's index and heap regions
//
// Several groups may run on one node (the embedded cluster); their blocks
// never overlap, so their regions do not collide.
package regions

import (
	"fmt"

	"github.com/rdmakv/rdmakv/rdma"
)

const (
	clientBase rdma.RegionID = 0x0001_0000
	groupBase  rdma.RegionID = 0x0010_0000
	// GroupBlock is the number of ids each group has.
	GroupBlock = 1024
	// MaxGroup is the largest group id the scheme has room for.
	MaxGroup = (1<<32-uint64(groupBase))/GroupBlock - 1
	// MaxClient is the largest client region index.
	MaxClient = uint32(groupBase-clientBase) - 1

	broadcastOff = 0
	btreeOff     = 384
	multicastOff = 512
	kvOff        = 768
	// BroadcastIDs, BTreeIDs, MulticastIDs and KVIDs are the numbers of
	// ids broadcast, btree, multicast and kv each have in a group block:
	// 384, 128, 256 and 256.
	BroadcastIDs = btreeOff - broadcastOff
	BTreeIDs     = multicastOff - btreeOff
	MulticastIDs = kvOff - multicastOff
	KVIDs        = GroupBlock - kvOff
)

// Group is the first id of group g's block.
func Group(g uint32) rdma.RegionID {
	if uint64(g) > MaxGroup {
		panic(fmt.Sprintf("regions: group %d beyond %d", g, MaxGroup))
	}
	return groupBase + rdma.RegionID(g)*GroupBlock
}

// Broadcast is the RegionBase of group g's Acuerdo instance
// (broadcast.Config.RegionBase).
func Broadcast(g uint32) rdma.RegionID { return Group(g) + broadcastOff }

// BTree is the first of the BTreeIDs ids group g's ordered keyspace uses.
func BTree(g uint32) rdma.RegionID { return Group(g) + btreeOff }

// Multicast is the first of the MulticastIDs ids group g's TRAM replica
// uses.
func Multicast(g uint32) rdma.RegionID { return Group(g) + multicastOff }

// KV is the first of the KVIDs ids group g's table uses.
func KV(g uint32) rdma.RegionID { return Group(g) + kvOff }

// Client is the id of the k-th client region of a node (a client's reply
// region, for instance).
func Client(k uint32) rdma.RegionID {
	if k > MaxClient {
		panic(fmt.Sprintf("regions: client region %d beyond %d", k, MaxClient))
	}
	return clientBase + rdma.RegionID(k)
}
