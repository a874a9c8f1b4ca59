package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/internal/hist"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// IOKind is the kind of a device operation.
type IOKind uint8

const (
	IOWrite    IOKind = iota + 1 // write Data at Off of Path
	IOSync                       // fdatasync Path
	IOCreate                     // create Path (truncating an old file of that name)
	IOAllocate                   // preallocate [Off, Off+Len) of Path
	IORename                     // rename Path to To
	IORemove                     // remove Path
	IOSyncDir                    // fsync the directory Path
	IOTruncate                   // truncate Path to Off bytes
	IOStatFS                     // how much space is left for the directory Path's files (Done.Free): statfs, no disk IO
)

var ioNames = [...]string{"?", "write", "sync", "create", "allocate", "rename", "remove", "syncdir", "truncate", "statfs"}

func (k IOKind) String() string {
	if int(k) < len(ioNames) {
		return ioNames[k]
	}
	return fmt.Sprintf("io%d", k)
}

// IO is one device operation. The device owns Data until the operation
// completes.
type IO struct {
	Kind IOKind
	Path string
	To   string // IORename's new name
	Off  int64
	Len  int64 // IOAllocate's length
	Data []byte
	Tag  uint64
	// Quiet: the submitter needs no wake-up for this IO's completion
	// (the next IO it submitted follows right behind it and wakes it):
	// the FileDevice does not kick after it.
	Quiet bool

	at time.Duration // FileDevice.Submit's time (devClock)
}

// Done is a completed IO.
type Done struct {
	Tag uint64
	Err error
	// Free is an IOStatFS's answer: the bytes an unprivileged writer can
	// still allocate there (vfs.FreeSpace).
	Free int64
}

// Device runs IOs in the order they were submitted and reports their
// completions in that order. Neither method blocks.
type Device interface {
	// Submit queues op; false if the queue is full (retry at a later Poll).
	Submit(op IO) bool
	// Reap appends the completions that arrived since the last Reap.
	Reap(dst []Done) []Done
}

// Executor runs IOs synchronously on a vfs.FS, keeping the files it
// opened. The FileDevice's goroutine and the simulator's disk use it.
type Executor struct {
	FS    vfs.FS
	files map[string]vfs.File
}

// NewExecutor returns an Executor over fs.
func NewExecutor(fs vfs.FS) *Executor { return &Executor{FS: fs, files: map[string]vfs.File{}} }

func (x *Executor) file(path string) (vfs.File, error) {
	if f, ok := x.files[path]; ok {
		return f, nil
	}
	f, err := x.FS.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	x.files[path] = f
	return f, nil
}

func (x *Executor) drop(path string) {
	if f, ok := x.files[path]; ok {
		f.Close()
		delete(x.files, path)
	}
}

// Do runs op.
func (x *Executor) Do(op IO) error {
	switch op.Kind {
	case IOCreate:
		x.drop(op.Path)
		f, err := x.FS.OpenFile(op.Path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		x.files[op.Path] = f
		return nil
	case IOWrite:
		f, err := x.file(op.Path)
		if err != nil {
			return err
		}
		n, err := f.WriteAt(op.Data, op.Off)
		if err == nil && n < len(op.Data) {
			err = io.ErrShortWrite
		}
		return err
	case IOSync:
		f, err := x.file(op.Path)
		if err != nil {
			return err
		}
		return f.Sync()
	case IOAllocate:
		f, err := x.file(op.Path)
		if err != nil {
			return err
		}
		return f.Allocate(op.Off, op.Len)
	case IOTruncate:
		f, err := x.file(op.Path)
		if err != nil {
			return err
		}
		return f.Truncate(op.Off)
	case IORename:
		x.drop(op.Path)
		x.drop(op.To)
		return x.FS.Rename(op.Path, op.To)
	case IORemove:
		x.drop(op.Path)
		return x.FS.Remove(op.Path)
	case IOSyncDir:
		return x.FS.SyncDir(op.Path)
	case IOStatFS:
		_, err := vfs.FreeSpace(x.FS, op.Path)
		return err
	}
	return fmt.Errorf("wal: unknown IO kind %d", op.Kind)
}

// Run runs op and returns its completion (an IOStatFS's with its Free).
func (x *Executor) Run(op IO) Done {
	if op.Kind == IOStatFS {
		free, err := vfs.FreeSpace(x.FS, op.Path)
		return Done{Tag: op.Tag, Err: err, Free: free}
	}
	return Done{Tag: op.Tag, Err: x.Do(op)}
}

// Close closes every file the Executor opened.
func (x *Executor) Close() error {
	var errs []error
	for path, f := range x.files {
		errs = append(errs, f.Close())
		delete(x.files, path)
	}
	return errors.Join(errs...)
}

// FileDevice is the production Device: one goroutine runs the IOs in
// order on a vfs.FS, and kick wakes the poller after each completion
// (but a Quiet IO's).
type FileDevice struct {
	ops  chan IO
	kick func()
	x    *Executor

	mu    sync.Mutex
	done  []Done
	stats DeviceStats

	pending atomic.Int64 // IOs submitted and not completed (Gap: a write to an idle device)
	lastEnd atomic.Int64 // devClock at the end of the last completion that kicked

	// prep: Prepare's token (capacity 1); prepSpin: how long the woken
	// goroutine looks for the IO before it blocks again (0: Prepare does
	// nothing; SetPrepareSpin).
	prep     chan struct{}
	prepSpin atomic.Int64
	knobs    deviceKnobs

	stop chan struct{}
	wg   sync.WaitGroup
}

// deviceKnobs are the FileDevice's planted bugs (tests only).
type deviceKnobs struct {
	// prepareIgnored: Prepare does nothing, so the IO that follows still
	// wakes a sleeping goroutine. Caught by TestFileDevicePrepare
	// ("prepare:").
	prepareIgnored bool
	// prepareSkipsOp: an IO the prepared goroutine finds is not run (nor
	// completed). Caught by TestFileDevicePrepare ("order:").
	prepareSkipsOp bool
}

// Preparer is a Device that can be told an IO is coming (FileDevice):
// a Mux calls Prepare when a Sync batch's first record is appended while
// no batch is in flight, before the gather and the rest of the poller's
// pass, so that the device's goroutine is awake by the Submit.
type Preparer interface {
	Prepare()
}

// DeviceStats are a FileDevice's counters.
type DeviceStats struct {
	// Start: from an IO's Submit to its start on the device's goroutine,
	// for IOs that came to an idle device (the goroutine's wake-up); IOs
	// queued behind a running one are not counted.
	Start hist.Hist
	// Gap: from a completion that woke the submitter to the next write
	// submitted to an idle device (the time the next batch took to
	// come).
	Gap hist.Hist
	// Prepares: Prepare calls that woke the idle goroutine; PrepareHits:
	// of them, those whose IO came within the spin (SetPrepareSpin).
	Prepares, PrepareHits uint64
}

// FileDeviceQueue is how many IOs a FileDevice holds before Submit
// refuses.
const FileDeviceQueue = 64

// NewFileDevice starts the device's goroutine; Close stops it.
func NewFileDevice(fs vfs.FS, kick func()) *FileDevice {
	return newFileDevice(fs, kick, deviceKnobs{})
}

func newFileDevice(fs vfs.FS, kick func(), knobs deviceKnobs) *FileDevice {
	d := &FileDevice{ops: make(chan IO, FileDeviceQueue), kick: kick, x: NewExecutor(fs), prep: make(chan struct{}, 1), knobs: knobs, stop: make(chan struct{})}
	d.wg.Add(1)
	go d.run()
	return d
}

// SetPrepareSpin sets how long the goroutine, woken by Prepare, looks for
// the IO before it sleeps again (0, the default: Prepare does nothing).
func (d *FileDevice) SetPrepareSpin(spin time.Duration) { d.prepSpin.Store(int64(spin)) }

// Prepare says an IO will be submitted soon: a goroutine asleep on an
// idle device is woken now, and looks for it (yielding its processor
// between looks) for the prepare spin. One system call's wake-up of the
// device's thread, from a Submit to the IO's start (DeviceStats.Start:
// p50 51-131 µs under load here), then overlaps the submitter's own work
// up to the Submit instead of following it. It never blocks; nothing
// happens while an IO is queued or running, or with no spin set.
func (d *FileDevice) Prepare() {
	if d.prepSpin.Load() <= 0 || d.pending.Load() != 0 || d.knobs.prepareIgnored {
		return
	}
	select {
	case d.prep <- struct{}{}:
	default:
	}
}

// await is the prepared goroutine's look for the next IO: ok, it came
// within the spin; stop, Close was called.
func (d *FileDevice) await() (op IO, ok, stop bool) {
	end := devClock() + time.Duration(d.prepSpin.Load())
	for {
		select {
		case op = <-d.ops:
			return op, true, false
		case <-d.stop:
			return op, false, true
		default:
		}
		if devClock() >= end {
			return op, false, false
		}
		// Give the processor to the Go scheduler's and then the OS's
		// other runnable threads: a spin that kept its vCPU delayed the
		// poller or the client on a two-vCPU machine (x1 p50 1.2-1.7 ms
		// in half the pairs without chrt, durability-plan.md, sx2).
		runtime.Gosched()
		unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// devEpoch is devClock's origin.
var devEpoch = time.Now()

// devClock is the FileDevice's clock (monotonic).
func devClock() time.Duration { return time.Since(devEpoch) }

func (d *FileDevice) run() {
	defer d.wg.Done()
	var idleFrom time.Duration // the last IO's end
	for {
		var op IO
		select {
		case op = <-d.ops:
			// a token Prepare left while this IO was on its way is stale
			// (Prepare does nothing once an IO is pending)
			select {
			case <-d.prep:
			default:
			}
		case <-d.prep:
			var ok, stop bool
			op, ok, stop = d.await()
			d.mu.Lock()
			d.stats.Prepares++
			if ok {
				d.stats.PrepareHits++
			}
			d.mu.Unlock()
			if stop {
				return
			}
			if !ok {
				continue
			}
			if d.knobs.prepareSkipsOp {
				continue
			}
		case <-d.stop:
			return
		}
		start := devClock()
		if op.at >= idleFrom {
			d.mu.Lock()
			d.stats.Start.Record(start - op.at)
			d.mu.Unlock()
		}
		done := d.x.Run(op)
		d.mu.Lock()
		d.done = append(d.done, done)
		d.mu.Unlock()
		d.pending.Add(-1)
		if d.kick != nil && !op.Quiet {
			d.lastEnd.Store(int64(devClock()))
			d.kick()
		}
		idleFrom = devClock()
	}
}

// Stats returns the device's counters.
func (d *FileDevice) Stats() DeviceStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// Submit queues op without blocking.
func (d *FileDevice) Submit(op IO) bool {
	op.at = devClock()
	if op.Kind == IOWrite && d.pending.Load() == 0 {
		if end := d.lastEnd.Load(); end != 0 {
			d.mu.Lock()
			d.stats.Gap.Record(op.at - time.Duration(end))
			d.mu.Unlock()
		}
	}
	d.pending.Add(1)
	select {
	case d.ops <- op:
		return true
	default:
		d.pending.Add(-1)
		return false
	}
}

// Reap appends the completions so far.
func (d *FileDevice) Reap(dst []Done) []Done {
	d.mu.Lock()
	dst = append(dst, d.done...)
	d.done = d.done[:0]
	d.mu.Unlock()
	return dst
}

// Close stops the goroutine (IOs still queued are not run) and closes the
// files.
func (d *FileDevice) Close() error {
	close(d.stop)
	d.wg.Wait()
	return d.x.Close()
}
