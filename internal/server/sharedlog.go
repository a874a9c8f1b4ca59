package server

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/wal"
)

// SharedLog is a process's one log (wal.Mux, docs/dev/durability-plan.md,
// "One log per process"): every durable replica of the process writes its
// records as one stream of it (stream id: the replica's node id), so that
// one fdatasync covers the batches of all of them. The process opens it
// before its replicas (OpenSharedLog); each replica's OpenDurableShared
// takes its stream's records and handle; the process closes it after
// every replica (Close). Disk snapshots stay per replica, each on a
// device of its own.
type SharedLog struct {
	// Dir is the log's directory.
	Dir string
	// Warnings are the recovery's lines to log (a torn tail cut back).
	Warnings []string

	mux     *wal.Mux
	rec     *wal.MuxRecovered // the log read back; nil once every replica took its stream (startAll)
	dev     *wal.FileDevice
	existed bool // Dir held log files before this start
	knobs   sharedKnobs
	// clock is the pollers' (Group.Now: the time base of the streams'
	// Polls), set once they run (setClock); the device's Continue reads
	// it. Unset: Continue polls at the last time a stream's Poll gave.
	clock atomic.Pointer[func() time.Duration]
	// wake is the pollers' Group.Kick, set once they run (setPollers):
	// after a completion the device wakes each poller once, which polls
	// every replica of it. Unset: it rings every stream's doorbell
	// (wal.Mux.Kick).
	wake atomic.Pointer[func()]
	// stats is dev, for Status (Close clears dev)
	stats *wal.FileDevice
}

// sharedKnobs are the shared log's planted bugs (tests only).
type sharedKnobs struct {
	// earlySynced: a replica's stream reports its records synced once
	// they are appended, before the Mux's batch holding them is written
	// and synced: sync mode acknowledges puts still in the process's
	// memory, and kill -9 loses them. TestSharedLogKill must catch it
	// ("acknowledged put ... lost").
	earlySynced bool
}

// OpenSharedLog reads back the shared log in dir (made if missing) of a
// process hosting the replicas ids (in map order; the first names the
// log: its segments' member is wal.MuxMember | ids[0]) and opens it for
// appends, on one device whose goroutine runs its IO. A log holding the
// records of a replica the process does not host is refused (those
// records would go stale while that replica runs elsewhere). Its errors
// are one line naming the directory and what to do.
func OpenSharedLog(fs vfs.FS, dir string, ids []rdma.NodeID, cfg DurableConfig) (*SharedLog, error) {
	return openSharedLog(fs, dir, ids, cfg, sharedKnobs{})
}

func openSharedLog(fs vfs.FS, dir string, ids []rdma.NodeID, cfg DurableConfig, knobs sharedKnobs) (*SharedLog, error) {
	if len(ids) == 0 {
		return nil, errors.New("server: a shared log of no replica")
	}
	if fs == nil {
		fs = vfs.OS
	}
	s := &SharedLog{Dir: dir, knobs: knobs}
	n, err := dirEntries(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("the shared log %s: %v", dir, err)
	}
	s.existed = n > 0
	member := wal.MuxMember | uint64(ids[0])
	if s.rec, err = wal.RecoverMux(fs, dir, member); err != nil {
		return nil, fmt.Errorf("the shared log in %s of replicas %v cannot be read (%v): move it aside and start every replica of the process with --rejoin (each catches up from its group: safe while a majority of every group is up elsewhere)", dir, ids, err)
	}
	for id := range s.rec.Streams {
		if !slices.Contains(ids, rdma.NodeID(id)) {
			return nil, fmt.Errorf("the shared log in %s holds records of replica %d, which this process (replicas %v) does not host: start the process with the replicas it ran with", dir, id, ids)
		}
	}
	s.Warnings = s.rec.Warnings
	mode := wal.Sync
	if cfg.Mode == broadcast.Async {
		mode = wal.Async
	}
	var mp atomic.Pointer[wal.Mux]
	s.dev = wal.NewFileDevice(fs, func() {
		if m := mp.Load(); m != nil {
			// On the device's goroutine: reap the completion and start
			// the next batch now, not when a poller gets a CPU (wal.Mux.Continue).
			var now time.Duration
			if c := s.clock.Load(); c != nil {
				now = (*c)()
			}
			m.Continue(now)
			// One sync covers every stream: each poller looks. One
			// wake per poller, not a ring per stream: the device
			// goroutine rang six doorbells after each fsync of an
			// embedded cluster (a futex system call each), and the
			// poller, woken by the first, often ran a pass and parked
			// again before the next, so that each ring woke it once
			// more while the next batch's write waited behind the
			// rings (Go trace, durability-plan's shop paragraph).
			if w := s.wake.Load(); w != nil {
				(*w)()
			} else {
				m.Kick()
			}
		}
	})
	if mode == wal.Sync {
		s.dev.SetPrepareSpin(SharedLogPrepareSpin)
	}
	s.mux, err = wal.OpenMux(s.dev, wal.Config{Dir: dir, Mode: mode, FsyncInterval: cfg.FsyncInterval, SegmentBytes: cfg.SegmentBytes, Member: member,
		GatherWindow: SharedLogGather, ZeroAhead: zeroAhead(mode)}, s.rec)
	if err != nil {
		s.dev.Close()
		return nil, fmt.Errorf("open the shared log in %s: %v", dir, err)
	}
	s.stats = s.dev
	mp.Store(s.mux)
	// Its device continues the log after each completion from now on
	// (above): the streams' Polls skip the log's mutex while nothing can
	// happen (wal.Mux.SetDeviceContinues; Async only).
	s.mux.SetDeviceContinues()
	return s, nil
}

// setPollers gives the log the pollers' one wake for all (Group.Kick;
// nil-safe): from now on a completion wakes each poller once.
func (s *SharedLog) setPollers(kick func()) {
	if s != nil {
		s.wake.Store(&kick)
	}
}

// setClock gives the log the pollers' clock (the time base of the
// streams' Polls; nil-safe).
func (s *SharedLog) setClock(now func() time.Duration) {
	if s != nil {
		s.clock.Store(&now)
	}
}

// SharedLogPrepareSpin is how long, in sync mode, the shared log's device
// goroutine looks for a batch once a record opened one at an idle log
// (wal.FileDevice.Prepare): it wakes then, while the poller gathers the
// group's other records and ends its pass, instead of at the Submit. At
// one writer that pass took p50 24-250 µs in a Go trace under load; a
// batch that takes longer (a gather held to its window) finds the
// goroutine asleep again and wakes it as before.
const SharedLogPrepareSpin = 300 * time.Microsecond

// SharedLogGather is the shared log's wal.Config.GatherWindow in sync mode.
// A batch holding a group's record waits for the group's other replicas
// in this process until each appended or was polled through one whole
// Poll without (the gather, wal/gather.go: no clock); the window only
// bounds a hold on a replica that is not polled at all (stopped on a disk
// error, paused).
// It was the whole rule before (50 us): when the followers came in the
// poller's next pass and the pass took longer, their records missed
// the leader's batch and a commit waited for two fsyncs.
const SharedLogGather = time.Millisecond

// dirEntries is how many entries dir holds (0 if it does not exist).
func dirEntries(fs vfs.FS, dir string) (int, error) {
	ents, err := fs.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	return len(ents), err
}

// stream is replica id's recovered records and its handle (kick: its
// doorbell, rung after every completion of the log's device), a stream
// of group's (the gather waits for a group's replicas in this process).
func (s *SharedLog) stream(id rdma.NodeID, group int, kick func()) (*wal.Recovered, broadcast.WAL) {
	st := s.mux.Stream(uint32(id), kick)
	st.JoinGroup(uint32(group))
	if s.knobs.earlySynced {
		return s.rec.For(uint32(id)), earlySynced{st}
	}
	return s.rec.For(uint32(id)), st
}

// earlySynced is the planted earlySynced bug: Synced is the stream's
// last appended record.
type earlySynced struct{ *wal.Stream }

func (e earlySynced) Synced() uint64 { return e.NextSeq() - 1 }

// sharedDir is the replica's shared log's directory ("" if none).
func (d *Durable) sharedDir() string {
	if d.Shared == nil {
		return ""
	}
	return d.Shared.Dir
}

// Close stops the log's device (call it once every replica on it is
// closed: each flushed its stream when it stopped).
func (s *SharedLog) Close() error {
	if s == nil || s.dev == nil {
		return nil
	}
	dev := s.dev
	s.dev = nil
	return dev.Close()
}

// SharedLogStatus is a process's shared log as /status shows it (once per
// process; each replica's disk status shows its stream's records and
// bytes).
type SharedLogStatus struct {
	Dir             string  `json:"dir"`
	Records         uint64  `json:"records"`   // records of every stream (and markers) appended since start
	Batches         uint64  `json:"batches"`   // batches synced
	WALBytes        uint64  `json:"wal_bytes"` // bytes of batches synced since start
	WALSegments     int     `json:"wal_segments"`
	WALSegmentBytes int64   `json:"wal_segment_bytes"`
	UnsyncedBytes   int64   `json:"unsynced_bytes"`
	Fsyncs          uint64  `json:"fsyncs"`
	FsyncP50        float64 `json:"fsync_p50_seconds"`
	FsyncP99        float64 `json:"fsync_p99_seconds"`
	DiskFull        uint64  `json:"disk_full"`
	// GatherHeld: batches the sync gather held for other streams'
	// records (wal.Config.GatherWindow); GatherTimedOut: of them, those
	// the window's end released.
	GatherHeld     uint64 `json:"gather_held"`
	GatherTimedOut uint64 `json:"gather_timed_out"`
	// GatherPassed: of the holds, those that ended because the replicas
	// still waited for were polled without a record (wal.Mux.GatherPassed).
	GatherPassed uint64 `json:"gather_passed"`
	// ContinueCalls: the device's completions it continued on its own
	// goroutine (wal.Mux.Continue); ContinueStarted: of them, those that
	// started the next batch (the rest found no record due).
	ContinueCalls   uint64 `json:"continue_calls"`
	ContinueStarted uint64 `json:"continue_started"`
	// The device (wal.DeviceStats): of the IOs that came to its
	// goroutine while it was idle, from the Submit to the start (its
	// wake-up), and from a completion that woke the pollers to that
	// Submit (the gap).
	DeviceStartP50   float64 `json:"device_start_p50_seconds"`
	DeviceStartP90   float64 `json:"device_start_p90_seconds"`
	DeviceStartCount uint64  `json:"device_starts"`
	DeviceGapP50     float64 `json:"device_gap_p50_seconds"`
	DeviceGapP90     float64 `json:"device_gap_p90_seconds"`
	DeviceGapP10     float64 `json:"device_gap_p10_seconds"`
	// DevicePrepares: batches that woke the idle device's goroutine when
	// their first record came (sync: wal.FileDevice.Prepare);
	// DevicePrepareHits: of them, those whose write came within
	// SharedLogPrepareSpin (the rest woke it again at the Submit).
	DevicePrepares    uint64 `json:"device_prepares"`
	DevicePrepareHits uint64 `json:"device_prepare_hits"`
	// PollSkips: the replicas' polls of the log that returned without
	// its mutex, nothing being due or able to complete (Async;
	// wal.Mux.Skipped).
	PollSkips uint64 `json:"poll_skips"`
}

// Status is the log's counters (any goroutine).
func (s *SharedLog) Status() *SharedLogStatus {
	if s == nil || s.mux == nil {
		return nil
	}
	st := s.mux.Stats()
	held, to := s.mux.GatherStats()
	cc, cs := s.mux.ContinueStats()
	var ds wal.DeviceStats
	if s.stats != nil {
		ds = s.stats.Stats()
	}
	return &SharedLogStatus{
		DeviceStartP50: quantile(&ds.Start, 0.5), DeviceStartP90: quantile(&ds.Start, 0.9), DeviceStartCount: ds.Start.N(), DeviceGapP50: quantile(&ds.Gap, 0.5), DeviceGapP90: quantile(&ds.Gap, 0.9), DeviceGapP10: quantile(&ds.Gap, 0.1), DevicePrepares: ds.Prepares, DevicePrepareHits: ds.PrepareHits, GatherHeld: held, GatherTimedOut: to, GatherPassed: s.mux.GatherPassed(), ContinueCalls: cc, ContinueStarted: cs, PollSkips: s.mux.Skipped(), Dir: s.Dir, Records: st.Records, Batches: st.Batches, WALBytes: st.BytesWritten, WALSegments: st.Segments,
		WALSegmentBytes: st.SegmentBytes, UnsyncedBytes: st.UnsyncedBytes, Fsyncs: st.Fsyncs, FsyncP50: quantile(&st.FsyncLatency, 0.5),
		FsyncP99: quantile(&st.FsyncLatency, 0.99), DiskFull: st.DiskFull}
}

func quantile(h *hist.Hist, q float64) float64 { return h.Quantile(q).Seconds() }
