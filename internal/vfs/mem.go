package vfs

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Crash model of Mem (and of the simulator's disk, which is a Mem).
const (
	// PageSize is the unit in which unsynced writes survive a crash or not.
	PageSize = 4096
	// SectorSize is the unit of a torn page: a torn last write keeps a
	// prefix of its page, a whole number of sectors.
	SectorSize = 512
)

// Mem is an in-memory FS for tests and the simulator. Every file keeps its
// current bytes and the bytes its last Sync made durable, and which pages
// were written since; every directory keeps its current names and the
// names its last SyncDir made durable. Crash turns the current state into
// what a power cut could leave; DropUnsynced into the worst case of it.
// Directories made by MkdirAll are durable at once. Mem is safe for
// concurrent use (a FileDevice's goroutine and a test).
type Mem struct {
	mu   sync.Mutex
	dirs map[string]bool
	cur  map[string]*inode // names as the running program sees them
	dur  map[string]*inode // names a crash keeps
}

type inode struct {
	data      []byte
	durable   []byte
	dirty     map[int64]bool // pages written since the last Sync
	sizeDirty bool           // size changed (Truncate, Allocate) since the last Sync
	last      int64          // page of the last write's last byte, -1 if none since Sync
}

// NewMem returns an empty Mem with the root directory.
func NewMem() *Mem {
	return &Mem{dirs: map[string]bool{"/": true, ".": true}, cur: map[string]*inode{}, dur: map[string]*inode{}}
}

func clean(name string) string { return filepath.Clean(name) }

func pathErr(op, name string, err error) error { return &os.PathError{Op: op, Path: name, Err: err} }

func (m *Mem) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino, ok := m.cur[name]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, pathErr("open", name, fs.ErrExist)
	case !ok && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, fs.ErrNotExist)
	case !ok:
		if !m.dirs[filepath.Dir(name)] {
			return nil, pathErr("open", name, fs.ErrNotExist)
		}
		if m.dirs[name] {
			return nil, pathErr("open", name, syscall.EISDIR)
		}
		ino = &inode{dirty: map[int64]bool{}, last: -1}
		m.cur[name] = ino
	}
	if flag&os.O_TRUNC != 0 && len(ino.data) > 0 {
		ino.data = ino.data[:0]
		ino.sizeDirty = true
	}
	return &memFile{m: m, ino: ino, name: name, ro: flag&(os.O_WRONLY|os.O_RDWR) == 0}, nil
}

func (m *Mem) Rename(oldname, newname string) error {
	oldname, newname = clean(oldname), clean(newname)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino, ok := m.cur[oldname]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	if !m.dirs[filepath.Dir(newname)] {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	delete(m.cur, oldname)
	m.cur[newname] = ino
	return nil
}

func (m *Mem) Remove(name string) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.cur[name]; !ok {
		return pathErr("remove", name, fs.ErrNotExist)
	}
	delete(m.cur, name)
	return nil
}

func (m *Mem) ReadDir(dir string) ([]os.DirEntry, error) {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[dir] {
		return nil, pathErr("readdir", dir, fs.ErrNotExist)
	}
	var out []os.DirEntry
	for name, ino := range m.cur {
		if filepath.Dir(name) == dir {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: filepath.Base(name), size: int64(len(ino.data))}))
		}
	}
	for d := range m.dirs {
		if d != dir && filepath.Dir(d) == dir {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: filepath.Base(d), dir: true}))
		}
	}
	slices.SortFunc(out, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

func (m *Mem) MkdirAll(dir string, perm os.FileMode) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	for d := dir; !m.dirs[d]; d = filepath.Dir(d) {
		if _, ok := m.cur[d]; ok {
			return pathErr("mkdir", d, syscall.ENOTDIR)
		}
		m.dirs[d] = true
	}
	return nil
}

// SyncDir makes dir's current names the ones a crash keeps.
func (m *Mem) SyncDir(dir string) error {
	dir = clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[dir] {
		return pathErr("syncdir", dir, fs.ErrNotExist)
	}
	for name := range m.dur {
		if filepath.Dir(name) == dir {
			delete(m.dur, name)
		}
	}
	for name, ino := range m.cur {
		if filepath.Dir(name) == dir {
			m.dur[name] = ino
		}
	}
	return nil
}

func (m *Mem) Stat(name string) (os.FileInfo, error) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dirs[name] {
		return memInfo{name: filepath.Base(name), dir: true}, nil
	}
	ino, ok := m.cur[name]
	if !ok {
		return nil, pathErr("stat", name, fs.ErrNotExist)
	}
	return memInfo{name: filepath.Base(name), size: int64(len(ino.data))}, nil
}

// Crash turns m into a state a power cut could leave, drawing from rng:
// names revert to those the last SyncDir of their directory made durable;
// in every file each page written since its last Sync is kept with
// probability 1/2, except the page of the last write, which keeps a random
// prefix of whole sectors (a torn write); an unsynced size change is kept
// with probability 1/2. Open Files must not be used afterwards.
func (m *Mem) Crash(rng *rand.Rand) { m.crash(rng) }

// Used is the bytes the files hold now (their current sizes, summed): a
// disk model's used space (the simulator's capacity).
func (m *Mem) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, ino := range m.cur {
		n += int64(len(ino.data))
	}
	return n
}

// DropUnsynced is the crash that keeps nothing unsynced: every file is
// what its last Sync made durable, every directory what its last SyncDir.
func (m *Mem) DropUnsynced() { m.crash(nil) }

func (m *Mem) crash(rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.dur))
	for name := range m.dur {
		names = append(names, name)
	}
	slices.Sort(names)
	seen := map[*inode]bool{}
	cur := make(map[string]*inode, len(names))
	for _, name := range names {
		ino := m.dur[name]
		if !seen[ino] {
			seen[ino] = true
			ino.crash(rng)
		}
		cur[name] = ino
	}
	m.cur = cur
}

func (ino *inode) crash(rng *rand.Rand) {
	res := slices.Clone(ino.durable)
	if rng != nil {
		pages := make([]int64, 0, len(ino.dirty))
		for p := range ino.dirty {
			pages = append(pages, p)
		}
		slices.Sort(pages)
		for _, p := range pages {
			lo := p * PageSize
			hi := min(lo+PageSize, int64(len(ino.data)))
			if lo >= hi {
				continue
			}
			keep := lo
			if p == ino.last {
				keep = min(lo+int64(rng.IntN(PageSize/SectorSize+1))*SectorSize, hi)
			} else if rng.IntN(2) == 0 {
				keep = hi
			}
			if keep > lo {
				if int64(len(res)) < keep {
					res = append(res, make([]byte, keep-int64(len(res)))...)
				}
				copy(res[lo:keep], ino.data[lo:keep])
			}
		}
		if ino.sizeDirty && rng.IntN(2) == 0 {
			if n := int64(len(ino.data)); int64(len(res)) > n {
				res = res[:n]
			} else {
				res = append(res, make([]byte, n-int64(len(res)))...)
			}
		}
	}
	ino.durable = res
	ino.data = slices.Clone(res)
	ino.dirty = map[int64]bool{}
	ino.sizeDirty = false
	ino.last = -1
}

// DropDirty is what a kernel may do when a writeback fails (PostgreSQL's
// "fsyncgate"): the file's pages written since its last Sync are dropped
// (reads see the durable bytes again) and forgotten, so that a later Sync
// succeeds without them.
func (m *Mem) DropDirty(name string) {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino, ok := m.cur[name]
	if !ok {
		return
	}
	for p := range ino.dirty {
		lo := p * PageSize
		hi := min(lo+PageSize, int64(len(ino.data)))
		for i := lo; i < hi; i++ {
			var b byte
			if i < int64(len(ino.durable)) {
				b = ino.durable[i]
			}
			ino.data[i] = b
		}
	}
	ino.dirty = map[int64]bool{}
	ino.last = -1
}

// Corrupt flips mask into the byte at off of name, in the current and the
// durable bytes alike (bit rot on the medium).
func (m *Mem) Corrupt(name string, off int64, mask byte) error {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino, ok := m.cur[name]
	if !ok {
		return pathErr("corrupt", name, fs.ErrNotExist)
	}
	if off >= int64(len(ino.data)) {
		return pathErr("corrupt", name, io.EOF)
	}
	ino.data[off] ^= mask
	if off < int64(len(ino.durable)) {
		ino.durable[off] ^= mask
	}
	return nil
}

// Unsynced reports whether anything of name, its bytes or its directory
// entry, would be lost by DropUnsynced.
func (m *Mem) Unsynced(name string) bool {
	name = clean(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	ino := m.cur[name]
	if ino == nil || m.dur[name] != ino {
		return true
	}
	return len(ino.dirty) > 0 || ino.sizeDirty
}

// Clone returns a deep copy of m (the same names, bytes and durable state):
// a test may crash and recover the copy while m runs on.
func (m *Mem) Clone() *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &Mem{dirs: map[string]bool{}, cur: map[string]*inode{}, dur: map[string]*inode{}}
	for d := range m.dirs {
		c.dirs[d] = true
	}
	copies := map[*inode]*inode{}
	cp := func(ino *inode) *inode {
		if n, ok := copies[ino]; ok {
			return n
		}
		n := &inode{data: slices.Clone(ino.data), durable: slices.Clone(ino.durable),
			dirty: map[int64]bool{}, sizeDirty: ino.sizeDirty, last: ino.last}
		for p := range ino.dirty {
			n.dirty[p] = true
		}
		copies[ino] = n
		return n
	}
	for name, ino := range m.cur {
		c.cur[name] = cp(ino)
	}
	for name, ino := range m.dur {
		c.dur[name] = cp(ino)
	}
	return c
}

type memFile struct {
	m      *Mem
	ino    *inode
	name   string
	ro     bool
	closed bool
}

var errClosed = errors.New("vfs: file already closed")

func (f *memFile) ReadAt(b []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return 0, pathErr("read", f.name, errClosed)
	}
	if off < 0 {
		return 0, pathErr("read", f.name, syscall.EINVAL)
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(b, f.ino.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(b []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return 0, pathErr("write", f.name, errClosed)
	}
	if f.ro || off < 0 {
		return 0, pathErr("write", f.name, syscall.EBADF)
	}
	if len(b) == 0 {
		return 0, nil
	}
	ino := f.ino
	end := off + int64(len(b))
	if end > int64(len(ino.data)) {
		ino.data = append(ino.data, make([]byte, end-int64(len(ino.data)))...)
	}
	copy(ino.data[off:], b)
	for p := off / PageSize; p <= (end-1)/PageSize; p++ {
		ino.dirty[p] = true
	}
	ino.last = (end - 1) / PageSize
	return len(b), nil
}

func (f *memFile) Sync() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return pathErr("sync", f.name, errClosed)
	}
	ino := f.ino
	ino.durable = slices.Clone(ino.data)
	ino.dirty = map[int64]bool{}
	ino.sizeDirty = false
	ino.last = -1
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return pathErr("truncate", f.name, errClosed)
	}
	if f.ro || size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	f.ino.resize(size)
	return nil
}

func (ino *inode) resize(size int64) {
	if n := int64(len(ino.data)); size < n {
		ino.data = ino.data[:size]
	} else if size > n {
		ino.data = append(ino.data, make([]byte, size-n)...)
	}
	ino.sizeDirty = true
}

func (f *memFile) Allocate(off, n int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return pathErr("allocate", f.name, errClosed)
	}
	if f.ro || off < 0 || n <= 0 {
		return pathErr("allocate", f.name, syscall.EINVAL)
	}
	if off+n > int64(len(f.ino.data)) {
		f.ino.resize(off + n)
	}
	return nil
}

func (f *memFile) Stat() (os.FileInfo, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	return memInfo{name: filepath.Base(f.name), size: int64(len(f.ino.data))}, nil
}

func (f *memFile) Close() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, errClosed)
	}
	f.closed = true
	return nil
}

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string { return i.name }
func (i memInfo) Size() int64  { return i.size }
func (i memInfo) Mode() os.FileMode {
	if i.dir {
		return os.ModeDir | 0o755
	}
	return 0o644
}
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }
