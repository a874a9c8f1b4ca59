package sim

import (
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/wal"
)

// Files on a node's Disk. Besides its key-value pairs (Get, Put: durable at
// once), a Disk holds files: it is a vfs.FS, which a process uses
// synchronously at Start (recovery: read the log, cut a torn tail), and it
// gives each incarnation a wal.Device (Env.DiskDevice) for the run, whose
// IOs complete after seeded virtual latencies.
//
// The crash model is vfs.Mem's: a write lands in a volatile overlay; a
// Sync makes the file's bytes durable; a Create, Rename or Remove is
// volatile until a SyncDir of its directory. When the node crashes, every
// volatile 4 KiB page is kept or lost independently with probability 1/2,
// the last written page of each file keeps a random prefix of 512-byte
// sectors (a torn write), unsynced names revert, and the IOs still queued
// on the device never happen. The draws come from the disk's own random
// source (seeded by the run's seed and the node id), so runs that use no
// files draw nothing more from the simulator's.

// Default latencies of the disk device (virtual time).
const (
	DefaultSyncMin = 50 * time.Microsecond
	DefaultSyncMax = 500 * time.Microsecond
)

// DefaultCapacity is a disk's size until SetCapacity: 1 TiB, which no run
// fills.
const DefaultCapacity = 1 << 40

type diskFiles struct {
	mem              *vfs.Mem
	rng              *rand.Rand // the crash model's and the latencies' draws
	syncMin, syncMax time.Duration
	writePerKiB      time.Duration // added to a write's latency per KiB written (SetWriteCost)
	writePrefix      string        // to writes of files whose name starts with it
	fullPrefix       string        // SetFull: writes under it find no space
	full             bool
	fullOps          uint64 // IOs that failed with ENOSPC
	capacity         int64  // SetCapacity
}

func (d *Disk) fs() *vfs.Mem {
	if d.files == nil {
		d.files = &diskFiles{mem: vfs.NewMem(), rng: rand.New(rand.NewPCG(d.s.opts.Seed^0xd15cd15c, uint64(d.id))),
			syncMin: DefaultSyncMin, syncMax: DefaultSyncMax, capacity: DefaultCapacity}
	}
	return d.files.mem
}

// SetSyncLatency sets the range of a Sync's or SyncDir's virtual latency
// (a slow disk).
func (d *Disk) SetSyncLatency(lo, hi time.Duration) {
	d.fs()
	d.files.syncMin, d.files.syncMax = lo, max(hi, lo)
}

// SetWriteCost makes a write to a file whose name starts with prefix take
// perKiB longer for each KiB it writes (a log on a disk of limited
// bandwidth: large batches take long). It draws nothing from the disk's
// random source.
func (d *Disk) SetWriteCost(prefix string, perKiB time.Duration) {
	d.fs()
	d.files.writePrefix, d.files.writePerKiB = prefix, perKiB
}

// SetFull makes the disk full, or not, for files whose name starts with
// prefix (a full file system as errorfs's ENOSPC injector sees it, in
// virtual time): while full, a device write, preallocation or file
// creation there completes with ENOSPC and changes nothing; syncs,
// truncations, renames and removals still work. It draws nothing from
// the disk's random source. FullOps counts the IOs it failed.
func (d *Disk) SetFull(prefix string, full bool) {
	d.fs()
	d.files.fullPrefix, d.files.full = prefix, full
}

// SetCapacity sets the disk's size (DefaultCapacity until then): a device
// write or preallocation that would take the files' bytes past it
// completes with ENOSPC and changes nothing, and a free-space query
// (wal.IOStatFS) answers the capacity minus the bytes the files hold
// (vfs.Mem.Used). It draws nothing from the disk's random source.
func (d *Disk) SetCapacity(bytes int64) {
	d.fs()
	d.files.capacity = bytes
}

// Used is the bytes the disk's files hold now.
func (d *Disk) Used() int64 { return d.fs().Used() }

// Free is what a free-space query of dir answers now: 0 while SetFull
// covers files in dir, else the capacity minus the bytes the files hold.
func (d *Disk) Free(dir string) int64 {
	d.fs()
	f := d.files
	in := strings.TrimSuffix(dir, "/") + "/"
	if f.full && (strings.HasPrefix(in, f.fullPrefix) || strings.HasPrefix(f.fullPrefix, in)) {
		return 0
	}
	return max(f.capacity-f.mem.Used(), 0)
}

// FullOps is how many device IOs found the disk full (SetFull).
func (d *Disk) FullOps() uint64 {
	if d.files == nil {
		return 0
	}
	return d.files.fullOps
}

// noSpace reports whether op finds the disk full now (SetFull, or past
// the capacity).
func (f *diskFiles) noSpace(op wal.IO) bool {
	switch op.Kind {
	case wal.IOWrite, wal.IOAllocate, wal.IOCreate:
		if f.full && strings.HasPrefix(op.Path, f.fullPrefix) {
			return true
		}
	}
	end := op.Off + op.Len
	switch op.Kind {
	case wal.IOWrite:
		end = op.Off + int64(len(op.Data))
	case wal.IOAllocate:
	default:
		return false
	}
	var size int64
	if st, err := f.mem.Stat(op.Path); err == nil {
		size = st.Size()
	}
	return end > size && f.mem.Used()+end-size > f.capacity
}

// crash applies the crash model to the files (Sim.Crash calls it).
func (d *Disk) crash() {
	if d.files != nil {
		d.files.mem.Crash(d.files.rng)
	}
}

// Files returns a copy of the disk's files, current and durable state
// both: a checker may DropUnsynced or Crash it and recover it to see what
// a crash now would leave, without touching the node.
func (d *Disk) Files() *vfs.Mem { return d.fs().Clone() }

// vfs.FS, synchronous (for recovery at Start and for checkers).

func (d *Disk) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	return d.fs().OpenFile(name, flag, perm)
}
func (d *Disk) Rename(oldname, newname string) error        { return d.fs().Rename(oldname, newname) }
func (d *Disk) Remove(name string) error                    { return d.fs().Remove(name) }
func (d *Disk) ReadDir(dir string) ([]os.DirEntry, error)   { return d.fs().ReadDir(dir) }
func (d *Disk) MkdirAll(dir string, perm os.FileMode) error { return d.fs().MkdirAll(dir, perm) }
func (d *Disk) SyncDir(dir string) error                    { return d.fs().SyncDir(dir) }
func (d *Disk) Stat(name string) (os.FileInfo, error)       { return d.fs().Stat(name) }

var _ vfs.FS = (*Disk)(nil)

// DiskDevice is an incarnation's wal.Device on its node's Disk: IOs run in
// submission order, each when its virtual latency has passed after the
// previous one finished; a completion wakes the node (a Quiet IO's does
// not, as on the FileDevice). After a crash the
// device is dead: its queued IOs never run.
type DiskDevice struct {
	env  *Env
	disk *Disk
	x    *wal.Executor
	busy time.Duration // when the last submitted IO completes
	done []wal.Done
}

var _ wal.Device = (*DiskDevice)(nil)

// DiskDevice returns a new device on the node's disk for this incarnation.
func (e *Env) DiskDevice() *DiskDevice {
	d := e.n.disk
	return &DiskDevice{env: e, disk: d, x: wal.NewExecutor(d.fs())}
}

func (dev *DiskDevice) latency(k wal.IOKind) time.Duration {
	d := dev.disk.files
	switch k {
	case wal.IOSync, wal.IOSyncDir:
		return uniform(d.rng, d.syncMin, d.syncMax)
	case wal.IOWrite:
		return uniform(d.rng, 2*time.Microsecond, 20*time.Microsecond)
	}
	return uniform(d.rng, time.Microsecond, 5*time.Microsecond)
}

// Submit schedules op; it never refuses.
func (dev *DiskDevice) Submit(op wal.IO) bool {
	e := dev.env
	if !e.alive() {
		return true // a dead incarnation's IO never happens
	}
	s := e.s
	at := max(s.now, dev.busy) + dev.latency(op.Kind)
	if f := dev.disk.files; op.Kind == wal.IOWrite && f.writePerKiB > 0 && strings.HasPrefix(op.Path, f.writePrefix) {
		at += time.Duration(int64(len(op.Data)) * int64(f.writePerKiB) / 1024)
	}
	dev.busy = at
	s.At(at, func() {
		if !e.alive() {
			return
		}
		var done wal.Done
		switch f := dev.disk.files; {
		case op.Kind == wal.IOStatFS:
			done = wal.Done{Tag: op.Tag, Free: dev.disk.Free(op.Path)}
		case f.noSpace(op):
			f.fullOps++
			done = wal.Done{Tag: op.Tag, Err: syscall.ENOSPC}
		default:
			done = wal.Done{Tag: op.Tag, Err: dev.x.Do(op)}
		}
		dev.done = append(dev.done, done)
		if !op.Quiet { // as the FileDevice: the next IO's completion wakes it
			s.wake(e.n)
		}
	})
	return true
}

// Reap appends the completions so far.
func (dev *DiskDevice) Reap(dst []wal.Done) []wal.Done {
	dst = append(dst, dev.done...)
	dev.done = dev.done[:0]
	return dst
}
