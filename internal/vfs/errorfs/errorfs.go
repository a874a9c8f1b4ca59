// Package errorfs wraps a vfs.FS so that tests can make chosen operations
// fail: ENOSPC, EIO on a sync, a short write, the Nth operation of a kind.
// The shape is pebble's vfs/errorfs: an Injector sees every operation
// (its kind, path, offset and length) before it runs and may return the
// error it fails with.
package errorfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// OpKind is the kind of an operation.
type OpKind uint8

const (
	OpOpen OpKind = iota + 1
	OpWrite
	OpSync
	OpSyncDir
	OpRename
	OpAllocate
	OpTruncate
	OpRemove
	OpRead
	OpStatFS // a free-space query (vfs.FreeSpace) of Path, a directory
)

var kindNames = [...]string{"?", "open", "write", "sync", "syncdir", "rename", "allocate", "truncate", "remove", "read", "statfs"}

func (k OpKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("op%d", k)
}

// Op is one operation about to run. For a write Off and Len are the range;
// for Allocate too; for Truncate Off is the new size; for Rename Path is
// the old name.
type Op struct {
	Kind     OpKind
	Path     string
	Off, Len int64
}

// Injector decides, per operation, whether it fails (a non-nil error).
// It is called from whatever goroutine runs the operation.
type Injector interface {
	MaybeError(op Op) error
}

// Func adapts a function to an Injector.
type Func func(op Op) error

func (f Func) MaybeError(op Op) error { return f(op) }

// Any asks each injector in turn; the first error wins.
func Any(injs ...Injector) Injector {
	return Func(func(op Op) error {
		for _, inj := range injs {
			if err := inj.MaybeError(op); err != nil {
				return err
			}
		}
		return nil
	})
}

// ShortWriteError, returned by an Injector for a write, makes the write
// store its first N bytes and then fail with io.ErrShortWrite.
type ShortWriteError struct{ N int64 }

func (e *ShortWriteError) Error() string { return fmt.Sprintf("errorfs: short write of %d bytes", e.N) }

// ShortWrite is the error that makes a write store its first n bytes and
// return io.ErrShortWrite (use it with OnNth or OnPath).
func ShortWrite(n int64) error { return &ShortWriteError{N: n} }

// OnNth fails the nth (1-based) operation of kind with err, once.
func OnNth(kind OpKind, n int, err error) Injector {
	var mu sync.Mutex
	seen := 0
	return Func(func(op Op) error {
		if op.Kind != kind {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		seen++
		if seen == n {
			return err
		}
		return nil
	})
}

// OnPath fails every operation of kind on a path whose base name matches
// glob (filepath.Match) with err.
func OnPath(glob string, kind OpKind, err error) Injector {
	return Func(func(op Op) error {
		if op.Kind != kind {
			return nil
		}
		if ok, _ := filepath.Match(glob, filepath.Base(op.Path)); ok {
			return err
		}
		return nil
	})
}

// Space is an Injector modelling a disk that fills up: writes and
// allocations fail with ENOSPC once they would take the bytes used past
// the limit (counted from the injector's creation, by the ranges asked
// for, overwrites included). Free gives space back.
type Space struct {
	mu    sync.Mutex
	left  int64
	fails int
}

// ENOSPCAfter returns a Space with bytes left.
func ENOSPCAfter(bytes int64) *Space { return &Space{left: bytes} }

func (s *Space) MaybeError(op Op) error {
	if op.Kind != OpWrite && op.Kind != OpAllocate {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if op.Len > s.left {
		s.fails++
		return syscall.ENOSPC
	}
	s.left -= op.Len
	return nil
}

// Free adds n bytes of space.
func (s *Space) Free(n int64) {
	s.mu.Lock()
	s.left += n
	s.mu.Unlock()
}

// Left is the bytes left (errFS.FreeSpace reports no more).
func (s *Space) Left() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.left, 0)
}

// Fails is how many operations failed for lack of space.
func (s *Space) Fails() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fails
}

// Wrap returns fs with every operation first shown to inj.
func Wrap(fs vfs.FS, inj Injector) vfs.FS { return &errFS{fs: fs, inj: inj} }

type errFS struct {
	fs  vfs.FS
	inj Injector
}

func (e *errFS) check(op Op) error {
	if err := e.inj.MaybeError(op); err != nil {
		return fmt.Errorf("errorfs: %s %s: %w", op.Kind, op.Path, err)
	}
	return nil
}

func (e *errFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if err := e.check(Op{Kind: OpOpen, Path: name}); err != nil {
		return nil, err
	}
	f, err := e.fs.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &errFile{f: f, fs: e, name: name}, nil
}

func (e *errFS) Rename(oldname, newname string) error {
	if err := e.check(Op{Kind: OpRename, Path: oldname}); err != nil {
		return err
	}
	return e.fs.Rename(oldname, newname)
}

func (e *errFS) Remove(name string) error {
	if err := e.check(Op{Kind: OpRemove, Path: name}); err != nil {
		return err
	}
	return e.fs.Remove(name)
}

func (e *errFS) ReadDir(dir string) ([]os.DirEntry, error) {
	if err := e.check(Op{Kind: OpRead, Path: dir}); err != nil {
		return nil, err
	}
	return e.fs.ReadDir(dir)
}

func (e *errFS) MkdirAll(dir string, perm os.FileMode) error { return e.fs.MkdirAll(dir, perm) }

func (e *errFS) SyncDir(dir string) error {
	if err := e.check(Op{Kind: OpSyncDir, Path: dir}); err != nil {
		return err
	}
	return e.fs.SyncDir(dir)
}

func (e *errFS) Stat(name string) (os.FileInfo, error) { return e.fs.Stat(name) }

// FreeSpace shows an OpStatFS to the injector first: ENOSPC from it means
// a full disk, which reports 0 bytes free; another error fails the query.
// Otherwise it is the wrapped FS's answer, and no more than a Space
// injector has left.
func (e *errFS) FreeSpace(dir string) (int64, error) {
	if err := e.inj.MaybeError(Op{Kind: OpStatFS, Path: dir}); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return 0, nil
		}
		return 0, fmt.Errorf("errorfs: statfs %s: %w", dir, err)
	}
	free, err := vfs.FreeSpace(e.fs, dir)
	if l, ok := e.inj.(interface{ Left() int64 }); ok {
		if errors.Is(err, vfs.ErrNoSpaceQuery) {
			free, err = l.Left(), nil
		}
		free = min(free, l.Left())
	}
	return free, err
}

type errFile struct {
	f    vfs.File
	fs   *errFS
	name string
}

func (f *errFile) ReadAt(b []byte, off int64) (int, error) {
	if err := f.fs.check(Op{Kind: OpRead, Path: f.name, Off: off, Len: int64(len(b))}); err != nil {
		return 0, err
	}
	return f.f.ReadAt(b, off)
}

func (f *errFile) WriteAt(b []byte, off int64) (int, error) {
	err := f.fs.inj.MaybeError(Op{Kind: OpWrite, Path: f.name, Off: off, Len: int64(len(b))})
	if err == nil {
		return f.f.WriteAt(b, off)
	}
	var sw *ShortWriteError
	if errors.As(err, &sw) && sw.N < int64(len(b)) {
		n, werr := f.f.WriteAt(b[:max(sw.N, 0)], off)
		if werr != nil {
			return n, werr
		}
		return n, io.ErrShortWrite
	}
	return 0, fmt.Errorf("errorfs: write %s: %w", f.name, err)
}

func (f *errFile) Sync() error {
	if err := f.fs.check(Op{Kind: OpSync, Path: f.name}); err != nil {
		return err
	}
	return f.f.Sync()
}

func (f *errFile) Truncate(size int64) error {
	if err := f.fs.check(Op{Kind: OpTruncate, Path: f.name, Off: size}); err != nil {
		return err
	}
	return f.f.Truncate(size)
}

func (f *errFile) Allocate(off, n int64) error {
	if err := f.fs.check(Op{Kind: OpAllocate, Path: f.name, Off: off, Len: n}); err != nil {
		return err
	}
	return f.f.Allocate(off, n)
}

func (f *errFile) Stat() (os.FileInfo, error) { return f.f.Stat() }
func (f *errFile) Close() error               { return f.f.Close() }
