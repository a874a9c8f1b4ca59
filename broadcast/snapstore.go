package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/internal/reuse"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/wal"
)

// Disk snapshots (docs/dev/durability-plan.md §3.1, stage D3). A snapshot
// file is snap/<index %016x>-<E %016x>-<Cnt %016x>.snap:
//
//	 0 "RKVS" u32 | 4 version u16 | 6 flags u16 | 8 index u64 | 16 commit E u64
//	24 commit Cnt u64 | 32 meta len u64 | 40 state len u64 | 48 member u64
//	56 created ns u64 | 64 crc32c of bytes 0..64 u32 | 68 zero u32
//	72 meta (the network meta region's bytes), padded to 8
//	   state (FSMSnapshot.Persist's bytes), padded to 8
//	end-16 [xxhash(meta‖state) u64]["RKVE" u32][crc32c of the trailer's first 12 bytes u32]
//
// It is written as snap/tmp-<n>: create, write, fdatasync, rename, fsync
// snap/; only then is it the newest snapshot (and the log below it may be
// dropped). Older snapshots are removed after that; snapshots above it
// (by header: it was installed by a diff over state they held) are
// removed before it counts, unlink and dir fsync (SaveImage). LoadFor
// reads the newest file by header whose checks hold, except one that the
// log's last install replaced (removed); a failing one is renamed
// <name>.broken.

const (
	snapMagic    = 0x53564b52 // "RKVS" little-endian
	snapEndMagic = 0x45564b52 // "RKVE"
	snapVersion  = 1
	snapHdrSize  = 72
	snapTrlSize  = 16
)

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapCorrupt: a snapshot file failed one of its checks.
var ErrSnapCorrupt = errors.New("broadcast: snapshot file corrupt")

// DiskSnap is a snapshot read back from disk.
type DiskSnap struct {
	Path   string
	Index  uint64 // the commit index the snapshot covers
	At     MsgHdr // the header of the last entry it covers
	Member uint64
	Meta   []byte // the network meta region's bytes
	State  []byte // the FSM's bytes
	// Older are the older snapshot files LoadFor found beside it (a
	// crash came before their removal); NewSnapStore removes them after
	// its first save.
	Older []string

	// img is the file image Meta and State alias, and pool the pool it
	// came from (LoadForReuse): Recovery.release gives it back.
	img  []byte
	pool *reuse.Pool
}

// recycle gives the snapshot's image back to its pool (LoadForReuse):
// nothing may read Meta or State after.
func (s *DiskSnap) recycle() {
	if s != nil && s.pool != nil {
		s.pool.Put(s.img)
		s.img, s.pool, s.Meta, s.State = nil, nil, nil, nil
	}
}

// SnapName is the file name of the snapshot at index/at.
func SnapName(index uint64, at MsgHdr) string {
	return fmt.Sprintf("%016x-%016x-%016x.snap", index, uint64(at.E), at.Cnt)
}

func pad8(n int) int { return (n + 7) &^ 7 }

// encodeSnapFile lays out the whole file image.
func encodeSnapFile(index uint64, at MsgHdr, member uint64, created time.Duration, meta, state []byte) []byte {
	b, st := snapImage(len(meta), len(state))
	copy(st, state)
	sealSnapImage(b, len(state), index, at, member, created, meta)
	return b
}

// snapImage allocates a file image for a meta of metaLen bytes and a
// state of stateLen, and returns it with its state's bytes: a capture
// persists straight into them (no copy of the state into the image).
func snapImage(metaLen, stateLen int) (img, state []byte) {
	return snapImageInto(nil, metaLen, stateLen, false)
}

// snapImageInto is snapImage in spare, the image of an earlier save that
// the store is done with, when it fits and is not more than twice the
// size (then the smaller one is made, so that a shrunk state gives the
// memory back); a fresh image gets an eighth more room, so that the next
// saves of a growing state still fit. What the state's Persist and
// sealSnapImage do not write (the header's and meta's padding, the
// state's) is cleared, so that the file's bytes do not depend on the
// buffer.
// (noClear: the planted bug knobs.snapImgNoClear.)
func snapImageInto(spare []byte, metaLen, stateLen int, noClear bool) (img, state []byte) {
	ml := pad8(metaLen)
	n := snapHdrSize + ml + pad8(stateLen) + snapTrlSize
	if cap(spare) >= n && cap(spare) <= 2*n+snapReserve {
		img = spare[:n]
		if !noClear {
			clear(img[:snapHdrSize+ml])
			clear(img[snapHdrSize+ml+stateLen:])
		}
	} else {
		img = make([]byte, n, n+n/8)
	}
	return img, img[snapHdrSize+ml : snapHdrSize+ml+stateLen]
}

// snapReserve lets a small state keep its spare image (the bound above).
const snapReserve = 1 << 20

// sealSnapImage writes the header, the meta and the trailer of an image
// snapImage made for meta and a state of stateLen bytes, once the state
// is written.
func sealSnapImage(b []byte, stateLen int, index uint64, at MsgHdr, member uint64, created time.Duration, meta []byte) {
	ml := pad8(len(meta))
	state := b[snapHdrSize+ml : snapHdrSize+ml+stateLen]
	le := binary.LittleEndian
	le.PutUint32(b[0:], snapMagic)
	le.PutUint16(b[4:], snapVersion)
	le.PutUint64(b[8:], index)
	le.PutUint64(b[16:], uint64(at.E))
	le.PutUint64(b[24:], at.Cnt)
	le.PutUint64(b[32:], uint64(len(meta)))
	le.PutUint64(b[40:], uint64(len(state)))
	le.PutUint64(b[48:], member)
	le.PutUint64(b[56:], uint64(created))
	le.PutUint32(b[64:], crc32.Checksum(b[:64], snapCRC))
	copy(b[snapHdrSize:], meta)
	t := b[len(b)-snapTrlSize:]
	le.PutUint64(t[0:], snapHash(meta, state))
	le.PutUint32(t[8:], snapEndMagic)
	le.PutUint32(t[12:], crc32.Checksum(t[:12], snapCRC))
}

func snapHash(meta, state []byte) uint64 {
	d := xxhash.New()
	for _, p := range [][]byte{meta, state} {
		for len(p) > 0 { // chunked, as hashChunked
			n := min(len(p), 1<<20)
			d.Write(p[:n])
			p = p[n:]
			runtime.Gosched()
		}
	}
	return d.Sum64()
}

// decodeSnapFile checks a file image and returns its parts (aliasing b).
func decodeSnapFile(b []byte) (*DiskSnap, error) {
	le := binary.LittleEndian
	bad := func(why string) (*DiskSnap, error) { return nil, fmt.Errorf("%w: %s", ErrSnapCorrupt, why) }
	if len(b) < snapHdrSize+snapTrlSize {
		return bad(fmt.Sprintf("%d bytes, shorter than a header and trailer", len(b)))
	}
	if le.Uint32(b[0:]) != snapMagic {
		return bad("bad magic")
	}
	if le.Uint32(b[64:]) != crc32.Checksum(b[:64], snapCRC) {
		return bad("header checksum mismatch")
	}
	if v := le.Uint16(b[4:]); v != snapVersion {
		return bad(fmt.Sprintf("version %d", v))
	}
	mlen, slen := le.Uint64(b[32:]), le.Uint64(b[40:])
	if mlen > uint64(len(b)) || slen > uint64(len(b)) ||
		uint64(snapHdrSize+pad8(int(mlen))+pad8(int(slen))+snapTrlSize) != uint64(len(b)) {
		return bad(fmt.Sprintf("lengths meta %d state %d do not fit %d bytes", mlen, slen, len(b)))
	}
	t := b[len(b)-snapTrlSize:]
	if le.Uint32(t[8:]) != snapEndMagic || le.Uint32(t[12:]) != crc32.Checksum(t[:12], snapCRC) {
		return bad("trailer mismatch")
	}
	s := &DiskSnap{
		Index:  le.Uint64(b[8:]),
		At:     MsgHdr{E: Epoch(le.Uint64(b[16:])), Cnt: le.Uint64(b[24:])},
		Member: le.Uint64(b[48:]),
		Meta:   b[snapHdrSize : snapHdrSize+int(mlen)],
	}
	so := snapHdrSize + pad8(int(mlen))
	s.State = b[so : so+int(slen)]
	if le.Uint32(b[68:]) != 0 || !allZeroBytes(b[snapHdrSize+int(mlen):so]) || !allZeroBytes(b[so+int(slen):len(b)-snapTrlSize]) {
		return bad("nonzero padding")
	}
	if snapHash(s.Meta, s.State) != le.Uint64(t[0:]) {
		return bad("check word mismatch")
	}
	return s, nil
}

func allZeroBytes(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// LoadNewest returns the newest valid snapshot in dir (nil if there is
// none), by header, and one warning per file it set aside: a file that
// fails its checks, or whose name disagrees with its header, is renamed
// <name>.broken and the next older one is tried. Leftover tmp- files (a
// save a crash interrupted) are removed. It runs before the replica
// starts, synchronously on fs. A replica recovering its log uses LoadFor.
func LoadNewest(fs vfs.FS, dir string) (snap *DiskSnap, warnings []string, err error) {
	return loadFor(fs, dir, nil, recoverKnobs{})
}

// LoadFor is LoadNewest for the log rec (wal.Recover's, read first): the
// snapshot recovery starts from. When the log's last diff that installed
// a snapshot (its SnapMark names the file) is followed by no newer
// snapshot, that is the one named: files above it and below the diff
// were taken before the diff replaced the state (install.stale) and hold
// state the group may no longer have; they are removed (one warning
// each, "removed stale snapshot ...") and the directory synced. The
// store makes their removal durable before the diff counts (SaveImage),
// so only a crash inside that window leaves one. A log with corruption
// is not consulted (recovery boots catching up).
func LoadFor(fs vfs.FS, dir string, rec *wal.Recovered) (snap *DiskSnap, warnings []string, err error) {
	return loadFor(fs, dir, rec, recoverKnobs{})
}

// LoadForReuse is LoadFor reading the files into buffers of pool: the
// snapshot's image goes back to it once the replica built from it
// replayed it (Recovery.release, in New), for the next replica the
// process builds (package reuse: a buffer at an address used before
// costs far less CPU to read into and to read on this project's VMs).
// Nothing New builds may alias the image after that.
func LoadForReuse(fs vfs.FS, dir string, rec *wal.Recovered, pool *reuse.Pool) (snap *DiskSnap, warnings []string, err error) {
	return loadForPool(fs, dir, rec, recoverKnobs{}, pool)
}

// readImage reads the file at p whole into a buffer of pool (nil: a new
// one).
func readImage(fs vfs.FS, p string, pool *reuse.Pool) ([]byte, error) {
	b, err := vfs.ReadFileInto(fs, p, pool.Get)
	if err != nil {
		pool.Put(b)
		return nil, err
	}
	return b, nil
}

// StaleWarning reports whether a LoadFor warning is the removal of a stale
// snapshot (a crash inside the install's window), not corruption.
func StaleWarning(w string) bool { return strings.HasPrefix(w, staleWarning) }

const staleWarning = "removed stale snapshot "

// snapFile is a snapshot file name and what it says.
type snapFile struct {
	name  string
	index uint64
	at    MsgHdr
	ok    bool // the name parses
}

// parseSnapName reads a name SnapName made.
func parseSnapName(name string) snapFile {
	f := snapFile{name: name}
	var e uint64
	if len(name) != len("0000000000000000-0000000000000000-0000000000000000.snap") {
		return f
	}
	if n, err := fmt.Sscanf(name, "%016x-%016x-%016x.snap", &f.index, &e, &f.at.Cnt); err != nil || n != 3 {
		return f
	}
	f.at.E = Epoch(e)
	f.ok = SnapName(f.index, f.at) == name
	return f
}

// snapOrder orders snapshot files by header, then index (names that do not
// parse first: they are tried last, and set aside).
func snapOrder(a, b snapFile) int {
	switch {
	case a.ok != b.ok:
		if a.ok {
			return 1
		}
		return -1
	case a.at != b.at:
		if a.at.Less(b.at) {
			return -1
		}
		return 1
	case a.index != b.index:
		if a.index < b.index {
			return -1
		}
		return 1
	}
	return strings.Compare(a.name, b.name)
}

func loadFor(fs vfs.FS, dir string, rec *wal.Recovered, k recoverKnobs) (snap *DiskSnap, warnings []string, err error) {
	return loadForPool(fs, dir, rec, k, nil)
}

func loadForPool(fs vfs.FS, dir string, rec *wal.Recovered, k recoverKnobs, pool *reuse.Pool) (snap *DiskSnap, warnings []string, err error) {
	ents, err := fs.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	var in install
	if rec != nil && len(rec.Corrupt) == 0 && !k.staleSnapUsed {
		in = lastInstall(rec.Records)
	}
	var files []snapFile
	changed := false
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, "tmp-"):
			if err := fs.Remove(filepath.Join(dir, n)); err != nil {
				return nil, warnings, err
			}
		case strings.HasSuffix(n, ".snap"):
			f := parseSnapName(n)
			if f.ok && in.stale(f.at) {
				p := filepath.Join(dir, n)
				if err := fs.Remove(p); err != nil {
					return nil, warnings, err
				}
				changed = true
				warnings = append(warnings, fmt.Sprintf("%s%s: above %s, which the log's diff of epoch %v installed (record seq %d), and below that diff: taken before the diff replaced the state (a crash came before its removal was durable); starting from %s", staleWarning, p, SnapName(in.index, in.at), in.diff.E, in.markSeq, SnapName(in.index, in.at)))
				continue
			}
			files = append(files, f)
		}
	}
	slices.SortFunc(files, snapOrder)
	for i := len(files) - 1; i >= 0; i-- {
		p := filepath.Join(dir, files[i].name)
		b, err := readImage(fs, p, pool)
		if err != nil {
			return nil, warnings, err
		}
		s, err := decodeSnapFile(b)
		if err == nil && SnapName(s.Index, s.At) != files[i].name {
			err = fmt.Errorf("%w: header says %s", ErrSnapCorrupt, SnapName(s.Index, s.At))
		}
		if err == nil && pool != nil {
			s.img, s.pool = b, pool
		}
		if err == nil {
			// What we read may be in the page cache only (a process
			// crash between the rename and the dir fsync): make it
			// durable before the log below it is dropped. (The dir
			// fsync covers the removals above too.)
			if err := syncSnap(fs, dir, p); err != nil {
				s.recycle()
				return nil, warnings, err
			}
			s.Path = p
			for _, f := range files[:i] {
				s.Older = append(s.Older, filepath.Join(dir, f.name))
			}
			return s, warnings, nil
		}
		pool.Put(b) // set aside: nothing decoded from it is kept
		next := "no older snapshot"
		if i > 0 {
			next = "falling back to " + filepath.Join(dir, files[i-1].name)
		}
		warnings = append(warnings, fmt.Sprintf("snapshot %s is corrupt (%v): %s", p, err, next))
		if rerr := fs.Rename(p, p+".broken"); rerr != nil {
			return nil, warnings, rerr
		}
		changed = true
	}
	if changed {
		if err := fs.SyncDir(dir); err != nil {
			return nil, warnings, err
		}
	}
	return nil, warnings, nil
}

func syncSnap(fs vfs.FS, dir, path string) error {
	f, err := fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.SyncDir(dir)
	}
	return err
}

// snapKnobs are the snapshot store's planted bugs.
type snapKnobs struct {
	// renameBeforeSync: the tmp file is renamed (and the directory
	// synced) before its fdatasync, and the save counts as done then: a
	// crash loses the pages behind a durable name. Caught by
	// TestSnapStoreRenameBeforeSync ("recoverable:").
	renameBeforeSync bool
	// staleRemovedLate: a save below older files (a snapshot a diff
	// installed over state it replaced) counts as durable before their
	// removal, which comes after, unsynced, as any old file's: the gate
	// passes the diff while a crash can still bring them back. Caught
	// by TestSnapStoreStaleRemovedFirst ("stale:").
	staleRemovedLate bool
}

// SnapStore writes disk snapshots through a wal.Device (the log's, split
// with wal.Share), one at a time, as a polled state machine: Save queues
// the file's IOs, Poll reaps them. Not safe for concurrent use: it runs
// on the replica's polling goroutine.
type SnapStore struct {
	dev    wal.Device
	dir    string
	member uint64
	knobs  snapKnobs

	ops    []wal.IO // the current save's IOs, in order
	next   int      // ops[:next] submitted
	inDone int      // ops[:inDone] completed
	tag    uint64
	saving *DiskSnap // the save in flight (Meta/State nil)
	done   bool      // the save in flight is durable (ops after it remove old files)
	durAt  int       // ops[:durAt] complete: the save in flight is durable
	stale  []string  // files above the save in flight, removed before it is durable
	staleN uint64    // saves that removed files above them (tests' statistics)
	tmpN   uint64
	tmp    string // the save in flight's tmp file

	// closing: the replica is closing (closeDiskSnap): no capture starts.
	closing bool

	newest  *DiskSnap // the newest durable snapshot (Meta/State nil)
	old     []string  // older snapshot files to remove
	failErr error     // sticky: fail-stop
	fullErr error     // the last save found the disk full (cleared by the next save)
	saves   uint64
	buf     []wal.Done
}

// NewSnapStore returns a store writing to dir (which must exist) through
// dev. newest is what LoadFor returned (nil: none); it and the older
// files LoadFor listed are removed after the next save.
func NewSnapStore(dev wal.Device, dir string, member uint64, newest *DiskSnap) *SnapStore {
	s := &SnapStore{dev: dev, dir: dir, member: member}
	if newest != nil {
		s.newest = &DiskSnap{Path: newest.Path, Index: newest.Index, At: newest.At, Member: newest.Member}
		s.old = append(s.old, newest.Older...)
	}
	return s
}

// Busy: a save is in flight.
func (s *SnapStore) Busy() bool { return s.saving != nil }

// Err is the sticky fail-stop error (an fsync failed), or nil.
func (s *SnapStore) Err() error { return s.failErr }

// FullErr is why the last save was abandoned for want of space (nil if
// it was not); the previous snapshot and the log are intact.
func (s *SnapStore) FullErr() error { return s.fullErr }

// Newest is the newest durable snapshot's index and header (ok false:
// none yet).
func (s *SnapStore) Newest() (index uint64, at MsgHdr, ok bool) {
	if s.newest == nil {
		return 0, MsgHdr{}, false
	}
	return s.newest.Index, s.newest.At, true
}

// Saves counts the snapshots made durable.
func (s *SnapStore) Saves() uint64 { return s.saves }

// Save starts writing a snapshot of the state at commit index/at (meta:
// the network meta region; state: the FSM's persisted bytes). False if a
// save is in flight or the store failed. The bytes are copied into the
// file image.
func (s *SnapStore) Save(now time.Duration, index uint64, at MsgHdr, meta, state []byte) bool {
	if s.saving != nil || s.failErr != nil {
		return false
	}
	return s.SaveImage(index, at, encodeSnapFile(index, at, s.member, now, meta, state))
}

// SaveImage is Save for a file image EncodeSnapFile built (off the
// polling goroutine: no copy of the state in Poll). The device owns img
// until the save ends.
func (s *SnapStore) SaveImage(index uint64, at MsgHdr, img []byte) bool {
	if s.saving != nil || s.failErr != nil {
		return false
	}
	s.fullErr = nil
	s.tmpN++
	tmp := filepath.Join(s.dir, fmt.Sprintf("tmp-%d", s.tmpN))
	s.tmp = tmp
	final := filepath.Join(s.dir, SnapName(index, at))
	s.saving = &DiskSnap{Path: final, Index: index, At: at, Member: s.member}
	s.done = false
	s.ops = s.ops[:0]
	s.ops = append(s.ops,
		wal.IO{Kind: wal.IOCreate, Path: tmp},
		wal.IO{Kind: wal.IOWrite, Path: tmp, Data: img})
	if s.knobs.renameBeforeSync {
		s.ops = append(s.ops,
			wal.IO{Kind: wal.IORename, Path: tmp, To: final},
			wal.IO{Kind: wal.IOSyncDir, Path: s.dir},
			wal.IO{Kind: wal.IOSync, Path: final})
	} else {
		s.ops = append(s.ops,
			wal.IO{Kind: wal.IOSync, Path: tmp},
			wal.IO{Kind: wal.IORename, Path: tmp, To: final},
			wal.IO{Kind: wal.IOSyncDir, Path: s.dir})
	}
	s.durAt = len(s.ops)
	if s.knobs.renameBeforeSync {
		s.durAt = 4 // the planted bug: after the dir sync, before the data sync
	}
	// Files above this snapshot (by header) hold state it replaced: a
	// diff installed it over them (durable.go, install.stale). Their
	// removal is durable (unlink, then a dir fsync) before the save
	// counts, so that the gate passes the diff's SnapMark only once no
	// crash can bring them back (LoadFor would set them aside, but a
	// group where every member needed that could not recover at all if
	// it also lost the log's mark). The save only starts once the diff's
	// records are synced (diskSnapPoll): the log names the install before
	// anything it replaced is gone.
	s.stale = s.stale[:0]
	for _, p := range s.oldFiles() {
		if f := parseSnapName(filepath.Base(p)); f.ok && at.Less(f.at) && p != final {
			s.stale = append(s.stale, p)
		}
	}
	if len(s.stale) > 0 {
		s.staleN++
	}
	if len(s.stale) > 0 && !s.knobs.staleRemovedLate {
		for _, p := range s.stale {
			s.ops = append(s.ops, wal.IO{Kind: wal.IORemove, Path: p})
		}
		s.ops = append(s.ops, wal.IO{Kind: wal.IOSyncDir, Path: s.dir})
		s.durAt = len(s.ops)
	}
	s.next, s.inDone = 0, 0
	s.submit()
	return true
}

// oldFiles are the snapshot files the next save replaces: the newest and
// the older ones not removed yet.
func (s *SnapStore) oldFiles() []string {
	if s.newest == nil {
		return s.old
	}
	return append(s.old[:len(s.old):len(s.old)], s.newest.Path)
}

// submit submits the next op once the previous one completed: one op in
// flight, so that nothing runs after a failed op (a rename after a failed
// write would give a partial file the snapshot's name).
func (s *SnapStore) submit() {
	if s.next < len(s.ops) && s.next == s.inDone {
		op := s.ops[s.next]
		s.tag++
		op.Tag = s.tag
		if !s.dev.Submit(op) {
			return
		}
		s.ops[s.next].Tag = op.Tag
		s.next++
	}
}

// Poll reaps the device's completions for this store and moves the save
// along; it reports whether a save became durable at this call.
func (s *SnapStore) Poll(now time.Duration) (saved bool) {
	s.buf = s.dev.Reap(s.buf[:0])
	for _, d := range s.buf {
		if s.saving == nil || s.inDone >= s.next || d.Tag != s.ops[s.inDone].Tag {
			continue
		}
		op := s.ops[s.inDone]
		s.inDone++
		if d.Err != nil {
			if s.failed(op, d.Err) {
				return false
			}
			continue
		}
		if !s.done && s.inDone == s.durAt {
			s.done = true
			saved = true
			if s.newest != nil && s.newest.Path != s.saving.Path {
				s.old = append(s.old, s.newest.Path)
			}
			s.newest = s.saving
			s.saves++
			for _, p := range s.old {
				if p != s.saving.Path && (s.knobs.staleRemovedLate || !slices.Contains(s.stale, p)) {
					s.ops = append(s.ops, wal.IO{Kind: wal.IORemove, Path: p})
				}
			}
			s.old = s.old[:0]
		}
		if s.inDone == len(s.ops) {
			s.saving = nil
		}
	}
	if s.saving != nil {
		s.submit()
	}
	return saved
}

// abandon ends the save in flight without letting it count (a clean stop
// ran out of time, closeDiskSnap): the ops not submitted yet are dropped
// and, unless it already counted, its tmp file is removed once the op in
// flight completed (gone already if a rename in flight went through:
// then the file is whole and synced, and LoadFor syncs its name). A save
// that counted only drops the removals of older files it had left.
func (s *SnapStore) abandon() {
	if s.saving == nil {
		return
	}
	s.ops = s.ops[:s.next]
	if s.newest != s.saving { // it did not count: its tmp file may be there
		s.ops = append(s.ops, wal.IO{Kind: wal.IORemove, Path: s.tmp})
	}
	s.done = true // nothing more counts as durable
	if s.inDone == len(s.ops) {
		s.saving = nil
	} else {
		s.submit()
	}
}

// failed ends the save at a failed op. No space while creating or writing
// the tmp file abandons it (removed; the old snapshot and the log are
// intact; a later Save tries again). Any other failure, and every failed
// fsync, is fail-stop (the fsyncgate lesson: the kernel may have dropped
// the pages).
// It reports whether the store stopped (fail-stop).
func (s *SnapStore) failed(op wal.IO, err error) bool {
	noSpace := errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
	if noSpace && !s.done && (op.Kind == wal.IOCreate || op.Kind == wal.IOWrite || op.Kind == wal.IOAllocate) {
		s.fullErr = fmt.Errorf("%w: snapshot %s: %s: %w", wal.ErrDiskFull, filepath.Base(s.saving.Path), op.Kind, err)
		s.ops = append(s.ops[:0], wal.IO{Kind: wal.IORemove, Path: s.tmp})
		s.next, s.inDone = 0, 0
		s.done = true // nothing more counts as durable
		return false
	}
	if op.Kind == wal.IORemove && errors.Is(err, os.ErrNotExist) { // gone already
		if s.inDone == len(s.ops) {
			s.saving = nil
		}
		return false
	}
	s.failErr = fmt.Errorf("%w: snapshot %s: %s %s: %w", wal.ErrFailStop, filepath.Base(s.saving.Path), op.Kind, op.Path, err)
	s.saving = nil
	return true
}

// closeSaveTimeout bounds how long Close lets the save of a snapshot a
// diff installed run on (closeDiskSnap: the log names it, and without it
// the next start boots catching up from its group); closeSaveBudget how
// long it lets a periodic save run on (an optimisation of the next
// start's recovery: the log below it is only dropped once it is
// durable); closeAbandonTimeout how long it then waits for the op in
// flight and the removal of the save's tmp file.
const (
	closeSaveTimeout    = 5 * time.Second
	closeSaveBudget     = time.Second
	closeAbandonTimeout = time.Second
)

// closeDiskSnap (Close, once the Persist goroutines ended: nothing polls
// the replica any more) ends the disk snapshot work so that a clean stop
// leaves no snap/tmp- file behind and takes seconds, not the length of a
// save: it drops a periodic capture persisted and not yet handed to the
// store (nothing saved; the log still holds what it covered), then
// drives diskSnapPoll, which lets the save under way go on and hands the
// store the snapshot a synced diff installed (the log names it, and
// without it the next start would boot in Repair), but starts no
// capture: for at most closeSaveBudget while only a periodic save is
// under way, closeSaveTimeout while a diff's install is. A save still
// under way then is abandoned: its tmp file is removed once the op in
// flight completed (closeAbandonTimeout; a device that does not complete
// it leaves the file to the next start, which removes it). An abandoned
// periodic save costs nothing but a longer replay at the next start: the
// log is dropped below a snapshot only once it is durable (diskSnapStep),
// and an abandoned save never counts (SnapStore.abandon). Every snapshot
// dropped or abandoned is named in ClosedUnsaved.
// A failed store or log (fail-stop) is left as it is.
func (r *Replica) closeDiskSnap() {
	d, s := r.dur, r.cfg.Snapshots
	if d == nil || s == nil {
		return
	}
	s.closing = true
	if j := d.snapJob; j != nil && !r.knobs.closeWaitsSave {
		d.snapJob = nil
		if j.err == nil {
			r.closeUnsaved = append(r.closeUnsaved, SnapName(j.index, j.at))
			r.tracef("node %d closes with its disk snapshot at %v (index %d) captured and not saved: dropped", r.self, j.at, j.index)
		}
	}
	now, sleep := time.Now, func() { time.Sleep(50 * time.Microsecond) }
	if c := r.knobs.closeClock; c != nil {
		now, sleep = c, func() {}
	}
	start := now()
	for d.err == nil {
		r.diskSnapPoll()
		if !s.Busy() {
			return
		}
		budget := closeSaveTimeout
		if d.net == nil && d.netSaving == nil {
			budget = closeSaveBudget // only a periodic save under way
		}
		if r.knobs.closeSaveExpired {
			budget = 0
		}
		if now().Sub(start) >= budget && !(r.knobs.closeWaitsSave && d.netSaving == nil) {
			break
		}
		sleep()
	}
	if !s.Busy() || s.Err() != nil {
		return
	}
	name := filepath.Base(s.saving.Path)
	r.closeUnsaved = append(r.closeUnsaved, name)
	r.tracef("node %d closes with its disk snapshot %s unsaved: abandoned", r.self, name)
	s.abandon()
	deadline := now().Add(closeAbandonTimeout)
	for s.Busy() && now().Before(deadline) {
		s.Poll(r.now)
		sleep()
	}
}

// ClosedUnsaved names the disk snapshots Close did not save (read it
// after Close): a periodic capture it dropped or a save under way it
// abandoned (closeDiskSnap). The next start recovers from the snapshot
// before and replays the longer log; nothing is lost.
func (r *Replica) ClosedUnsaved() []string { return r.closeUnsaved }

// diskSnapJob is a capture being persisted off Poll (runPersist).
type diskSnapJob struct {
	at    MsgHdr
	index uint64
	drop  uint64 // DropBefore this once the snapshot is durable
	img   []byte // the file image (encodeSnapFile)
	err   error
	done  atomic.Bool
}

// SnapWork is the disk snapshot work a replica did on its polling
// goroutine since it started, timed by Config.StatClock (durations zero
// without one): kvserver's /status attributes a replica's long polls
// with it.
type SnapWork struct {
	Captures   uint64        // FSM captures for disk snapshots
	Capture    time.Duration // in them: FSM.Snapshot
	CaptureMax time.Duration
	Meta       time.Duration // and the meta copied with it (keyed table, units)
	// CaptureCPU is the polling thread's CPU time in the captures (by
	// Config.StatCPUClock), CaptureCPUMax the largest.
	CaptureCPU, CaptureCPUMax time.Duration
	// CaptureRunDelay is the polling thread's time on the OS's run
	// queue in the captures (by Config.StatRunDelay).
	CaptureRunDelay time.Duration
	// Store is the rest: a persisted image handed to the store, the log
	// dropped below a durable snapshot.
	Store    time.Duration
	StoreMax time.Duration
	// GateWaits counts the Polls at which a capture was due and another
	// replica held the Config.SaveGate.
	GateWaits uint64
	// ReadyWaits counts the Polls at which a capture was due and
	// Config.CaptureReady said not yet.
	ReadyWaits uint64
}

// SnapWork returns the replica's disk snapshot work (polling goroutine).
func (r *Replica) SnapWork() SnapWork {
	if r.dur == nil {
		return SnapWork{}
	}
	return r.dur.work
}

// Delivered is the number of entries delivered to the FSM (polling
// goroutine; Status().Index without its lock and copy).
func (r *Replica) Delivered() uint64 { return r.index }

func (r *Replica) statNow() time.Duration {
	if r.cfg.StatClock == nil {
		return 0
	}
	return r.cfg.StatClock()
}

// noteStore adds the store work since t0 (statNow) to SnapWork.
func (d *durable) noteStore(r *Replica, t0 time.Duration) {
	x := r.statNow() - t0
	d.work.Store += x
	d.work.StoreMax = max(d.work.StoreMax, x)
}

// diskSnapPoll (Sync with Config.Snapshots; end of Poll) moves disk
// snapshots along: it reaps the store, drops the log below a snapshot
// that became durable, hands a persisted capture to the store, and
// captures the FSM at the commit point when the log grew
// SnapshotLogBytes since the last capture. One snapshot at a time, and
// with a Config.SaveGate one periodic save at a time among the replicas
// that share it (the gate is taken before the capture and given back at
// the end of the call that finds the save over).
func (r *Replica) diskSnapPoll() {
	r.saveGateBegin()
	r.diskSnapStep()
	r.saveGateCheck()
}

func (r *Replica) diskSnapStep() {
	d, s := r.dur, r.cfg.Snapshots
	if s == nil || d.err != nil {
		return
	}
	saved := s.Poll(r.now)
	if ns := d.netSaving; ns != nil && (saved || !s.Busy()) {
		d.netSaving = nil
		if !saved {
			// The disk was full: the diff's SnapMark names a snapshot
			// that is not there; nothing from it on may be acknowledged.
			err := s.Err()
			if err == nil {
				err = s.FullErr()
			}
			d.err = fmt.Errorf("%w: member %d: the snapshot its diff installed: %w", ErrDisk, r.self, err)
			r.tracef("node %d stops: %v", r.self, d.err)
			return
		}
		d.netSaves++
		if d.net == nil {
			// The newest snapshot a diff installed is durable: its
			// diff's records may count once synced (walPoll), and the
			// log below the diff is covered then.
			d.gate, d.netDrop, d.netEnd = 0, ns.begin, ns.end
		}
		r.tracef("node %d: the snapshot at %v (index %d) its diff installed is durable", r.self, ns.at, ns.index)
	} else if saved {
		t0 := r.statNow()
		// The device wrote and synced the image: the next capture's
		// Persist may write into it.
		d.spareImg, d.savingImg = d.savingImg, nil
		if r.knobs.snapImgKept {
			d.spareImg = nil
		}
		d.cut = d.snapDrop
		d.w.DropBefore(d.cut)
		d.noteStore(r, t0)
		idx, at, _ := s.Newest()
		r.tracef("node %d: disk snapshot at %v (index %d) durable; log dropped below seq %d", r.self, at, idx, d.snapDrop)
	}
	if err := s.Err(); err != nil {
		d.err = fmt.Errorf("%w: member %d: %w", ErrDisk, r.self, err)
		r.tracef("node %d stops: %v", r.self, d.err)
		return
	}
	if ns := d.net; ns != nil {
		// A snapshot a diff installed goes first; no periodic capture
		// meanwhile. It goes once the diff's records are synced: the
		// save removes the files it replaced (SaveImage), and a log that
		// does not name the install yet continues them.
		if !ns.done.Load() || s.Busy() {
			return
		}
		if d.w.Synced() < ns.end && !r.knobs.netSaveUnsynced {
			d.w.Flush() // Async: do not wait FsyncInterval for it
			return
		}
		if s.SaveImage(ns.index, ns.at, ns.img) {
			d.net, d.netSaving = nil, ns
		}
		return
	}
	if j := d.snapJob; j != nil {
		if !j.done.Load() || s.Busy() {
			return
		}
		d.snapJob = nil
		if j.err != nil {
			r.tracef("node %d: disk snapshot at %v: %v", r.self, j.at, j.err)
			return
		}
		t0 := r.statNow()
		if s.SaveImage(j.index, j.at, j.img) {
			d.snapDrop = j.drop
			d.savingImg = j.img
		}
		d.noteStore(r, t0)
		return
	}
	written := d.w.BytesWritten()
	if s.Busy() || s.closing || written-d.snapBytes < uint64(r.cfg.SnapshotLogBytes) || r.index == 0 {
		return
	}
	if _, at, ok := s.Newest(); ok && !at.Less(r.committed) {
		return
	}
	if f := r.cfg.CaptureReady; f != nil && !f() {
		d.work.ReadyWaits++
		return // the FSM asks for a later Poll
	}
	if !r.saveGateTake() {
		d.work.GateWaits++
		return // another replica of the process saves: at a later Poll
	}
	d.snapBytes = written
	// The CPU clock's reads lie inside the wall clock's, so that a
	// capture's CPU time is never more than its wall time (a thread CPU
	// clock read is a system call: outside, its cost counted as CPU and
	// not as wall, 701 µs of CPU against 647 µs of wall under -race).
	t0 := r.statNow()
	var cpu0, wait0 time.Duration
	if r.cfg.StatCPUClock != nil {
		cpu0 = r.cfg.StatCPUClock()
	}
	if r.cfg.StatRunDelay != nil {
		wait0 = r.cfg.StatRunDelay()
	}
	capture, err := r.fsm.Snapshot()
	if err != nil {
		r.tracef("node %d: disk snapshot: %v", r.self, err)
		return
	}
	if r.cfg.StatRunDelay != nil {
		d.work.CaptureRunDelay += max(r.cfg.StatRunDelay()-wait0, 0)
	}
	if r.cfg.StatCPUClock != nil {
		// A goroutine moved to another thread mid-capture reads
		// another thread's clock: clamped, never negative.
		x := max(r.cfg.StatCPUClock()-cpu0, 0)
		d.work.CaptureCPU += x
		d.work.CaptureCPUMax = max(d.work.CaptureCPUMax, x)
	}
	t1 := r.statNow()
	d.work.Captures++
	d.work.Capture += t1 - t0
	d.work.CaptureMax = max(d.work.CaptureMax, t1-t0)
	// The log below the first unit above the commit point is covered.
	j := &diskSnapJob{at: r.committed, index: r.index, drop: d.cutUnits(r.committed)}
	d.snapJob = j
	meta := snapMeta{index: r.index, table: append([]tableRec(nil), r.table...), keys: r.keys.capture()}
	d.work.Meta += r.statNow() - t1
	members, member, now := r.cfg.Members, s.member, r.now
	spare := d.spareImg
	d.spareImg = nil
	if spare != nil {
		d.imgReuses++
		if r.knobs.poisonSpareImg {
			p := spare[:cap(spare)]
			for i := range p {
				p[i] = 0xab
			}
		}
	}
	noClear := r.knobs.snapImgNoClear
	r.tracef("node %d captures a disk snapshot at %v (index %d, %d bytes)", r.self, j.at, j.index, capture.Size())
	// Close waits: the capture reads the FSM's memory, which its owner unmaps after Close
	r.startPersist(persistDisk, func() {
		defer capture.Release()
		// The capture persists straight into the file image: the meta's
		// length does not depend on the state's size and check word,
		// which it records.
		img, buf := snapImageInto(spare, len(encodeSnapMeta(members, meta)), capture.Size(), noClear)
		if err := capture.Persist(buf); err != nil {
			j.err = err
		} else {
			meta.size = uint64(len(buf))
			meta.stateCheck = hashChunked(buf)
			sealSnapImage(img, len(buf), j.index, j.at, member, now, encodeSnapMeta(members, meta))
			j.img = img
		}
		j.done.Store(true)
		r.node.Doorbell().Ring()
	})
}
