package server

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rdmakv/rdmakv/internal/hist"
)

// NewRegistry is the control port's Prometheus registry: the Go runtime
// and process collectors, each replica's poll-time histogram, and a
// collector that reads every replica's Status (and the pollers'
// counters) at each scrape (so that the
// hot path keeps no counters of its own). Gets are one-sided reads that
// no replica sees: clients count them.
func NewRegistry(reps []*Replica) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range reps {
		prometheus.WrapRegistererWith(r.labels(), reg).MustRegister(r.busy)
	}
	reg.MustRegister(&collector{reps: reps})
	return reg
}

func (p *Replica) labels() prometheus.Labels {
	return prometheus.Labels{"group": strconv.Itoa(p.Group), "node": strconv.FormatUint(uint64(p.Node), 10)}
}

var replicaLabels = []string{"group", "node"}

func desc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc("rdmakv_"+name, help, append(append([]string(nil), replicaLabels...), extra...), nil)
}

var (
	dRole       = desc("role", "1 for the replica's current role (electing, follower, leader).", "role")
	dServing    = desc("serving", "1 while the replica leads its group and serves linearizable gets.")
	dRound      = desc("epoch_round", "Round of the epoch the replica is in.")
	dDelivered  = desc("delivered_total", "Entries (write requests) delivered and applied.")
	dApplied    = desc("applied_index", "The table's applied index.")
	dCatching   = desc("catching_up", "1 while the replica catches up with its group.")
	dRecords    = desc("records", "Records in the replica's table.")
	dBytes      = desc("table_bytes", "Bytes of the replica's table in registered memory.", "kind")
	dMembers    = desc("member_up", "1 if the replica's link to a member of its group is up.", "member")
	dElections  = desc("elections_started_total", "Times the replica started an election.")
	dElected    = desc("elected_total", "Epochs the replica won.")
	dRestored   = desc("snapshots_restored_total", "Snapshots the replica restored (catch-ups after a restart or a long absence).")
	dSnapSent   = desc("snapshots_sent_total", "Snapshots this replica, leading, served to members behind.")
	dDiffs      = desc("diffs_accepted_total", "Diffs accepted from new leaders (catch-ups from the log).")
	dReconnects = desc("reconnects_total", "Connections re-opened after breaking.")
	dDuplicates = desc("duplicates_total", "Requests delivered again (client retries) and not applied twice.")
	dOrdered    = desc("ordered_total", "Messages this replica ordered as its group's leader.")
	dReplies    = desc("replies_total", "Reply writes to clients.")
	dMalformed  = desc("malformed_total", "Client records refused as malformed.")

	dDurability  = desc("durability", "1 for what the replica keeps on disk (memory, sync, async).", "mode")
	dDiskStopped = desc("disk_stopped", "1 once a disk error stopped the replica (fail-stop: restart it once the disk is sound).")
	dWALBytes    = desc("wal_bytes_total", "Bytes of log batches written and synced.")
	dWALSegs     = desc("wal_segments", "Live log segment files.")
	dWALSegBytes = desc("wal_segment_bytes", "Preallocated bytes of the live log segments.")
	dUnsynced    = desc("wal_unsynced_bytes", "Log bytes appended and not yet synced.")
	dFsync       = desc("wal_fsync_seconds", "Latency of the log's fsyncs.")
	dDiskFull    = desc("wal_disk_full_total", "Log batches that found the disk full (writes wait; nothing is lost).")
	dDiskFullNow = desc("disk_full", "1 while the replica's log finds its disk full (it takes no new writes until space returns; it stays up).")
	dSnapAge     = desc("snapshot_age_seconds", "Age of the newest disk snapshot.")
	dSnapBytes   = desc("snapshot_bytes", "Size of the newest disk snapshot file.")
	dRecovery    = desc("recovery_seconds", "How long reading the log and snapshot back took at start.")
	dRecLost     = desc("recovery_lost_entries_total", "Entries acknowledged before a whole-group outage and found on no disk of the majority that recovered the group (async mode; a lower bound), counted by the recovery's winner.")

	pollerLabels = []string{"poller"}
	dPasses      = prometheus.NewDesc("rdmakv_poller_passes_total", "Passes of a poller over its replicas.", pollerLabels, nil)
	dSpins       = prometheus.NewDesc("rdmakv_poller_spins_total", "Spin phases of a poller before it parks.", pollerLabels, nil)
	dSpinHits    = prometheus.NewDesc("rdmakv_poller_spin_hits_total", "Spin phases ended by a doorbell ring or a kick (no park needed).", pollerLabels, nil)
	dParks       = prometheus.NewDesc("rdmakv_poller_parks_total", "Times a poller parked in its wait set.", pollerLabels, nil)
	dWakes       = prometheus.NewDesc("rdmakv_poller_wakes_total", "Parks ended by a doorbell ring or a kick (the others timed out).", pollerLabels, nil)
	dTasks       = prometheus.NewDesc("rdmakv_poller_tasks", "Replicas a poller owns.", pollerLabels, nil)
	dDense       = prometheus.NewDesc("rdmakv_poller_dense", "1 while a poller's stream is dense (its busy spells come back to back: many writers); only a process that takes its spare P on demand looks.", pollerLabels, nil)
	dSpells      = prometheus.NewDesc("rdmakv_poller_spells_total", "Busy spells of a poller (from a wake to its next park).", pollerLabels, nil)
	dBusySpells  = prometheus.NewDesc("rdmakv_poller_busy_spells_total", "Busy spells with 16 or more passes that made progress (the density rule's input).", pollerLabels, nil)
	dHolds       = prometheus.NewDesc("rdmakv_poller_held_parks_total", "Parks that kept the poller's P (held parks).", pollerLabels, nil)
	dSpareHeld   = prometheus.NewDesc("rdmakv_spare_p_held", "1 while the pollers hold their spare P (GOMAXPROCS pollers + 1, held parks) because a poller is dense.", nil, nil)
	dSwitches    = prometheus.NewDesc("rdmakv_spare_p_switches_total", "Times the pollers took their spare P or gave it back (each a stop of the world).", nil, nil)
)

type collector struct{ reps []*Replica }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dRole, dServing, dRound, dDelivered, dApplied, dCatching, dRecords, dBytes, dMembers,
		dElections, dElected, dRestored, dSnapSent, dDiffs, dReconnects, dDuplicates, dOrdered, dReplies, dMalformed,
		dPasses, dSpins, dSpinHits, dParks, dWakes, dTasks, dDense, dSpells, dBusySpells, dHolds, dSpareHeld, dSwitches,
		dDurability, dDiskStopped, dWALBytes, dWALSegs, dWALSegBytes, dUnsynced, dFsync, dDiskFull, dDiskFullNow, dSnapAge, dSnapBytes, dRecovery, dRecLost} {
		ch <- d
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	collectPollers(c.reps, ch)
	for _, r := range c.reps {
		s := r.Status()
		l := []string{strconv.Itoa(s.Group), strconv.FormatUint(uint64(s.Node), 10)}
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(l, extra...)...)
		}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
		}
		for _, role := range []string{"electing", "follower", "leader"} {
			gauge(dRole, b2f(s.Role == role), role)
		}
		gauge(dServing, b2f(s.Serving))
		gauge(dRound, float64(s.Round))
		counter(dDelivered, s.Delivered)
		gauge(dApplied, float64(s.Applied))
		gauge(dCatching, b2f(s.CatchingUp))
		gauge(dRecords, float64(s.Records))
		gauge(dBytes, float64(s.IndexBytes), "index")
		gauge(dBytes, float64(s.HeapBytes), "heap")
		for _, m := range s.Members {
			if m.Node != s.Node {
				gauge(dMembers, b2f(m.LinkUp), strconv.FormatUint(uint64(m.Node), 10))
			}
		}
		counter(dElections, s.Counters.ElectionsStarted)
		counter(dElected, s.Counters.Elected)
		counter(dRestored, s.Counters.SnapshotsRestored)
		counter(dSnapSent, s.Counters.SnapshotsSent)
		counter(dDiffs, s.Counters.DiffsAccepted)
		counter(dReconnects, s.Counters.Reconnects)
		counter(dDuplicates, s.Counters.Duplicates)
		counter(dOrdered, s.Multicast.Ordered)
		counter(dReplies, s.Multicast.Replies)
		counter(dMalformed, s.Multicast.Malformed)
		for _, m := range []string{"memory", "sync", "async"} {
			gauge(dDurability, b2f(s.Durability == m), m)
		}
		gauge(dDiskStopped, b2f(s.DiskError != ""))
		if d := s.Disk; d != nil {
			counter(dWALBytes, d.WALBytes)
			gauge(dWALSegs, float64(d.WALSegments))
			gauge(dWALSegBytes, float64(d.WALSegmentBytes))
			gauge(dUnsynced, float64(d.UnsyncedBytes))
			counter(dDiskFull, d.DiskFull)
			gauge(dDiskFullNow, b2f(s.DiskFull != ""))
			gauge(dRecovery, d.RecoverySeconds)
			counter(dRecLost, s.RecoveryLost)
			if d.Snapshot != "" {
				gauge(dSnapAge, d.SnapshotAge)
				gauge(dSnapBytes, float64(d.SnapshotBytes))
			}
			h := r.fsyncHist()
			buckets := map[float64]uint64{}
			for _, b := range fsyncBuckets {
				buckets[b.Seconds()] = h.CountBelow(b)
			}
			ch <- prometheus.MustNewConstHistogram(dFsync, h.N(), h.Sum().Seconds(), buckets, l...)
		}
	}
}

// collectPollers sends the metrics of the pollers that run reps and of
// their spare P.
func collectPollers(reps []*Replica, ch chan<- prometheus.Metric) {
	// The spare P first, as on /status (ServeControlWith).
	if s := spareStatus(reps); s != nil {
		ch <- prometheus.MustNewConstMetric(dSpareHeld, prometheus.GaugeValue, b2f(s.Held))
		ch <- prometheus.MustNewConstMetric(dSwitches, prometheus.CounterValue, float64(s.Switches))
	}
	for _, p := range pollerStatus(reps) {
		l := strconv.Itoa(p.Poller)
		for _, v := range []struct {
			d *prometheus.Desc
			n uint64
		}{{dPasses, p.Passes}, {dSpins, p.Spins}, {dSpinHits, p.SpinHits}, {dParks, p.Parks}, {dWakes, p.Wakes},
			{dSpells, p.Spells}, {dBusySpells, p.BusySpells}, {dHolds, p.Holds}} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), l)
		}
		ch <- prometheus.MustNewConstMetric(dTasks, prometheus.GaugeValue, float64(p.Tasks), l)
		ch <- prometheus.MustNewConstMetric(dDense, prometheus.GaugeValue, b2f(p.Dense), l)
	}
}

// fsyncBuckets are rdmakv_wal_fsync_seconds's upper bounds: 50µs to 100ms.
var fsyncBuckets = []time.Duration{50 * time.Microsecond, 100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond}

// fsyncHist is the log's fsync latencies as last copied.
func (p *Replica) fsyncHist() hist.Hist {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.disk.wal.FsyncLatency
}
