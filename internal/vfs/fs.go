// Package vfs is the small file-system interface the write-ahead log and
// the snapshot store use, so that tests and the simulator can run the same
// code over files that lose unsynced data, tear writes and fail on demand.
//
// OS is the real file system (fdatasync for File.Sync, fallocate for
// File.Allocate, an fsync of the directory for SyncDir). Mem is an
// in-memory file system that keeps, per file, what was synced apart from
// what was only written, and per directory which names were made durable
// by SyncDir, so a test can "crash" it: drop the unsynced pages, tear the
// last write, forget unsynced renames (Mem.Crash).
package vfs

import (
	"errors"
	"github.com/rdmakv/rdmakv/internal/prefault"
	"io"
	"os"
)

// FS is what the log needs from a file system.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Rename(oldname, newname string) error
	Remove(name string) error
	ReadDir(dir string) ([]os.DirEntry, error)
	MkdirAll(dir string, perm os.FileMode) error
	// SyncDir makes the directory's entries durable: a file created,
	// renamed or removed in dir survives a crash only after it.
	SyncDir(dir string) error
	Stat(name string) (os.FileInfo, error)
}

// File is an open file. Sync makes the file's data durable (fdatasync),
// not its name (see FS.SyncDir).
type File interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Truncate(size int64) error
	// Allocate reserves [off, off+n) so later writes there do not need
	// new blocks; the file grows to off+n if it is shorter, with zeros.
	Allocate(off, n int64) error
	Stat() (os.FileInfo, error)
	Close() error
}

// ReadFile reads the whole of name.
func ReadFile(fs FS, name string) ([]byte, error) {
	return ReadFileInto(fs, name, func(n int) []byte {
		b := make([]byte, n)
		if n >= 1<<20 {
			// A snapshot file: its pages mapped at once, not one fault a
			// page in the read (issue 19).
			prefault.Populate(b)
		}
		return b
	})
}

// ReadFileInto reads the whole of name into get(its size): the bytes read,
// and on an error the buffer get gave (nil if it was not called), for its
// owner to take back.
func ReadFileInto(fs FS, name string, get func(n int) []byte) ([]byte, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := get(int(st.Size()))
	n, err := f.ReadAt(b, 0)
	if err == io.EOF && int64(n) == st.Size() {
		err = nil
	}
	return b[:n], err
}

// WriteFile creates (or truncates) name, writes b and syncs it. The name
// is durable only after SyncDir of its directory.
func WriteFile(fs FS, name string, b []byte) error {
	f, err := fs.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// SpaceFS is an FS that can say how much space is left for a directory's
// files (statfs). The write-ahead log asks it, on its device's goroutine,
// before it writes a probe record to find a full disk (wal.IOStatFS).
type SpaceFS interface {
	// FreeSpace is the bytes an unprivileged writer can still allocate
	// on the file system of dir (statfs: f_bavail x f_bsize).
	FreeSpace(dir string) (int64, error)
}

// ErrNoSpaceQuery: the FS cannot say how much space is left (it is not a
// SpaceFS).
var ErrNoSpaceQuery = errors.New("vfs: the file system does not report free space")

// FreeSpace asks fs (a SpaceFS) how much space is left for dir's files;
// ErrNoSpaceQuery if it cannot say.
func FreeSpace(fs FS, dir string) (int64, error) {
	if s, ok := fs.(SpaceFS); ok {
		return s.FreeSpace(dir)
	}
	return 0, ErrNoSpaceQuery
}
