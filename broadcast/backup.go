package broadcast

import (
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Backup files (`kvserver backup`, docs/operations.md "Backup and
// restore") use the disk snapshot file format (snapstore.go): these are
// its encoder and decoder for other packages, and the meta of a new
// group's first snapshot.

// EncodeSnapFile lays out a snapshot file image: header (index, at,
// member, created), meta, state and the trailer's check word.
func EncodeSnapFile(index uint64, at MsgHdr, member uint64, created int64, meta, state []byte) []byte {
	return encodeSnapFile(index, at, member, time.Duration(created), meta, state)
}

// DecodeSnapFile checks a snapshot file image (header and trailer
// checksums, the check word over meta and state) and returns its parts,
// aliasing b. An image that fails a check is ErrSnapCorrupt.
func DecodeSnapFile(b []byte) (*DiskSnap, error) { return decodeSnapFile(b) }

// SnapCheckWord is the check word of a snapshot file image (its
// trailer's hash of meta and state), for a manifest; DecodeSnapFile
// verifies it.
func SnapCheckWord(img []byte) uint64 {
	if len(img) < snapHdrSize+snapTrlSize {
		return 0
	}
	t := img[len(img)-snapTrlSize:]
	return uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
		uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
}

// InitialSnapMeta is the snapshot meta of a group of members that has
// delivered index entries and whose FSM state is state, with no member's
// proposals and no keyed client recorded: the first snapshot of a new
// group started from a backup (kv.BackupImage).
func InitialSnapMeta(members []rdma.NodeID, index uint64, state []byte) []byte {
	return encodeSnapMeta(members, snapMeta{index: index, table: make([]tableRec, len(members)), size: uint64(len(state)), stateCheck: hashChunked(state)})
}
