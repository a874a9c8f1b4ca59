package kv

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast"
)

// Backup markers (issue 19 D6, docs/operations.md "Backup and restore").
// `kvserver backup` multicasts one marker to every group of the cluster:
// TRAM delivers a message to several groups in one order that every group
// agrees with, so the index at which each group applies the marker is a
// consistent cut of the whole cluster (a request delivered to two groups
// is below the marker in both or above it in both). A replica applying
// the marker hands its table to TableConfig.OnBackup, which captures it
// (Table.Snapshot: the state after exactly the entries up to the
// marker's index) and writes the capture to a file off the polling
// goroutine.
//
//	[format u8 = 6][0 u8][0 u16][0 u32][id u64][expires u64]
//
// id names the backup; expires is a wall-clock time (Unix ns, 0: never)
// after which a replica applying the marker does not capture (a replica
// replaying its log long after the backup, or catching up, would write a
// file nobody fetches). The marker changes nothing in the table but its
// applied index; its result is a request's, StatusOK with Count 0 and
// Version index<<16.
const (
	backupFormat = 6
	backupSize   = 24
)

// BackupMarker is a decoded marker, with the index the group applies it
// at.
type BackupMarker struct {
	ID      uint64
	Expires int64 // Unix ns; 0: never
	Index   uint64
}

// AppendBackup appends the marker of backup id to dst.
func AppendBackup(dst []byte, id uint64, expires int64) []byte {
	var b [backupSize]byte
	b[0] = backupFormat
	binary.LittleEndian.PutUint64(b[8:], id)
	binary.LittleEndian.PutUint64(b[16:], uint64(expires))
	return append(dst, b[:]...)
}

// decodeBackup decodes a marker.
func decodeBackup(b []byte) (BackupMarker, error) {
	if len(b) != backupSize || b[0] != backupFormat || b[1] != 0 || binary.LittleEndian.Uint16(b[2:]) != 0 || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return BackupMarker{}, fmt.Errorf("%w: backup marker of %d bytes", ErrMalformed, len(b))
	}
	id := binary.LittleEndian.Uint64(b[8:])
	if id == 0 {
		return BackupMarker{}, fmt.Errorf("%w: backup marker with id 0", ErrMalformed)
	}
	return BackupMarker{ID: id, Expires: int64(binary.LittleEndian.Uint64(b[16:]))}, nil
}

// applyBackup applies a marker: it hands the table to OnBackup (which
// may capture it) and answers the index.
func (t *Table) applyBackup(index uint64, data []byte) []byte {
	m, err := decodeBackup(data)
	res := Result{Status: StatusOK, Version: index << 16}
	if err != nil {
		res = Result{Status: StatusMalformed}
	} else if t.cfg.OnBackup != nil {
		m.Index = index
		t.cfg.OnBackup(t, m)
	}
	t.requestDone()
	return encodeResult(t.res[:], &res)
}

// Applied is the index of the last entry the table applied (polling
// goroutine).
func (t *Table) Applied() uint64 { return t.applied }

// BackupImage turns a table snapshot taken at a backup marker (the bytes
// of Table.Snapshot's Persist, at index) into the disk snapshot file a
// replica of a new cluster starts from (broadcast.LoadNewest finds it in
// its data directory's snap/): the group's TRAM state as a new group's
// (no client registered, no message in flight: the marker's cut has none
// between groups) with its delivery count at index, so that versions keep
// growing, and the broadcast meta of a group that has delivered nothing
// yet. member is the replica the file is for; created its time (ns).
// It returns the file image and its name.
func BackupImage(cfg ReplicaConfig, member uint64, created int64, index uint64, table []byte) (name string, img []byte, err error) {
	if index == 0 {
		return "", nil, fmt.Errorf("kv: a backup at index 0")
	}
	state, err := multicast.InitialState(cfg.Multicast, index, table)
	if err != nil {
		return "", nil, err
	}
	meta := broadcast.InitialSnapMeta(cfg.Multicast.Members[cfg.Multicast.Group], index, state)
	img = broadcast.EncodeSnapFile(index, broadcast.MsgHdr{}, member, created, meta, state)
	return broadcast.SnapName(index, broadcast.MsgHdr{}), img, nil
}
