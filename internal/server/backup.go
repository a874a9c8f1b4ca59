package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// Backups, the replica side (docs/operations.md "Backup and restore";
// the tool's side is backuptool.go). A replica applying a backup marker
// (kv.BackupMarker) captures its table at the marker's index on the
// polling goroutine and writes the capture to backup-<id>-<node>.snap in its
// data directory (in memory mode without one: a temporary directory of
// the process, removed when it stops) from a goroutine, through a
// temporary file, synced and renamed. The control port serves it (GET
// /backup/<id>?group=G) and removes it (DELETE /backup/<id>, which also
// keeps a replica that applies the marker later from writing one).
// Leftover backup files of a replica are removed when it starts, and a
// file nobody removed is removed when its marker expires (the tool's
// timeout).

// BackupMeta is the meta part of a backup file (JSON): what the file is
// a backup of.
type BackupMeta struct {
	Cluster string      `json:"cluster"`
	Backup  uint64      `json:"backup"`
	Group   int         `json:"group"`
	Index   uint64      `json:"index"`
	Node    rdma.NodeID `json:"node"`
}

// backupFile is one backup file of a replica of the process.
type backupFile struct {
	group int
	node  rdma.NodeID
	path  string
	index uint64
	done  bool  // written and renamed into place
	err   error // the write failed
}

// backups is a process's backup files.
type backups struct {
	cluster string
	dirOf   func(id rdma.NodeID) string // nil: no data dirs (a temp dir)
	log     *slog.Logger
	knobs   backupKnobs

	mu    sync.Mutex
	tmp   string // the temp dir, once made
	files map[uint64][]*backupFile
	gone  map[uint64]bool // removed (DELETE): not written again
	wg    sync.WaitGroup
}

// backupKnobs are the planted bugs of the backup tests.
type backupKnobs struct {
	// lateGroup (>= 0 when set, as lateGroup+1): that group's replicas
	// capture at the first Poll after they applied an entry beyond the
	// marker, not at the marker, and still say the marker's index:
	// TestBackupCut's cut check must catch it.
	lateGroup int
}

func newBackups(cluster string, dirOf func(rdma.NodeID) string, log *slog.Logger) *backups {
	return &backups{cluster: cluster, dirOf: dirOf, log: log, files: map[uint64][]*backupFile{}, gone: map[uint64]bool{}}
}

const backupPrefix = "backup-"

// sweep removes the backup files (finished or not) an earlier run of
// replica id left in its data directory.
func (b *backups) sweep(id rdma.NodeID) {
	if b.dirOf == nil {
		return
	}
	dir := b.dirOf(id)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), backupPrefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// dir is where replica id writes its backup files.
func (b *backups) dir(id rdma.NodeID) (string, error) {
	if b.dirOf != nil {
		return b.dirOf(id), nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tmp == "" {
		d, err := os.MkdirTemp("", "rdmakv-backup-")
		if err != nil {
			return "", err
		}
		b.tmp = d
	}
	return b.tmp, nil
}

// marker is the OnBackup hook of replica sr: it captures the table now
// (or, with the lateGroup knob, later: sr.pendingBackup) and writes it.
func (b *backups) marker(sr *Replica, t *kv.Table, m kv.BackupMarker) {
	if m.Expires != 0 && time.Now().UnixNano() > m.Expires {
		b.log.Debug("backup marker expired: no capture", "backup", m.ID, "group", sr.Group, "node", sr.Node, "index", m.Index)
		return
	}
	b.mu.Lock()
	gone := b.gone[m.ID]
	b.mu.Unlock()
	if gone {
		return
	}
	if b.knobs.lateGroup == sr.Group+1 {
		sr.pendingBackup = append(sr.pendingBackup, m)
		return
	}
	b.capture(sr, t, m)
}

// afterPoll runs the captures the lateGroup knob put off.
func (b *backups) afterPoll(sr *Replica) {
	t := sr.r.Table()
	k := 0
	for _, m := range sr.pendingBackup {
		if t.Applied() > m.Index {
			b.capture(sr, t, m)
			continue
		}
		sr.pendingBackup[k] = m
		k++
	}
	sr.pendingBackup = sr.pendingBackup[:k]
}

// capture snapshots t (polling goroutine) and writes the file from a
// goroutine.
func (b *backups) capture(sr *Replica, t *kv.Table, m kv.BackupMarker) {
	f := &backupFile{group: sr.Group, node: sr.Node, index: m.Index}
	dir, err := b.dir(sr.Node)
	if err == nil {
		f.path = filepath.Join(dir, fmt.Sprintf("%s%016x-%d.snap", backupPrefix, m.ID, sr.Node))
	}
	b.mu.Lock()
	b.files[m.ID] = append(b.files[m.ID], f)
	b.mu.Unlock()
	if err != nil {
		b.finish(m.ID, f, err)
		return
	}
	c, err := t.Snapshot()
	if err != nil {
		b.finish(m.ID, f, err)
		return
	}
	meta, _ := json.Marshal(BackupMeta{Cluster: b.cluster, Backup: m.ID, Group: sr.Group, Index: m.Index, Node: sr.Node})
	b.log.Info("backup: captured the table", "backup", m.ID, "group", sr.Group, "node", sr.Node, "index", m.Index, "bytes", c.Size())
	b.wg.Go(func() {
		defer c.Release()
		state := make([]byte, c.Size())
		err := c.Persist(state)
		if err == nil {
			img := broadcast.EncodeSnapFile(m.Index, broadcast.MsgHdr{}, uint64(sr.Node), time.Now().UnixNano(), meta, state)
			err = writeFileSync(f.path, img)
		}
		b.finish(m.ID, f, err)
		if err == nil && m.Expires != 0 {
			// Nobody fetches it after the backup's timeout (a replica
			// that applied the marker late, after the tool's DELETE
			// reached its process): remove it then.
			time.AfterFunc(time.Until(time.Unix(0, m.Expires)), func() { b.expire(m.ID, f) })
		}
	})
}

// expire removes one file of backup id once its backup timed out.
func (b *backups) expire(id uint64, f *backupFile) {
	b.mu.Lock()
	fs := b.files[id]
	for i, x := range fs {
		if x == f {
			b.files[id] = append(fs[:i:i], fs[i+1:]...)
			break
		}
	}
	b.mu.Unlock()
	os.Remove(f.path)
}

// finish records a write's end; a file written after its backup was
// removed is removed too.
func (b *backups) finish(id uint64, f *backupFile, err error) {
	b.mu.Lock()
	f.done, f.err = err == nil, err
	gone := b.gone[id]
	b.mu.Unlock()
	if err != nil {
		b.log.Warn("backup: writing the file failed", "backup", id, "group", f.group, "node", f.node, "err", err)
		if f.path != "" {
			os.Remove(f.path + ".tmp")
		}
	}
	if gone && f.path != "" {
		os.Remove(f.path)
	}
}

// find returns (a copy of) the backup file of id written by a replica
// of group g here: a finished one first; else one being written, or one
// that failed (ok false: none).
func (b *backups) find(id uint64, g int) (backupFile, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var any *backupFile
	for _, f := range b.files[id] {
		if f.group != g {
			continue
		}
		if f.done {
			return *f, true
		}
		if any == nil || f.err == nil {
			any = f
		}
	}
	if any == nil {
		return backupFile{}, false
	}
	return *any, true
}

// remove removes backup id's files and keeps it from being written again.
func (b *backups) remove(id uint64) int {
	b.mu.Lock()
	b.gone[id] = true
	var paths []string // the finished files; finish removes the others
	for _, f := range b.files[id] {
		if f.done {
			paths = append(paths, f.path)
		}
	}
	delete(b.files, id)
	b.mu.Unlock()
	n := 0
	for _, p := range paths {
		if os.Remove(p) == nil {
			n++
		}
	}
	return n
}

// close waits for the writes under way and removes the temp dir.
func (b *backups) close() {
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
		b.tmp = ""
	}
}

// BackupAuth is the ForceAuthHeader value of a request for backup id's
// files (GET and DELETE /backup/<id>) with the cluster secret.
func BackupAuth(secret []byte, id uint64) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "rdmakv backup id=%d", id)
	return hex.EncodeToString(m.Sum(nil))
}

// serveBackup is GET and DELETE /backup/{id}.
func serveBackup(w http.ResponseWriter, r *http.Request, b *backups, secret []byte) {
	if b == nil {
		http.Error(w, "backup: this process takes no backups", http.StatusNotFound)
		return
	}
	id, err := strconv.ParseUint(r.PathValue("id"), 16, 64)
	if err != nil || id == 0 {
		http.Error(w, "backup: want /backup/<id> with the id in hex", http.StatusBadRequest)
		return
	}
	if len(secret) > 0 && !hmac.Equal([]byte(BackupAuth(secret, id)), []byte(r.Header.Get(ForceAuthHeader))) {
		http.Error(w, "backup: the cluster has a secret: send its proof in "+ForceAuthHeader+" (kvserver backup --config does)", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodDelete {
		fmt.Fprintf(w, "removed %d files\n", b.remove(id))
		return
	}
	g, err := strconv.Atoi(r.URL.Query().Get("group"))
	if err != nil {
		http.Error(w, "backup: want ?group=G", http.StatusBadRequest)
		return
	}
	f, ok := b.find(id, g)
	switch {
	case !ok:
		http.Error(w, fmt.Sprintf("backup %x: no replica of group %d here has applied its marker", id, g), http.StatusNotFound)
		return
	case f.err != nil:
		http.Error(w, fmt.Sprintf("backup %x: node %d failed to write it: %v", id, f.node, f.err), http.StatusInternalServerError)
		return
	case !f.done:
		http.Error(w, fmt.Sprintf("backup %x: node %d is writing it", id, f.node), http.StatusServiceUnavailable)
		return
	}
	fh, err := os.Open(f.path)
	if err != nil {
		http.Error(w, fmt.Sprintf("backup %x: %v", id, err), http.StatusNotFound)
		return
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		http.Error(w, fmt.Sprintf("backup %x: %v", id, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	w.Header().Set("X-Rdmakv-Node", fmt.Sprint(f.node))
	io.Copy(w, fh)
}

// errNoBackup: a group's file could not be fetched from any replica.
var errNoBackup = errors.New("no replica served its backup file")
