package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Stale files of dead processes.
//
// Open removes the files of its own cluster that dead processes left, but a
// program that names a fresh cluster or directory on every run (a
// benchmark, a test) never opens the old one again, so what a killed run
// left stays in /dev/shm. SweepStale removes it from a directory, for every
// cluster, and MkdirOwned makes directories that SweepStale can recognise
// as rdmakv's and remove whole once their owner is dead.

// ownerFileName is the marker file of a directory made by MkdirOwned. It
// starts with filePrefix but names no node or region (parseFileName), so
// no cluster's cleanup mistakes it for one of its files.
const ownerFileName = filePrefix + "owner"

// Owner file layout (native-endian 8-byte words):
//
//	off  field
//	  0  magic   "RDMAKVOW"
//	  8  version (1)
//	 16  owner   process identity of the directory's creator (procIdent)
const (
	ownerMagic    = 0x574f564b414d4452 // "RDMAKVOW" little-endian
	ownerFileSize = 64
)

func encodeOwnerFile(b []byte, owner procIdent) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], ownerMagic)
	le.PutUint64(b[8:], layoutVersion)
	le.PutUint64(b[16:], uint64(owner))
}

// decodeOwnerFile validates the owner file b (the whole file).
func decodeOwnerFile(b []byte) (procIdent, error) {
	le := binary.LittleEndian
	switch {
	case len(b) != ownerFileSize:
		return 0, fmt.Errorf("%w: owner file of %d bytes, want %d", ErrCorrupt, len(b), ownerFileSize)
	case le.Uint64(b[0:]) != ownerMagic:
		return 0, fmt.Errorf("%w: owner file: bad magic %#x", ErrCorrupt, le.Uint64(b[0:]))
	case le.Uint64(b[8:]) != layoutVersion:
		return 0, fmt.Errorf("%w: owner file: layout version %d, want %d", ErrCorrupt, le.Uint64(b[8:]), layoutVersion)
	}
	return procIdent(le.Uint64(b[16:])), nil
}

// MkdirOwned creates a new directory in dir, named as os.MkdirTemp names
// it from pattern, and marks it as owned by the calling process (pid and
// start time, in a file named rdmakv.owner inside it). Use it for the
// directory of a cluster, and for anything else a run keeps in shared
// memory, so that SweepStale can remove the directory, with everything in
// it, once this process is dead and no live process has an rdmakv node or
// region file in it. Processes that create files in it should not outlive
// its owner (kill them with it, e.g. with a parent-death signal): a file a
// live process has not created yet cannot keep the directory.
func MkdirOwned(dir, pattern string) (string, error) {
	self, err := selfIdent()
	if err != nil {
		return "", err
	}
	d, err := os.MkdirTemp(dir, pattern)
	if err != nil {
		return "", fmt.Errorf("shm: %w", err)
	}
	b, err := createFile(d, ownerFileName, ownerFileSize, false, func(b []byte) { encodeOwnerFile(b, self) })
	if err != nil {
		os.Remove(d)
		return "", fmt.Errorf("shm: mark %s as owned: %w", d, err)
	}
	unix.Munmap(b)
	return d, nil
}

// SweepStale removes from dir what dead processes left there, and returns
// the paths it removed:
//
//   - node and region files of any cluster (rdmakv.<cluster>.…) whose owner
//     process, as recorded in the file's header, is dead;
//   - hidden temporary files of a file being created (.rdmakv.….<pid>.<ns>.tmp,
//     only where the file system has no O_TMPFILE) whose pid is gone;
//   - directories made by MkdirOwned whose owner is dead, with everything
//     in them, unless a node or region file anywhere below names a live
//     process.
//
// A process counts as dead only on evidence: no such pid, a zombie, or
// the pid now belongs to a process with another start time. Everything
// else is left alone: files of live processes, files whose owner cannot be
// determined (unreadable, foreign, corrupt), unmarked directories, and
// every file without an rdmakv name. The sweep holds dir's lock (the one
// Open holds), and each marked directory's while it removes it, so it does
// not race an Open there. It goes on after a failed removal (e.g. another
// user's file in a sticky /dev/shm) and returns the failures joined.
func SweepStale(dir string) (removed []string, err error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	if err := unix.Flock(dfd, unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("shm: lock directory %s: %w", dir, err)
	}
	defer unix.Flock(dfd, unix.LOCK_UN)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("shm: read directory %s: %w", dir, err)
	}
	var errs []error
	remove := func(path string) {
		switch err := os.Remove(path); {
		case err == nil:
			removed = append(removed, path)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("shm: remove stale %s: %w", path, err))
		}
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		switch {
		case e.Type().IsRegular() && fileOwnerDead(path, e.Name()):
			remove(path)
		case e.Type().IsRegular() && tmpFileDead(e.Name()):
			remove(path)
		case e.Type()&fs.ModeSymlink != 0:
			// A region file's link to its file in a HugeDir.
			if _, isRegion := parseAnyFileName(e.Name()); isRegion {
				if err := removeStaleLink(path); err != nil {
					errs = append(errs, err)
				} else if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
					removed = append(removed, path)
				}
			}
		case e.IsDir():
			if ok, err := sweepOwnedDir(path); err != nil {
				errs = append(errs, err)
			} else if ok {
				removed = append(removed, path)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// parseAnyFileName reports whether name is a node or region file of some
// cluster.
func parseAnyFileName(name string) (isNode, isRegion bool) {
	rest, ok := strings.CutPrefix(name, filePrefix)
	if !ok {
		return false, false
	}
	cluster, _, ok := strings.Cut(rest, ".")
	if !ok || !clusterRE.MatchString(cluster) {
		return false, false
	}
	_, isNode, isRegion = parseFileName(cluster, name)
	return isNode, isRegion
}

// fileOwner returns the owner recorded in the node or region file at path
// (named name); ok is false if name is no such file or its header cannot
// be read and validated.
func fileOwner(path, name string) (owner procIdent, ok bool) {
	isNode, isRegion := parseAnyFileName(name)
	switch {
	case isNode:
		h, _, err := readNodeFile(path)
		return h.owner, err == nil
	case isRegion:
		h, err := readRegionHeader(path)
		return h.owner, err == nil
	}
	return 0, false
}

// fileOwnerDead reports whether path is a node or region file whose owner
// is provably dead.
func fileOwnerDead(path, name string) bool {
	owner, ok := fileOwner(path, name)
	return ok && !owner.alive()
}

// tmpFileDead reports whether name is createFile's fallback temporary name
// (".<final name>.<pid>.<unix ns>.tmp") for an rdmakv file and its pid is
// gone. The name records no start time, so a pid that is in use again
// keeps the file (no evidence of death).
func tmpFileDead(name string) bool {
	rest, ok := strings.CutPrefix(name, "."+filePrefix)
	if !ok {
		return false
	}
	rest, ok = strings.CutSuffix(rest, ".tmp")
	if !ok {
		return false
	}
	parts := strings.Split(rest, ".")
	if len(parts) < 3 {
		return false
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if _, nerr := strconv.ParseUint(parts[len(parts)-1], 10, 64); err != nil || nerr != nil || pid <= 0 || pid >= 1<<pidBits {
		return false
	}
	if unix.Kill(pid, 0) != unix.ESRCH {
		return false
	}
	_, err = os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, fs.ErrNotExist)
}

// sweepOwnedDir removes dir, with everything in it, if MkdirOwned made it,
// its owner is dead and no node or region file below it names a live
// process. It looks and removes under dir's lock, the one Open of a cluster
// in dir takes, so an Open there either finishes first (and its live node
// file keeps the directory) or finds the directory gone.
func sweepOwnedDir(dir string) (bool, error) {
	b, size, err := readHead(filepath.Join(dir, ownerFileName), ownerFileSize)
	if err != nil || size != ownerFileSize {
		return false, nil // not ours, or unreadable: no evidence
	}
	owner, err := decodeOwnerFile(b)
	if err != nil || owner.alive() {
		return false, nil
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil
	}
	defer unix.Close(dfd)
	if err := unix.Flock(dfd, unix.LOCK_EX); err != nil {
		return false, fmt.Errorf("shm: lock directory %s: %w", dir, err)
	}
	defer unix.Flock(dfd, unix.LOCK_UN)
	live := false
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if o, ok := fileOwner(path, d.Name()); ok && o.alive() {
				live = true
				return filepath.SkipAll
			}
		}
		return nil
	})
	if err != nil || live {
		return false, nil // a live process's file, or we could not look everywhere
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("shm: remove stale %s: %w", dir, err)
	}
	return true, nil
}
