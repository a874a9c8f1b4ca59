package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/reuse"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/wal"
)

// DurableConfig is what a replica keeps on disk besides its stable state
// (docs/deploy.md, "Durability"): the mode and its tuning. The zero value
// is memory mode (nothing kept, nothing opened).
type DurableConfig struct {
	// Mode is broadcast.Memory, Sync or Async.
	Mode broadcast.Durability
	// FsyncInterval bounds how long a record waits for its fsync in
	// async mode (default 10ms).
	FsyncInterval time.Duration
	// SnapshotLogBytes is how much log triggers a disk snapshot (default
	// broadcast's, 64 MiB).
	SnapshotLogBytes int64
	// SegmentBytes is a log segment's preallocated size (default wal's,
	// 64 MiB).
	SegmentBytes int64

	// images: the process's start reads disk snapshots into buffers of
	// this pool (broadcast.LoadForReuse; nil: fresh buffers).
	images *reuse.Pool
	// snapDev wraps the device member's disk snapshots are written
	// through (tests: a save held between its write and its fsync; nil:
	// none).
	snapDev func(member rdma.NodeID, d wal.Device) wal.Device
}

// ParseDurability reads a durability mode's name (memory, sync, async).
func ParseDurability(s string) (broadcast.Durability, error) {
	switch s {
	case "memory":
		return broadcast.Memory, nil
	case "sync":
		return broadcast.Sync, nil
	case "async":
		return broadcast.Async, nil
	}
	return 0, fmt.Errorf("durability %q: want memory, sync or async", s)
}

// Durable is a replica's durable state opened from its data directory:
// the log read back and its writer, the disk snapshots and their store.
// Apply hands them to the replica's broadcast configuration; Close
// releases the device once the replica is closed.
type Durable struct {
	Mode broadcast.Durability
	// Dir is the replica's data directory (wal/ and snap/ are in it).
	Dir string
	// LogDir is its log's directory: Dir/wal, or the process's shared
	// log (Shared).
	LogDir string
	// WAL is its log: a wal.Writer of its own, or its stream of the
	// process's shared log.
	WAL       broadcast.WAL
	Shared    *SharedLog // nil: a log of its own
	Snapshots *broadcast.SnapStore
	Recovery  *broadcast.Recovery
	// SnapshotLogBytes and FsyncInterval are passed on to
	// broadcast.Config.
	SnapshotLogBytes int64
	FsyncInterval    time.Duration
	// Summary is the recovery's log line ("recovered snapshot index N +
	// M log records in 1.42s"); Took how long reading took; Warnings the
	// lines recovery wants logged (a torn tail cut back, a corrupt
	// snapshot set aside).
	Summary  string
	Took     time.Duration
	Warnings []string

	dev   *wal.FileDevice
	start time.Time
	// locked counts the LockOSThread calls cpuClock made in the Poll
	// running (polling goroutine; Replica.Poll undoes them after it).
	locked int
	// cpuUnlocked: planted bug (tests): cpuClock does not keep the
	// goroutine on its thread.
	cpuUnlocked bool
	snapIdx     uint64
	snap        bool
	records     int
}

// OpenDurable opens replica member's durable state in dir (which must
// exist; its stable state is dir/stable): it reads back the log (wal/) and
// the disk snapshot (snap/) it continues, checks them, and opens the
// log's writer and the snapshot store on one device whose goroutine runs
// the IO and calls kick after each completion (the replica's doorbell).
// With cfg.Mode Memory it returns nil, nil and touches nothing. group
// names the replica's group in errors. Its errors are one line naming the
// file and what to do.
func OpenDurable(fs vfs.FS, dir string, member rdma.NodeID, group int, cfg DurableConfig, kick func()) (*Durable, error) {
	return OpenDurableShared(fs, dir, member, group, cfg, kick, nil)
}

// OpenDurableShared is OpenDurable whose log is replica member's stream
// of the process's shared log sh (nil: a log of its own in dir/wal): its
// records are read from what OpenSharedLog read back, and its disk
// snapshots keep their own device. A replica with a log of its own in
// dir/wal is refused (its records would be ignored).
func OpenDurableShared(fs vfs.FS, dir string, member rdma.NodeID, group int, cfg DurableConfig, kick func(), sh *SharedLog) (*Durable, error) {
	if cfg.Mode == broadcast.Memory {
		return nil, nil
	}
	t0 := time.Now()
	walDir, snapDir := filepath.Join(dir, "wal"), filepath.Join(dir, "snap")
	d := &Durable{Mode: cfg.Mode, Dir: dir, LogDir: walDir, Shared: sh, SnapshotLogBytes: cfg.SnapshotLogBytes, FsyncInterval: cfg.FsyncInterval}
	// A replica that ran in memory mode has a stable state and no log:
	// it may have acknowledged entries it has nowhere, so it must not
	// come back as a voter with an empty log. It boots catching up, as a
	// memory-mode restart does, and writes its log from the leader's diff.
	// (With a shared log: no log of its own, and the shared log did not
	// exist before this start.)
	ranInMemory := false
	if _, err := fs.Stat(filepath.Join(dir, "stable")); err == nil {
		if _, err := fs.Stat(walDir); errors.Is(err, os.ErrNotExist) && (sh == nil || !sh.existed) {
			ranInMemory = true
		}
	}
	// The log first: which snapshot recovery starts from depends on it
	// (broadcast.LoadFor: the one its last install names, not a newer
	// file that install replaced).
	var rec *wal.Recovered
	var err error
	if sh != nil {
		d.LogDir = sh.Dir
		if n, err := dirEntries(fs, walDir); err != nil || n > 0 {
			return nil, fmt.Errorf("replica %d: %s holds a log of its own (%d files, %v) but the process writes one shared log (%s): start it with the log it has (a data dir whose replicas have logs of their own keeps them), or move %s aside and start the replica with --rejoin", member, walDir, n, err, sh.Dir, walDir)
		}
		var w broadcast.WAL
		rec, w = sh.stream(member, group, kick)
		d.WAL = w
	} else if rec, err = wal.Recover(fs, walDir, uint64(member)); err != nil {
		return nil, fmt.Errorf("replica %d: the log in %s cannot be read (%v): %s", member, walDir, err, remedy(dir, group))
	}
	d.Warnings = append(d.Warnings, rec.Warnings...)
	snap, warns, err := broadcast.LoadForReuse(fs, snapDir, rec, cfg.images)
	d.Warnings = append(d.Warnings, warns...)
	if err != nil {
		return nil, fmt.Errorf("replica %d: read the snapshots in %s: %v", member, snapDir, err)
	}
	if err := fs.MkdirAll(snapDir, 0o700); err != nil {
		return nil, fmt.Errorf("replica %d: data dir: %w", member, err)
	}
	if ranInMemory {
		d.Recovery = &broadcast.Recovery{Repair: true, Reason: "it ran in memory mode before (a stable state and no log): catching up from its group"}
	} else if d.Recovery, err = broadcast.RecoverFrom(rec, snap); err != nil {
		if snap == nil && len(rec.Segments) > 0 && rec.Segments[0].FirstSeq > 1 {
			why := "no snapshot file"
			if len(warns) > 0 {
				why = strings.Join(warns, "; ")
			}
			return nil, fmt.Errorf("replica %d: no valid snapshot in %s (%s) and the log starts at record %d: refusing to start: %s", member, snapDir, why, rec.Segments[0].FirstSeq, remedy(dir, group))
		}
		return nil, fmt.Errorf("replica %d: the log in %s is corrupt (%v): %s", member, d.LogDir, err, remedy(dir, group))
	}
	d.dev = wal.NewFileDevice(fs, kick)
	snapDev := wal.Device(d.dev)
	if sh == nil {
		mode := wal.Sync
		if cfg.Mode == broadcast.Async {
			mode = wal.Async
		}
		var walDev wal.Device
		walDev, snapDev = wal.Share(d.dev)
		if d.WAL, err = wal.Open(walDev, wal.Config{Dir: walDir, Mode: mode, FsyncInterval: cfg.FsyncInterval, SegmentBytes: cfg.SegmentBytes, Member: uint64(member),
			ZeroAhead: zeroAhead(mode)}, rec); err != nil {
			d.dev.Close()
			return nil, fmt.Errorf("replica %d: open the log in %s: %v", member, walDir, err)
		}
	}
	if cfg.snapDev != nil {
		snapDev = cfg.snapDev(member, snapDev)
	}
	d.Snapshots = broadcast.NewSnapStore(snapDev, snapDir, uint64(member), snap)
	d.start, d.records = t0, len(rec.Records)
	if snap != nil {
		d.snap, d.snapIdx = true, snap.Index
	}
	d.Replayed()
	return d, nil
}

// logIdle reports that every record of the replica's log is synced.
func (d *Durable) logIdle() bool { return d.WAL.(interface{ Idle() bool }).Idle() }

// Replayed sets Took (from OpenDurable's start until now) and Summary:
// the caller calls it again once the replica replayed the log (New), so
// that both count the whole recovery.
func (d *Durable) Replayed() {
	d.Took = time.Since(d.start)
	var b strings.Builder
	b.WriteString("recovered ")
	if d.snap {
		fmt.Fprintf(&b, "snapshot index %d + ", d.snapIdx)
	}
	fmt.Fprintf(&b, "%d log records in %.2fs", d.records, d.Took.Seconds())
	if d.Recovery.Repair {
		fmt.Fprintf(&b, " (catching up from its group: %s)", d.Recovery.Reason)
	}
	d.Summary = b.String()
}

// remedy says what to do about a replica's unusable durable state.
func remedy(dir string, group int) string {
	return fmt.Sprintf("move %s aside and start the replica again with --rejoin: it catches up from its group (safe while a majority of group %d is up)", dir, group)
}

// Apply sets bc's durability fields (Durability, WAL, Recovery,
// Snapshots, SnapshotLogBytes, FsyncInterval). A nil Durable leaves bc in
// memory mode.
func (d *Durable) Apply(bc *broadcast.Config) {
	if d == nil {
		return
	}
	bc.Durability, bc.WAL, bc.Recovery, bc.Snapshots, bc.SnapshotLogBytes = d.Mode, d.WAL, d.Recovery, d.Snapshots, d.SnapshotLogBytes
	bc.StatClock = rdma.Mono // times the snapshot work in Poll (/status poll_max)
	bc.StatCPUClock = d.cpuClock
	bc.StatRunDelay = threadRunDelay
	if d.FsyncInterval > 0 {
		bc.FsyncInterval = d.FsyncInterval
	}
}

// cpuClock is broadcast.Config.StatCPUClock: the polling thread's CPU
// time, read before and after a disk snapshot's capture in one Poll.
// The two reads tell the capture's own work from the wall time it took
// (/status capture_cpu_us against capture_us) only if both are of the
// same thread, and Go's scheduler may move a goroutine it preempted to
// another thread (issue 19: a capture of 1.35 s on a loaded machine read
// 0 s of CPU). So the first read keeps the goroutine on its thread
// (LockOSThread, a few ns) until Replica.Poll returns (unlockThread):
// only a Poll that captures is locked, from the capture on. A Poll locked
// all the time would cost every preemption of a busy poller a hand-off
// between two threads (two wake-ups).
func (d *Durable) cpuClock() time.Duration {
	if !d.cpuUnlocked {
		runtime.LockOSThread()
		d.locked++
	}
	return threadCPU()
}

// unlockThread undoes cpuClock's LockOSThread calls (polling goroutine,
// after each Poll).
func (d *Durable) unlockThread() {
	for ; d.locked > 0; d.locked-- {
		runtime.UnlockOSThread()
	}
}

// RecoveredLine is the log line of an async recovery election that this
// replica won (broadcast.EventRecovered): where group went on from and
// how many entries, at least, were acknowledged before the outage and
// found on no disk of the majority that recovered it.
func RecoveredLine(group int, ev broadcast.Event, fsyncInterval time.Duration) string {
	if fsyncInterval <= 0 {
		fsyncInterval = broadcast.DefaultFsyncInterval
	}
	return fmt.Sprintf("group %d recovered at index %d: %d entries acknowledged before the outage were not found on the disks of a majority (async mode, fsync_interval %v)",
		group, ev.Index, ev.Lost, fsyncInterval)
}

// Close stops the device (IO still queued is not run: call it once the
// replica is closed, after Flush if the queue is to reach the disk).
func (d *Durable) Close() error {
	if d == nil || d.dev == nil {
		return nil
	}
	dev := d.dev
	d.dev = nil
	return dev.Close()
}

// zeroAhead is a log's Config.ZeroAhead in mode: in Sync, where every
// acknowledgement waits for the batch's fdatasync, the bytes ahead of
// the tail are zero-written beforehand, so that the fdatasync converts
// no unwritten extent (wal BenchmarkSync, 4000-byte records: p50 about
// half; 128-byte records, which start a new block once in ~20 batches,
// not told apart). Async's batches are large and nobody waits for
// their sync, and zero-writing ahead would write each log byte twice
// on the disk the async bound runs into: off.
func zeroAhead(mode wal.Mode) int64 {
	if mode == wal.Sync {
		return wal.DefaultZeroAhead
	}
	return 0
}
