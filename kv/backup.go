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
//
// The snapshot's header is BackupHeader(index), (0, index): epoch 0, as
// no epoch of the new group has run (a replica recovered from it has
// E_cur 0, at or below the E_new 0 of a member without stable state),
// and a count of index, so that the state is ordered after the empty
// one. The protocol tells states apart by their headers: at (0,0) a
// member that starts empty (a replica that rejoins because the other two
// elected before it started, kvserver's startMode) looked as far along as
// the restored ones, a leader synced it with a diff from (0,0) and no
// snapshot, and it followed with an empty table, and could lead (the
// whole group's state gone: TestBackupRestoreProcesses under load,
// TestRestoreRejoins). At (0, index) it is behind the pruned point
// (0, index) of every restored replica, which sends it its snapshot.
func BackupImage(cfg ReplicaConfig, member uint64, created int64, index uint64, table []byte) (name string, img []byte, err error) {
	if index == 0 {
		return "", nil, fmt.Errorf("kv: a backup at index 0")
	}
	state, err := multicast.InitialState(cfg.Multicast, index, table)
	if err != nil {
		return "", nil, err
	}
	meta := broadcast.InitialSnapMeta(cfg.Multicast.Members[cfg.Multicast.Group], index, state)
	at := BackupHeader(index)
	img = broadcast.EncodeSnapFile(index, at, member, created, meta, state)
	return broadcast.SnapName(index, at), img, nil
}

// BackupHeader is the header of a group restored at index (BackupImage):
// the last entry the restored state covers, (0, index).
func BackupHeader(index uint64) broadcast.MsgHdr { return broadcast.MsgHdr{Cnt: index} }
