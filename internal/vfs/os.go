package vfs

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// OS is the operating system's file system.
var OS FS = osFS{}

type osFS struct{}

type osFile struct{ *os.File }

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Rename(oldname, newname string) error        { return os.Rename(oldname, newname) }
func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) ReadDir(dir string) ([]os.DirEntry, error)   { return os.ReadDir(dir) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFS) Stat(name string) (os.FileInfo, error)       { return os.Stat(name) }

// FreeSpace is statfs(2) of dir: the blocks available to an unprivileged
// user (f_bavail; the blocks reserved for root do not count) times the
// block size. It reads the file system's counters: no disk IO.
func (osFS) FreeSpace(dir string) (int64, error) {
	var st unix.Statfs_t
	for {
		err := unix.Statfs(dir, &st)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, &os.PathError{Op: "statfs", Path: dir, Err: err}
		}
		return int64(st.Bavail) * int64(st.Bsize), nil
	}
}

// SyncDir fsyncs the directory, making its entries durable.
func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteAt is os.File's, but a write of BigWrite bytes or more enters the
// kernel as a blocking system call (pwrite): its P is handed off at once.
func (f osFile) WriteAt(b []byte, off int64) (int, error) {
	if len(b) < BigWrite {
		return f.File.WriteAt(b, off)
	}
	if off < 0 {
		return 0, &os.PathError{Op: "writeat", Path: f.Name(), Err: errors.New("negative offset")}
	}
	n, err := pwrite(int(f.Fd()), b, off)
	if err != nil {
		return n, &os.PathError{Op: "write", Path: f.Name(), Err: err}
	}
	return n, nil
}

// Sync is fdatasync: the data and the size, not the other metadata.
func (f osFile) Sync() error {
	for {
		err := fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}

// Allocate is fallocate (mode 0: the file grows to off+n with zeros);
// where the file system has no fallocate it writes nothing and lets the
// file grow with the writes.
func (f osFile) Allocate(off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), 0, off, n)
		switch err {
		case nil:
			return nil
		case unix.EINTR:
			continue
		case unix.EOPNOTSUPP:
			st, serr := f.File.Stat()
			if serr != nil {
				return serr
			}
			if st.Size() < off+n {
				return f.File.Truncate(off + n)
			}
			return nil
		default:
			return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
		}
	}
}
