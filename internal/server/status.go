// Package server is what kvserver runs around kv replicas: a poller that
// keeps each replica's state readable by other goroutines (Replica), the
// HTTP control port (status, Prometheus metrics, health, readiness, the
// cluster map, pprof), logging of role changes, and a replica process
// started from a cluster config (Run).
package server

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/wal"
)

// copyEvery is how often a Replica copies the state only its polling
// goroutine may read (table size and header, multicast counters).
const copyEvery = 50 * time.Millisecond

// Replica wraps a kv.Replica as the poller.Task its poller runs, and
// keeps a copy of its state for other goroutines (Status), at most
// copyEvery old. It also times each Poll that made progress (the work of
// ordering and applying a batch of requests) into a histogram.
type Replica struct {
	Group, Index int
	Node         rdma.NodeID
	r            *kv.Replica
	started      time.Time
	busy         prometheus.Histogram
	pollers      *poller.Group                          // the group polling it (Process), for /status and /metrics
	after        func(now time.Duration, progress bool) // ProcessConfig.AfterPoll
	dur          *Durable                               // nil: memory mode
	backups      *backups                               // the process's backup files
	// pendingBackup: markers whose capture the lateGroup knob put off
	// (polling goroutine).
	pendingBackup []kv.BackupMarker
	polls         pollStats    // polling goroutine
	stable        *timedStable // nil: not counted
	// saves is the process's Watch of disk snapshot saves (nil: none
	// counted): the replica opens an interval while its broadcast
	// replica has one under way (saving, polling goroutine), so that the
	// pollers count a leader's passes during any save of the process
	// apart (issue 19's bound), and PollMaxSaving its Polls in one.
	// readTook: OpenDurable's part of the recovery (durable modes)
	readTook time.Duration
	saves    *poller.Watch
	saving   bool
	saveBug  saveBug // planted (tests)
	// threadDetail: read the thread's counters around a Poll in a save
	// (ProcessConfig.SavePollDetail)
	threadDetail bool

	mu   sync.Mutex
	h    *poller.Handle // SetHandle: runs commands on the replica's poller
	last time.Duration
	tab  kv.Stats
	hdr  kv.Header
	mc   multicast.Counters
	dups uint64
	disk diskCopy // durable modes: the log's and snapshots' state
	// pollMax, pollRecent, pollSaving: the longest Polls (pollStats),
	// copied
	pollMax, pollRecent, pollSaving PollDetail
	pollSavingRead                  PollDetail
}

// diskCopy is what a durable replica's log writer and snapshot store
// show, copied on the polling goroutine.
type diskCopy struct {
	wal     wal.Stats
	snapOK  bool
	snapIdx uint64
	snapAt  broadcast.MsgHdr
	snap    broadcast.SnapWork
}

// NewReplica wraps replica i of group g.
func NewReplica(g, i int, node rdma.NodeID, r *kv.Replica) *Replica {
	return &Replica{Group: g, Index: i, Node: node, r: r, started: time.Now(), last: -time.Hour,
		busy: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rdmakv_poll_busy_seconds",
			Help:    "Duration of each poll of a replica that made progress: ordering, applying and replying to a batch of requests.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
		})}
}

// KV is the wrapped replica.
func (p *Replica) KV() *kv.Replica { return p.r }

// Poll implements poller.Task.
func (p *Replica) Poll(now time.Duration) bool {
	w0 := p.saves.Mark()
	// A Poll that starts while a save is open runs locked to its thread,
	// whose counters are read around it (PollDetail's thread_*): a few
	// µs, only during saves.
	// The reads lie inside the wall clock's: a thread's CPU time is never
	// more than the Poll's wall time.
	var th0, th1 threadSched
	watched := p.threadDetail && p.saves != nil && p.saves.Open() > 0
	t0 := time.Now()
	if watched {
		runtime.LockOSThread()
		th0 = readThreadSched()
	}
	m0 := p.mark()
	progress := p.r.Poll(now)
	if watched {
		th1 = readThreadSched()
		runtime.UnlockOSThread()
	}
	d := time.Since(t0)
	m0.th = th0
	if p.dur != nil {
		p.dur.unlockThread() // the capture's CPU clock kept the Poll on its thread
	}
	if p.saves != nil {
		p.watchSave(p.r.Multicast().Broadcast().DiskSnapSaving())
	}
	m1 := p.mark()
	m1.th = th1
	p.polls.note(now, d, m0, m1)
	if p.saves != nil && poller.WatchOverlaps(w0, p.saves.Mark()) {
		p.polls.noteSaving(d, m0, m1)
	}
	if len(p.pendingBackup) > 0 {
		p.backups.afterPoll(p)
	}
	if progress {
		p.busy.Observe(d.Seconds())
	}
	if now-p.last >= copyEvery {
		p.last = now
		tab, hdr, mc := p.r.Table().Stats(), p.r.Table().Header(), p.r.Multicast().Counters()
		d, _, _ := p.r.Multicast().Anomalies()
		var dc diskCopy
		if p.dur != nil {
			dc.wal = p.dur.WAL.Stats()
			dc.snapIdx, dc.snapAt, dc.snapOK = p.dur.Snapshots.Newest()
			dc.snap = p.r.Multicast().Broadcast().SnapWork()
		}
		p.mu.Lock()
		p.tab, p.hdr, p.mc, p.dups, p.disk = tab, hdr, mc, d, dc
		p.pollMax, p.pollRecent, p.pollSaving = p.polls.max, p.polls.recent(now), p.polls.saving
		p.pollSavingRead = p.polls.savingRead
		p.mu.Unlock()
	}
	if p.after != nil {
		p.after(now, progress)
	}
	return progress
}

// watchSave opens or closes the replica's interval in the process's
// Watch of saves as its disk snapshot work starts or ends (saving: a
// snapshot under way now; polling goroutine, or after the last Poll).
// The interval opens at the end of the Poll that captured, so the pass
// of the capture counts, and closes in the Poll that found the save
// durable, which counts too.
func (p *Replica) watchSave(saving bool) {
	if saving == p.saving || p.saves == nil || !saving && p.saveBug == saveNoEnd {
		return
	}
	p.saving = saving
	if saving {
		p.saves.Begin()
	} else {
		p.saves.End()
	}
}

// WatchesPasses implements poller.PassWatcher: the passes of a leader's
// poller that overlap a save count apart (/status save_pass_max_us).
func (p *Replica) WatchesPasses() bool {
	_, ok := p.r.Multicast().Broadcast().Leading()
	return ok && p.saveBug != saveNoLeader
}

// NextDeadline implements poller.Task.
func (p *Replica) NextDeadline() time.Duration { return p.r.NextDeadline() }

// HeartbeatInterval implements poller.Heartbeater.
func (p *Replica) HeartbeatInterval() time.Duration { return p.r.HeartbeatInterval() }

// ReplicaStatus is a replica's state as the control port shows it (GET
// /status; docs/operations.md has the schema). Its JSON keys are
// snake_case, and epochs are numbers, round << 32 | leader node, as in
// kvcli status --json.
type ReplicaStatus struct {
	Group int         `json:"group"`
	Index int         `json:"index"`
	Node  rdma.NodeID `json:"node"`
	Role  string      `json:"role"` // electing, follower, leader
	// Epoch is the epoch it is in (formatted (round,leader) by %s),
	// Round its round.
	Epoch   broadcast.Epoch `json:"epoch"`
	Round   uint32          `json:"round"`
	Leader  rdma.NodeID     `json:"leader,omitempty"` // 0 while electing
	Serving bool            `json:"serving"`          // leads and serves linearizable gets
	// ENew is the epoch it promised (E_new: a vote or the epoch it
	// follows); Accepted and Committed are its protocol headers
	// (kvserver force-new-cluster reads them).
	ENew      broadcast.Epoch `json:"e_new"`
	Accepted  Hdr             `json:"accepted"`
	Committed Hdr             `json:"committed"`
	// Delivered counts entries delivered (ordered and applied); Applied
	// is the table's applied index (its header).
	Delivered  uint64 `json:"delivered"`
	Applied    uint64 `json:"applied"`
	CatchingUp bool   `json:"catching_up"`
	Records    int    `json:"records"`
	IndexBytes int    `json:"index_bytes"`
	HeapBytes  int    `json:"heap_bytes"`
	Migrating  bool   `json:"migrating"`
	// SnapshotMaxUs is the table's longest snapshot capture (on its
	// poller) since the start (kv.Stats.SnapshotMaxNs).
	SnapshotMaxUs float64 `json:"snapshot_max_us"`
	// PollMax is its longest Poll since the start and what it did (the
	// replica's share of its poller's pass_max_us); PollMaxRecent the
	// longest in the last 1 to 2 seconds (as of at most 50 ms ago);
	// PollMaxSaving its longest Poll since the start that overlapped a
	// disk snapshot's save of any replica of the process (a capture or a
	// file being written: its share of a save_pass_max_us).
	PollMax       PollDetail `json:"poll_max"`
	PollMaxRecent PollDetail `json:"poll_max_recent"`
	PollMaxSaving PollDetail `json:"poll_max_saving"`
	// PollMaxSavingRead is the longest of those whose thread was read
	// (PollDetail.Thread: the Poll started in a save): where its wall
	// time went, CPU, the OS's run queue, or neither.
	PollMaxSavingRead PollDetail `json:"poll_max_saving_read"`
	// Members is how this replica sees each member of its group.
	Members   []MemberStatus    `json:"members"`
	Counters  BroadcastCounters `json:"counters"`
	Multicast MulticastCounters `json:"multicast"`
	Uptime    string            `json:"uptime"`
	// HugePages is how the replica's regions (its table) are backed by
	// huge pages, and why (rdma.HugePagesOf its node).
	HugePages rdma.HugePages `json:"huge_pages"`
	// Durability is what the replica keeps on disk (memory, sync,
	// async); Durable the last accepted header on its disk (dA: what its
	// acknowledgements cover in sync mode; Accepted in memory mode).
	Durability string `json:"durability"`
	Durable    Hdr    `json:"durable"`
	// SeenIndex is the highest commit index this replica saw (async: a
	// recovery counts what was lost against it); RecoveryLost the
	// entries, at least, that the async recovery elections it won found
	// acknowledged before the outage and on no disk of the majority
	// (rdmakv_recovery_lost_entries_total), RecoveryElections how many
	// it won.
	SeenIndex         uint64 `json:"seen_index"`
	RecoveryLost      uint64 `json:"recovery_lost"`
	RecoveryElections uint64 `json:"recovery_elections"`
	// DiskError is the disk failure that stopped the replica (fail-stop).
	DiskError string `json:"disk_error,omitempty"`
	// DiskFull is, while the replica's log finds its disk full, the
	// log's error (the replica takes no new entry until a retry of the
	// write succeeds; it stays up and serves reads); RefusingWrites: it
	// leads and refuses writes for a full disk (its own, or too few
	// members' can log).
	DiskFull       string `json:"disk_full,omitempty"`
	RefusingWrites bool   `json:"refusing_writes,omitempty"`
	// Disk is its log's and snapshots' state (durable modes only).
	Disk *DiskStatus `json:"disk,omitempty"`
}

// DiskStatus is a durable replica's log and snapshots.
type DiskStatus struct {
	Dir string `json:"dir"`
	// SharedLog is the process's shared log the replica's log records
	// are a stream of ("": a log of its own in Dir/wal). Then WALBytes
	// and UnsyncedBytes are its stream's, and the segments, fsyncs and
	// disk-full counts the shared log's (/status shared_log: once).
	SharedLog       string  `json:"shared_log,omitempty"`
	WALBytes        uint64  `json:"wal_bytes"`    // bytes of batches synced since start
	WALSegments     int     `json:"wal_segments"` // live segment files
	WALSegmentBytes int64   `json:"wal_segment_bytes"`
	UnsyncedBytes   int64   `json:"unsynced_bytes"`
	Fsyncs          uint64  `json:"fsyncs"`
	FsyncP50        float64 `json:"fsync_p50_seconds"`
	FsyncP99        float64 `json:"fsync_p99_seconds"`
	DiskFull        uint64  `json:"disk_full"`
	// Snapshot is the newest durable disk snapshot's file ("" if none),
	// its size and age.
	Snapshot        string  `json:"snapshot,omitempty"`
	SnapshotIndex   uint64  `json:"snapshot_index,omitempty"`
	SnapshotBytes   int64   `json:"snapshot_bytes,omitempty"`
	SnapshotAge     float64 `json:"snapshot_age_seconds,omitempty"`
	RecoverySeconds float64 `json:"recovery_seconds"`
	Recovery        string  `json:"recovery"`
	// RecoveryReadSeconds is the reading part of RecoverySeconds: the
	// log and the snapshot read back and checked, the log's writer
	// opened; the rest is the replay (the snapshot restored into the
	// table, the log's records applied).
	RecoveryReadSeconds float64 `json:"recovery_read_seconds"`
	// Captures counts the disk snapshots captured on the poller since
	// the start; CaptureMaxUs is the longest capture's wall time,
	// CaptureCPUMaxUs the most CPU time one took on the polling thread
	// (its own work: the rest of a capture's wall time it waited for a
	// processor). Issue 19 bounds a capture's Poll by ET/20.
	Captures        uint64  `json:"captures"`
	CaptureMaxUs    float64 `json:"capture_max_us"`
	CaptureCPUMaxUs float64 `json:"capture_cpu_max_us"`
	// CaptureGateWaits counts the Polls at which the replica's capture
	// was due while another replica of the process saved a snapshot:
	// the process's replicas save one at a time (broadcast.SaveGate),
	// so the log grows past snapshot_log_bytes by what the others'
	// saves take.
	CaptureGateWaits uint64 `json:"capture_gate_waits"`
	// CaptureReadyWaits counts the Polls at which its capture was due
	// while its table's spare buffer for the index copy was being made
	// (the capture waits for it rather than fault a fresh copy in on
	// the poller).
	CaptureReadyWaits uint64 `json:"capture_ready_waits"`
}

// Hdr is a message header (broadcast.MsgHdr): an epoch and a count in it.
type Hdr struct {
	Epoch broadcast.Epoch `json:"epoch"`
	Count uint64          `json:"count"`
}

// String formats the header as broadcast.MsgHdr does: (round,leader):count.
func (h Hdr) String() string { return fmt.Sprintf("%v:%d", h.Epoch, h.Count) }

// BroadcastCounters are broadcast.Counters with snake_case JSON keys
// (ElectionsStarted: "elections_started"). It is the same struct, so a
// counter added to broadcast.Counters shows here with no edit.
type BroadcastCounters broadcast.Counters

// MarshalJSON writes every counter under its snake_case name.
func (c BroadcastCounters) MarshalJSON() ([]byte, error) {
	m := map[string]uint64{}
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if f := v.Field(i); f.CanUint() {
			m[snake(v.Type().Field(i).Name)] = f.Uint()
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads what MarshalJSON writes (unknown keys are ignored).
func (c *BroadcastCounters) UnmarshalJSON(b []byte) error {
	var m map[string]uint64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.CanUint() {
			f.SetUint(m[snake(v.Type().Field(i).Name)])
		}
	}
	return nil
}

// snake is a Go field name in snake_case: SnapshotFetchesFailed ->
// snapshot_fetches_failed.
func snake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// MulticastCounters are multicast.Counters with snake_case JSON keys.
type MulticastCounters struct {
	Ordered     uint64 `json:"ordered"`
	Batches     uint64 `json:"batches"` // log entries the ordered messages went in
	Forwarded   uint64 `json:"forwarded"`
	Retransmits uint64 `json:"retransmits"`
	Replies     uint64 `json:"replies"`
	Resets      uint64 `json:"resets"`
	Blocked     uint64 `json:"blocked"`
	Dropped     uint64 `json:"dropped"`
	Malformed   uint64 `json:"malformed"`
	FullNotices uint64 `json:"full_notices"` // disk-full notices to clients whose writes the group could not log
}

// MemberStatus is one member as a replica sees it.
type MemberStatus struct {
	Node      rdma.NodeID `json:"node"`
	State     string      `json:"state"`
	LinkUp    bool        `json:"link_up"`
	Committed uint64      `json:"committed"` // its committed count in its epoch
}

// Status is the replica's state now (any goroutine).
func (p *Replica) Status() ReplicaStatus { return p.status(true) }

// watchStatus is Status without what Watch never reads: the disk's
// counters (a copy of its latency histograms, their quantiles, an
// os.Stat of the snapshot), the multicast counters, the pollers' maxima,
// the uptime and the huge pages. Watch looks 20 to 50 times a second at every
// replica: the full Status was most of an idle embedded cluster's
// user CPU (issue 17).
func (p *Replica) watchStatus() ReplicaStatus { return p.status(false) }

func (p *Replica) status(full bool) ReplicaStatus {
	b := p.r.Multicast().Broadcast()
	bs := b.Status()
	_, serving := b.Leading()
	p.mu.Lock()
	tab, hdr := p.tab, p.hdr
	var mc multicast.Counters
	var dc diskCopy
	var pmax, precent, psaving, psread PollDetail
	if full {
		mc, dc, pmax, precent, psaving = p.mc, p.disk, p.pollMax, p.pollRecent, p.pollSaving
		psread = p.pollSavingRead
	}
	p.mu.Unlock()
	s := ReplicaStatus{Group: p.Group, Index: p.Index, Node: p.Node, Role: bs.Role.String(),
		Epoch: bs.ECur, Round: bs.ECur.Round(), Serving: serving,
		ENew: bs.ENew, Accepted: Hdr{bs.Accepted.E, bs.Accepted.Cnt}, Committed: Hdr{bs.Committed.E, bs.Committed.Cnt},
		Delivered: bs.Index, Applied: hdr.Applied, CatchingUp: bs.CatchingUp,
		Records: tab.Records, IndexBytes: tab.IndexBytes, HeapBytes: tab.HeapBytes, Migrating: tab.Migrating,
		SnapshotMaxUs: float64(tab.SnapshotMaxNs) / 1e3,
		Counters:      BroadcastCounters(bs.Counters)}
	if full {
		s.PollMax, s.PollMaxRecent, s.PollMaxSaving, s.PollMaxSavingRead = pmax, precent, psaving, psread
		s.Multicast, s.Uptime = MulticastCounters(mc), time.Since(p.started).Round(time.Second).String()
		s.HugePages = rdma.HugePagesOf(p.r.Table().Node())
	}
	if l, ok := bs.Leader(); ok {
		s.Leader = l
	}
	s.Durability, s.Durable = broadcast.Memory.String(), Hdr{bs.Durable.E, bs.Durable.Cnt}
	s.SeenIndex, s.RecoveryLost, s.RecoveryElections = bs.SeenIdx, bs.RecoveryLost, bs.RecoveryElections
	if bs.DiskErr != nil {
		s.DiskError = bs.DiskErr.Error()
	}
	if bs.DiskFull && bs.DiskFullErr != nil {
		s.DiskFull = bs.DiskFullErr.Error()
	}
	s.RefusingWrites = bs.GroupDiskFull
	if d := p.dur; d != nil {
		s.Durability = d.Mode.String()
	}
	if d := p.dur; d != nil && full {
		w := &dc.wal
		ds := &DiskStatus{Dir: d.Dir, SharedLog: d.sharedDir(), WALBytes: w.BytesWritten, WALSegments: w.Segments, WALSegmentBytes: w.SegmentBytes,
			UnsyncedBytes: w.UnsyncedBytes, Fsyncs: w.Fsyncs, FsyncP50: w.FsyncLatency.Quantile(0.5).Seconds(),
			FsyncP99: w.FsyncLatency.Quantile(0.99).Seconds(), DiskFull: w.DiskFull, RecoverySeconds: d.Took.Seconds(), Recovery: d.Summary, RecoveryReadSeconds: p.readTook.Seconds(),
			Captures: dc.snap.Captures, CaptureMaxUs: us(dc.snap.CaptureMax), CaptureCPUMaxUs: us(dc.snap.CaptureCPUMax),
			CaptureGateWaits: dc.snap.GateWaits, CaptureReadyWaits: dc.snap.ReadyWaits}
		if dc.snapOK {
			path := filepath.Join(d.Dir, "snap", broadcast.SnapName(dc.snapIdx, dc.snapAt))
			ds.Snapshot, ds.SnapshotIndex = path, dc.snapIdx
			if fi, err := os.Stat(path); err == nil {
				ds.SnapshotBytes, ds.SnapshotAge = fi.Size(), time.Since(fi.ModTime()).Seconds()
			}
		}
		s.Disk = ds
	}
	for _, m := range bs.Members {
		s.Members = append(s.Members, MemberStatus{Node: m.ID, State: m.State.String(), LinkUp: m.LinkUp || m.State == broadcast.MemberSelf, Committed: m.Committed.Cnt})
	}
	return s
}

// Ready reports whether the replica is ready to serve: its group has a
// leader and it is not catching up; otherwise why not.
func (s *ReplicaStatus) Ready() (bool, string) {
	leaderState := ""
	for _, m := range s.Members {
		if m.Node == s.Leader {
			leaderState = m.State
		}
	}
	switch {
	case s.DiskFull != "":
		return false, fmt.Sprintf("disk full: its log cannot write (%s); it takes no new writes until space returns", s.DiskFull)
	case s.RefusingWrites:
		return false, "disk full: it leads its group, and too few members' logs can write; its group refuses writes until space returns"
	case s.Leader == 0:
		return false, "its group is electing a leader"
	case leaderState == "unreachable" || leaderState == "unknown":
		// A follower cut off from its leader and from a majority keeps
		// following until a majority agrees the leader is gone.
		return false, fmt.Sprintf("its leader %d is %s (electing or cut off from a majority)", s.Leader, leaderState)
	case s.CatchingUp:
		return false, "it is catching up with its group"
	}
	return true, ""
}

// PollerStatus is one poller's counters (poller.PollerStats) as /status
// shows them: how often a process's pollers pass over their replicas,
// spin, park and are woken.
type PollerStatus struct {
	Poller   int    `json:"poller"`
	Tasks    int    `json:"tasks"`     // replicas it owns
	Passes   uint64 `json:"passes"`    // passes over them
	Spins    uint64 `json:"spins"`     // spin phases before a park
	SpinHits uint64 `json:"spin_hits"` // spin phases ended by a ring or a kick
	Parks    uint64 `json:"parks"`     // parks in the wait set
	Wakes    uint64 `json:"wakes"`     // parks ended by a ring or a kick (the rest timed out)
	// Probes are spins of a probe budget (a stream of messages a little
	// further apart than the spin budget), ProbeHits those a ring ended.
	Probes    uint64 `json:"probes"`
	ProbeHits uint64 `json:"probe_hits"`
	// PassMaxUs is its longest pass since the start in microseconds: the
	// longest any of its replicas (a leader too) waited for its next Poll
	// while the poller was busy. PassMaxRecentUs is the longest in the
	// last 1 to 2 seconds (poller.PassWindow): sampled every second, it
	// gives the longest pass of an interval (kvbench recover's
	// poll_max_us while a snapshot is written).
	PassMaxUs       float64 `json:"pass_max_us"`
	PassMaxRecentUs float64 `json:"pass_max_recent_us"`
	// The save passes (issue 19: no leader Poll over ET/20 while a
	// snapshot is written): the passes of this poller that overlapped a
	// disk snapshot's save of any replica of the process (from the
	// capture until the files are durable) while a replica of it led at
	// the pass's end. SavePasses counts them, SavePassesOver those longer
	// than SavePassBoundUs (the election timeout / 20);
	// SavePassMaxUs is the longest since the start, SavePassMaxRecentUs
	// in the last 1 to 2 seconds (as pass_max_recent_us).
	SavePasses          uint64  `json:"save_passes"`
	SavePassesOver      uint64  `json:"save_passes_over"`
	SavePassBoundUs     float64 `json:"save_pass_bound_us"`
	SavePassMaxUs       float64 `json:"save_pass_max_us"`
	SavePassMaxRecentUs float64 `json:"save_pass_max_recent_us"`
	// The spare P on demand (poller, "The spare P on demand"): Dense,
	// the poller's stream is dense now (only a process that takes its
	// spare P on demand looks: spare_p.on_demand); Spells, its busy
	// spells (a wake to the next park), BusySpells those with 16 or more
	// passes that made progress, and BusyShare their share (since the
	// start; the rule turns a poller dense at 6 busy spells in a window
	// of 32). Holds are parks that kept the poller's P (held parks),
	// HoldWakes those a ring or a kick ended.
	Dense      bool    `json:"dense"`
	Spells     uint64  `json:"spells"`
	BusySpells uint64  `json:"busy_spells"`
	BusyShare  float64 `json:"busy_share"`
	Holds      uint64  `json:"holds"`
	HoldWakes  uint64  `json:"hold_wakes"`
}

// SpareStatus is a process's spare P (poller.GroupConfig.SpareP) as
// /status shows it: whether its pollers take one more P than they are
// while one of them is dense (OnDemand), the setting asked for (Setting:
// spare_p "auto" or "off", ProcessConfig.SpareP), whether they hold it now (Held: GOMAXPROCS is pollers + 1 and
// they hold their parks), how many times they took it or gave it back
// (Switches, each one stop of the world), and GOMAXPROCS now. Holding
// is whether the pollers hold their P in parks now (Held, or a
// GOMAXPROCS already above the pollers at the start).
type SpareStatus struct {
	Setting    string `json:"setting,omitempty"`
	OnDemand   bool   `json:"on_demand"`
	Held       bool   `json:"held"`
	Holding    bool   `json:"holding"`
	Switches   uint64 `json:"switches"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

// groupOf is the poller group that runs reps (that of the first replica
// that has one: a process has one poller.Group), nil for none.
func groupOf(reps []*Replica) *poller.Group {
	for _, r := range reps {
		if r.pollers != nil {
			return r.pollers
		}
	}
	return nil
}

// pollerStatus is the counters of the pollers that run reps.
func pollerStatus(reps []*Replica) []PollerStatus {
	g := groupOf(reps)
	if g == nil {
		return nil
	}
	var out []PollerStatus
	for i, st := range g.Stats() {
		share := 0.0
		if st.Spells > 0 {
			share = float64(st.BusySpells) / float64(st.Spells)
		}
		out = append(out, PollerStatus{Poller: i, Tasks: st.Tasks, Passes: st.Passes, Spins: st.Spins,
			SpinHits: st.SpinHits, Parks: st.Parks, Wakes: st.Wakes, Probes: st.Probes, ProbeHits: st.ProbeHits,
			PassMaxUs: us(st.MaxPass), PassMaxRecentUs: us(st.RecentMaxPass),
			SavePasses: st.WatchedPasses, SavePassesOver: st.WatchedOver, SavePassBoundUs: us(g.WatchOver()),
			SavePassMaxUs: us(st.WatchedMaxPass), SavePassMaxRecentUs: us(st.WatchedRecentMaxPass),
			Dense: st.Dense, Spells: st.Spells, BusySpells: st.BusySpells, BusyShare: share,
			Holds: st.Holds, HoldWakes: st.HoldWakes})
	}
	return out
}

// spareStatus is the spare P of the pollers that run reps (nil for
// none).
func spareStatus(reps []*Replica) *SpareStatus {
	g := groupOf(reps)
	if g == nil {
		return nil
	}
	sp := g.Spare()
	return &SpareStatus{OnDemand: sp.OnDemand, Held: sp.Held, Holding: g.Holding(), Switches: sp.Switches, GOMAXPROCS: sp.Procs}
}
