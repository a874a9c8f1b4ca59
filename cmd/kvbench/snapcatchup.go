package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/groupproc"
)

// The large-snapshot catch-up test (kvbench broadcast --snapshot-catchup,
// issue 7): a follower that comes back behind the leader's pruned Log
// catches up by a snapshot of a large state while a client keeps proposing
// at the leader.
//
//  1. A group (--soak-group, default shm:3; every replica its own process)
//     whose FSMs carry a --state-byte ballast (groupproc.Config.StateBytes,
//     captured copy on write), MaxLogEntries --snap-log and
//     MaxCatchUpLogEntries --snap-catchup-log, runs a closed-loop client at
//     the leader (--snap-window proposals of --snap-size bytes) for the
//     whole test. The client's latencies are cut into segments: warm-up
//     (500 ms), baseline (--snap-baseline), down, transfer, after.
//  2. A follower is killed with kill -9 and stays down until the leader's
//     Log is pruned past its commit point, the leader sees it unreachable
//     (an election timeout without its rows: until then the leader keeps
//     up to MaxCatchUpLogEntries for it, as for a member catching up) and
//     at least --snap-down.
//  3. It is restarted with its stable file (a restarted member, empty
//     memory), so the leader captures its FSM, persists it off the polling
//     goroutine and the member fetches it with one-sided reads. The
//     transfer segment runs from the restart until the member's delivered
//     index reaches the leader's index at the restart (the catch-up time);
//     then --snap-after more load.
//  4. The run fails unless the member caught up, restored a snapshot, no
//     election started after the initial one, and every member ends with
//     the same state (digest and ballast hash).

// snapRow is the test's summary (one JSON object with --json).
type snapRow struct {
	faultRow
	StateBytes           int64   `json:"state_bytes"`
	ElectionTimeoutNS    int64   `json:"election_timeout_ns"`
	MaxLogEntries        int     `json:"max_log_entries"`
	MaxCatchUpLogEntries int     `json:"max_catchup_log_entries"`
	CPUs                 int     `json:"cpus"`
	LoadAvg              string  `json:"load_avg"`
	DownNS               int64   `json:"down_ns"` // kill to restart
	CommittedDown        uint64  `json:"committed_down"`
	PrunedPast           bool    `json:"pruned_past"` // the leader's Log was pruned past the follower's commit point
	LeaderLogLenAtStart  int     `json:"leader_log_len_at_restart"`
	TargetIndex          uint64  `json:"target_index"` // the leader's index at the restart
	ReadyNS              int64   `json:"ready_ns"`     // restart to the process serving (its ballast allocated)
	CaughtUp             bool    `json:"caught_up"`
	CatchupNS            int64   `json:"catchup_ns"` // restart to index >= target
	FollowerIndex        uint64  `json:"follower_index"`
	CommittedTransfer    uint64  `json:"committed_transfer"`    // at the leader, restart to caught up
	TransferMBPerS       float64 `json:"transfer_mb_per_s"`     // state bytes / catch-up time
	CaptureAfterNS       int64   `json:"capture_after_ns"`      // restart to the leader's FSM capture
	PersistedAfterNS     int64   `json:"persisted_after_ns"`    // restart to the end of Persist
	RestoredAfterNS      int64   `json:"restored_after_ns"`     // restart to the follower's Restore
	LeaderPersistNS      int64   `json:"leader_persist_ns"`     // Persist's duration (on its own goroutine)
	LeaderMaxCaptureNS   int64   `json:"leader_max_capture_ns"` // the longest FSM.Snapshot call (in Poll)
	LeaderCaptures       uint64  `json:"leader_captures"`
	LeaderChunkCopies    uint64  `json:"leader_chunk_copies"` // copies on write while a capture was live
	LeaderMaxCopyNS      int64   `json:"leader_max_copy_ns"`  // the longest one (one Apply's extra time)

	// The client's commit latency at the leader, by segment.
	Baseline groupproc.SegmentResult `json:"baseline"`
	Down     groupproc.SegmentResult `json:"down"`
	Transfer groupproc.SegmentResult `json:"transfer"`
	After    groupproc.SegmentResult `json:"after"`
	// Transfer against baseline, and the transfer's longest commit gap as
	// a fraction of the election timeout.
	P99Ratio      float64 `json:"p99_ratio"`
	MaxGapFracET  float64 `json:"max_gap_frac_et"`
	LoadOpsPerS   float64 `json:"load_ops_per_s"` // the client's, whole test
	LoadFailed    uint64  `json:"load_failed"`
	LoadFirstErr  string  `json:"load_first_err,omitempty"`
	LeaderChanged bool    `json:"leader_changed"`

	// Elections started after the initial one (every member, the
	// restarted one's new incarnation included), and leader timeouts that
	// did not start one (pre-vote).
	ElectionsStarted  uint64 `json:"elections_started"`
	ElectionsDeferred uint64 `json:"elections_deferred"`

	// Status counters: the leader's and the restarted follower's.
	SnapshotsTaken        uint64 `json:"snapshots_taken"`
	SnapshotsSent         uint64 `json:"snapshots_sent"`
	SnapshotsRestored     uint64 `json:"snapshots_restored"`
	SnapshotFetchesFailed uint64 `json:"snapshot_fetches_failed"`
	SnapshotsRefused      uint64 `json:"snapshots_refused"`
	DiffsAccepted         uint64 `json:"diffs_accepted"`

	// The leader process's VmRSS: before the kill, at the restart, the
	// largest during the transfer (sampled every 20 ms), after; the
	// restarted follower's after.
	LeaderRSSBaseKB    int64  `json:"leader_rss_base_kb"`
	LeaderRSSRestartKB int64  `json:"leader_rss_restart_kb"`
	LeaderRSSPeakKB    int64  `json:"leader_rss_peak_kb"`
	LeaderRSSAfterKB   int64  `json:"leader_rss_after_kb"`
	FollowerRSSAfterKB int64  `json:"follower_rss_after_kb"`
	StatesEqual        bool   `json:"states_equal"`
	FinalIndex         uint64 `json:"final_index"`
	FinalStateHash     uint64 `json:"final_state_hash"`
}

// parseBytes parses a size: a number of bytes with an optional unit, B,
// KiB, MiB, GiB (or K, M, G: the same binary units).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suf string
		mul int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mul := int64(1)
	for _, u := range units {
		if v, ok := strings.CutSuffix(t, u.suf); ok {
			t, mul = strings.TrimSpace(v), u.mul
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mul {
		return 0, fmt.Errorf("bad size %q (want e.g. 256MiB, 16M, 1GiB, 4096)", s)
	}
	return n * mul, nil
}

// fmtBytes prints a byte count in binary units.
func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.4g MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.4g KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// runSnapCatchup runs the large-snapshot catch-up test.
func runSnapCatchup(o *bcastFlags, stdout, stderr io.Writer) error {
	spec := o.soakGroup
	if spec.n < 3 {
		return fmt.Errorf("broadcast: --snapshot-catchup: %v: needs at least 3 replicas", spec)
	}
	ctx := runCtx
	began := time.Now()
	since := func() time.Duration { return time.Since(began).Round(10 * time.Millisecond) }
	tuning := groupproc.Tuning{ElectionTimeout: o.commitET, MaxLogEntries: o.snapLog, MaxCatchUpLogEntries: o.snapCatchupLog}
	fmt.Fprintf(stderr, "kvbench broadcast --snapshot-catchup: %v group, %s state per replica, MaxLogEntries %d, MaxCatchUpLogEntries %d, election timeout %v; load average %s\n",
		spec, fmtBytes(o.state), o.snapLog, o.snapCatchupLog, o.commitET, loadAvg())
	g, hdr, err := openFaultGroup(ctx, o, tuning, func(c *groupproc.Config) { c.StateBytes = o.state }, "snapshot-catchup", o.snapWindow, o.snapSize)
	if err != nil {
		return fmt.Errorf("broadcast: snapshot catch-up: %w", err)
	}
	defer g.close()
	ldr, fol := hdr.Leader-1, hdr.Follower-1
	lpid := g.procs[ldr].Pid()
	row := snapRow{faultRow: hdr,
		StateBytes: o.state, ElectionTimeoutNS: int64(o.commitET),
		MaxLogEntries: o.snapLog, MaxCatchUpLogEntries: o.snapCatchupLog, CPUs: runtime.NumCPU()}

	// Elections so far: the initial one. Every later one counts.
	before := make([]broadcast.Status, spec.n)
	for i := range before {
		if before[i], err = g.status(ctx, i); err != nil {
			return fmt.Errorf("broadcast: snapshot catch-up: member %d status: %w", i+1, err)
		}
	}
	epoch := before[ldr].ECur
	fmt.Fprintf(stderr, "[%8v] group up: leader member %d (pid %d, epoch %v); client W=%d, %d B\n", since(), ldr+1, lpid, epoch, o.snapWindow, o.snapSize)

	type loadOut struct {
		r   groupproc.LoadResult
		err error
	}
	loadDone := make(chan loadOut, 1)
	lspec := groupproc.LoadSpec{Window: o.snapWindow, Size: o.snapSize, Duration: 100 * 365 * 24 * time.Hour, Samples: 1 << 16, Segments: true}
	go func() {
		r, err := g.load(ctx, ldr, lspec)
		loadDone <- loadOut{r, err}
	}()
	loadStopped := false
	stopLoad := func() (groupproc.LoadResult, error) {
		loadStopped = true
		if _, err := g.procs[ldr].Call(ctx, groupproc.Request{Cmd: groupproc.CmdStopLoad}); err != nil {
			return groupproc.LoadResult{}, err
		}
		select {
		case l := <-loadDone:
			return l.r, l.err
		case <-time.After(time.Minute):
			return groupproc.LoadResult{}, errors.New("the load did not end within a minute of stop-load")
		}
	}
	defer func() {
		if !loadStopped {
			stopLoad() // an early return: end the load before the group closes
		}
	}()
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l := <-loadDone:
			loadDone <- l
			return fmt.Errorf("the load at the leader ended early: %+v, %v", l.r, l.err)
		case <-time.After(d):
			return nil
		}
	}
	mark := func(label string) error {
		r, err := g.procs[ldr].Call(ctx, groupproc.Request{Cmd: groupproc.CmdMark, Data: label})
		if err == nil && r.Index != 1 {
			err = fmt.Errorf("%d loads marked, want 1", r.Index)
		}
		if err != nil {
			return fmt.Errorf("mark %s: %w", label, err)
		}
		return nil
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("broadcast: snapshot catch-up: %s: %w", what, err)
	}

	// Warm-up, then the baseline.
	if err := sleep(500 * time.Millisecond); err != nil {
		return fail("warm-up", err)
	}
	if err := mark("baseline"); err != nil {
		return fail("baseline", err)
	}
	if err := sleep(o.snapBaseline); err != nil {
		return fail("baseline", err)
	}
	if row.LeaderRSSBaseKB, err = rssKB(lpid); err != nil {
		return fail("leader RSS", err)
	}

	// Kill the follower, and wait until the Log is pruned past it.
	fst, err := g.status(ctx, fol)
	if err != nil {
		return fail("follower status", err)
	}
	if err := mark("down"); err != nil {
		return fail("kill", err)
	}
	killAt := time.Now()
	if err := g.kill(fol); err != nil {
		return fail(fmt.Sprintf("kill member %d", fol+1), err)
	}
	fmt.Fprintf(stderr, "[%8v] killed member %d (kill -9) at its index %d, committed %v\n", since(), fol+1, fst.Index, fst.Committed)
	var lst broadcast.Status
	pruneBound := time.Now().Add(o.catchupTimeout)
	for {
		if lst, err = g.status(ctx, ldr); err != nil {
			return fail("leader status", err)
		}
		row.PrunedPast = fst.Committed.Less(lst.Pruned)
		unreachable := fol < len(lst.Members) && lst.Members[fol].State == broadcast.MemberUnreachable
		if row.PrunedPast && unreachable && time.Since(killAt) >= o.snapDown {
			break
		}
		if time.Now().After(pruneBound) {
			return fail("down", fmt.Errorf("within %v of the kill, the leader's Log was not pruned past member %d's commit point %v (pruned %v, LogLen %d) or the leader does not see it unreachable (%v)",
				o.catchupTimeout, fol+1, fst.Committed, lst.Pruned, lst.LogLen, unreachable))
		}
		if err := sleep(10 * time.Millisecond); err != nil {
			return fail("down", err)
		}
	}
	fmt.Fprintf(stderr, "[%8v] leader's Log pruned past member %d, which it sees unreachable: leader index %d, pruned %v, LogLen %d\n", since(), fol+1, lst.Index, lst.Pruned, lst.LogLen)

	// Restart it with its stable file: empty memory, a higher incarnation.
	row.TargetIndex, row.LeaderLogLenAtStart = lst.Index, lst.LogLen
	row.CommittedDown = lst.Index - fst.Index
	if row.LeaderRSSRestartKB, err = rssKB(lpid); err != nil {
		return fail("leader RSS", err)
	}
	row.LeaderRSSPeakKB = row.LeaderRSSRestartKB
	if err := mark("transfer"); err != nil {
		return fail("restart", err)
	}
	restartAt := time.Now()
	row.DownNS = int64(restartAt.Sub(killAt))
	g.cfgs[fol].Start = broadcast.StartExisting
	if err := g.start(fol); err != nil {
		return fail(fmt.Sprintf("restart member %d", fol+1), err)
	}
	row.ReadyNS = int64(time.Since(restartAt))
	fmt.Fprintf(stderr, "[%8v] restarted member %d: serving after %v; catching up to index %d\n", since(), fol+1, time.Duration(row.ReadyNS).Round(time.Millisecond), row.TargetIndex)
	deadline := restartAt.Add(o.catchupTimeout)
	nextNote := time.Now().Add(time.Second)
	nextRSS := time.Now()
	var fs broadcast.Status
	for {
		if fs, err = g.status(ctx, fol); err != nil {
			return fail(fmt.Sprintf("restarted member %d", fol+1), err)
		}
		if fs.Index >= row.TargetIndex {
			row.CaughtUp, row.CatchupNS = true, int64(time.Since(restartAt))
			break
		}
		if time.Now().After(nextRSS) {
			if kb, err := rssKB(lpid); err == nil {
				row.LeaderRSSPeakKB = max(row.LeaderRSSPeakKB, kb)
			}
			nextRSS = time.Now().Add(20 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			break
		}
		if time.Now().After(nextNote) {
			state := "?"
			if ls, err := g.status(ctx, ldr); err == nil && fol < len(ls.Members) {
				state = ls.Members[fol].State.String()
			}
			fmt.Fprintf(stderr, "[%8v] catching up     member %d index %d of %d (catching up %v; leader serves it: %s); leader RSS peak %d KiB\n",
				since(), fol+1, fs.Index, row.TargetIndex, fs.CatchingUp, state, row.LeaderRSSPeakKB)
			nextNote = time.Now().Add(time.Second)
		}
		if err := sleep(2 * time.Millisecond); err != nil {
			return fail("catch-up", err)
		}
	}
	if !row.CaughtUp {
		return fail("catch-up", fmt.Errorf("member %d did not catch up within %v (index %d, the leader's at the restart %d)",
			fol+1, o.catchupTimeout, fs.Index, row.TargetIndex))
	}
	if err := mark("after"); err != nil {
		return fail("after", err)
	}
	if ls, err := g.status(ctx, ldr); err == nil {
		row.CommittedTransfer = ls.Index - row.TargetIndex
	}
	row.TransferMBPerS = float64(o.state) / 1e6 / time.Duration(row.CatchupNS).Seconds()
	fmt.Fprintf(stderr, "[%8v] member %d caught up after %v (index %d >= %d)\n", since(), fol+1, fmtDur(time.Duration(row.CatchupNS)), fs.Index, row.TargetIndex)
	if err := sleep(o.snapAfter); err != nil {
		return fail("after", err)
	}
	lr, lerr := stopLoad()
	if lerr != nil {
		return fail("load", lerr)
	}
	row.LoadOpsPerS, row.LoadFailed, row.LoadFirstErr = lr.OpsPerS, lr.Failed, lr.FirstErr
	for _, s := range lr.Segments {
		switch s.Label {
		case "baseline":
			row.Baseline = s
		case "down":
			row.Down = s
		case "transfer":
			row.Transfer = s
		case "after":
			row.After = s
		}
	}
	if row.Baseline.P99 > 0 {
		row.P99Ratio = float64(row.Transfer.P99) / float64(row.Baseline.P99)
	}
	row.MaxGapFracET = float64(row.Transfer.MaxGap) / float64(o.commitET)

	// Counters, elections, FSM timeline.
	after := make([]broadcast.Status, spec.n)
	for i := range after {
		if after[i], err = g.status(ctx, i); err != nil {
			return fail(fmt.Sprintf("member %d status", i+1), err)
		}
		c, c0 := after[i].Counters, before[i].Counters
		if i == fol {
			c0 = broadcast.Counters{} // a new process
		}
		row.ElectionsStarted += c.ElectionsStarted - c0.ElectionsStarted
		row.ElectionsDeferred += c.ElectionsDeferred - c0.ElectionsDeferred
		if after[i].ECur != epoch {
			row.LeaderChanged = true
		}
	}
	if after[ldr].Role != broadcast.Leader {
		row.LeaderChanged = true
	}
	lc, fc := after[ldr].Counters, after[fol].Counters
	row.SnapshotsTaken, row.SnapshotsSent = lc.SnapshotsTaken, lc.SnapshotsSent
	row.SnapshotsRestored, row.SnapshotFetchesFailed, row.SnapshotsRefused, row.DiffsAccepted = fc.SnapshotsRestored, fc.SnapshotFetchesFailed, fc.SnapshotsRefused, fc.DiffsAccepted
	row.FollowerIndex = after[fol].Index
	fsmStats := func(i int) (groupproc.FSMStats, error) {
		r, err := g.procs[i].Call(ctx, groupproc.Request{Cmd: groupproc.CmdFSMStats})
		if err == nil && r.FSM == nil {
			err = errors.New("reply without FSM stats")
		}
		if err != nil {
			return groupproc.FSMStats{}, err
		}
		return *r.FSM, nil
	}
	lfsm, err := fsmStats(ldr)
	if err != nil {
		return fail("leader FSM stats", err)
	}
	ffsm, err := fsmStats(fol)
	if err != nil {
		return fail("follower FSM stats", err)
	}
	rel := func(unixNS int64) int64 {
		if unixNS == 0 {
			return 0
		}
		return unixNS - restartAt.UnixNano()
	}
	row.CaptureAfterNS, row.PersistedAfterNS, row.RestoredAfterNS = rel(lfsm.CapturedAt), rel(lfsm.PersistedAt), rel(ffsm.RestoredAt)
	row.LeaderPersistNS, row.LeaderMaxCaptureNS, row.LeaderCaptures = lfsm.LastPersistNS, lfsm.MaxCaptureNS, lfsm.Captures
	row.LeaderChunkCopies, row.LeaderMaxCopyNS = lfsm.ChunkCopies, lfsm.MaxCopyNS
	if row.LeaderRSSAfterKB, err = rssKB(lpid); err != nil {
		return fail("leader RSS", err)
	}
	if row.FollowerRSSAfterKB, err = rssKB(g.procs[fol].Pid()); err != nil {
		return fail("follower RSS", err)
	}

	// Quiesced: every member reaches the same state, ballast included.
	var ds []groupproc.Digest
	eqBound := time.Now().Add(time.Minute)
	for {
		ds = ds[:0]
		for i := range spec.n {
			r, err := g.procs[i].Call(ctx, groupproc.Request{Cmd: groupproc.CmdDigest})
			if err == nil && r.Digest == nil {
				err = errors.New("reply without a digest")
			}
			if err != nil {
				return fail(fmt.Sprintf("member %d digest", i+1), err)
			}
			ds = append(ds, *r.Digest)
		}
		row.StatesEqual = true
		for _, d := range ds[1:] {
			row.StatesEqual = row.StatesEqual && d == ds[0]
		}
		if row.StatesEqual || time.Now().After(eqBound) {
			break
		}
		if err := sleep(50 * time.Millisecond); err != nil {
			return fail("digests", err)
		}
	}
	row.FinalIndex, row.FinalStateHash = ds[0].Index, ds[0].State
	row.LoadAvg = loadAvg()
	fmt.Fprintf(stderr, "[%8v] digests %v; load average %s\n", since(), ds, row.LoadAvg)

	if o.json {
		if err := json.NewEncoder(stdout).Encode(row); err != nil {
			return err
		}
	} else {
		printSnapCatchup(stdout, row, o)
	}
	switch {
	case row.ElectionsStarted > 0 || row.LeaderChanged:
		return fail("elections", fmt.Errorf("%d election(s) started after the initial one (leader changed: %v)", row.ElectionsStarted, row.LeaderChanged))
	case row.SnapshotsRestored == 0:
		return fail("catch-up", fmt.Errorf("member %d caught up without restoring a snapshot (counters %+v)", fol+1, fc))
	case !row.StatesEqual:
		return fail("states", fmt.Errorf("members' states differ after a minute: %v", ds))
	case row.LoadFailed > 0:
		return fail("load", fmt.Errorf("%d proposals failed: %s", row.LoadFailed, row.LoadFirstErr))
	}
	return nil
}

func printSnapCatchup(w io.Writer, r snapRow, o *bcastFlags) {
	fmt.Fprintf(w, "kvbench broadcast --snapshot-catchup --state %s  %s  %s, %d CPUs, %s\n", fmtBytes(r.StateBytes),
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), r.CPUs, runtime.Version())
	fmt.Fprintf(w, "%s:%d group (one OS process per replica), client at leader %d, W=%d, %d B; election timeout %v; MaxLogEntries %d, MaxCatchUpLogEntries %d\n",
		r.Fabric, r.Replicas, r.Leader, r.Window, r.Size, time.Duration(r.ElectionTimeoutNS), r.MaxLogEntries, r.MaxCatchUpLogEntries)
	fmt.Fprintf(w, "follower %d killed (kill -9), down %s (%d committed, Log pruned past it: %v), restarted with its stable file\n\n",
		r.Follower, fmtDur(time.Duration(r.DownNS)), r.CommittedDown, r.PrunedPast)
	catch := "NOT caught up"
	if r.CaughtUp {
		catch = fmt.Sprintf("caught up after %s (%.0f MB/s of state)", fmtDur(time.Duration(r.CatchupNS)), r.TransferMBPerS)
	}
	fmt.Fprintf(w, "catch-up: %s of state, %s (index >= %d, the leader's at the restart); serving after %s; leader captured at +%s (longest Snapshot call %s), persisted at +%s (Persist %s), follower restored at +%s\n",
		fmtBytes(r.StateBytes), catch, r.TargetIndex, fmtDur(time.Duration(r.ReadyNS)), fmtDur(time.Duration(r.CaptureAfterNS)),
		fmtDur(time.Duration(r.LeaderMaxCaptureNS)), fmtDur(time.Duration(r.PersistedAfterNS)), fmtDur(time.Duration(r.LeaderPersistNS)),
		fmtDur(time.Duration(r.RestoredAfterNS)))
	fmt.Fprintf(w, "snapshots: taken %d, sent %d (leader); restored %d, fetches failed %d, refused %d, diffs accepted %d (follower); leader copies on write %d (longest %s)\n",
		r.SnapshotsTaken, r.SnapshotsSent, r.SnapshotsRestored, r.SnapshotFetchesFailed, r.SnapshotsRefused, r.DiffsAccepted, r.LeaderChunkCopies, fmtDur(time.Duration(r.LeaderMaxCopyNS)))
	fmt.Fprintf(w, "elections started after the initial one: %d (deferred leader timeouts %d); leader changed: %v; states equal: %v (index %d, ballast hash %016x)\n",
		r.ElectionsStarted, r.ElectionsDeferred, r.LeaderChanged, r.StatesEqual, r.FinalIndex, r.FinalStateHash)
	fmt.Fprintf(w, "leader RSS KiB: baseline %d, at the restart %d, peak during the transfer %d, after %d; restarted follower after %d\n\n",
		r.LeaderRSSBaseKB, r.LeaderRSSRestartKB, r.LeaderRSSPeakKB, r.LeaderRSSAfterKB, r.FollowerRSSAfterKB)
	fmt.Fprintln(w, "leader commit latency (client at the leader), by segment (max at: since the segment began):")
	fmt.Fprintf(w, "  %-9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %7s\n", "segment", "length", "msgs/s", "p50", "p90", "p99", "p99.9", "max", "max at", "max gap", "failed")
	for _, s := range []struct {
		name string
		s    groupproc.SegmentResult
	}{{"baseline", r.Baseline}, {"down", r.Down}, {"transfer", r.Transfer}, {"after", r.After}} {
		at := "-"
		if s.s.MaxAtNS > 0 {
			at = "+" + fmtDur(time.Duration(s.s.MaxAtNS-s.s.StartNS))
		}
		fmt.Fprintf(w, "  %-9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %7d\n", s.name, fmtDur(time.Duration(s.s.EndNS-s.s.StartNS)), fmtOps(s.s.OpsPerS),
			fmtDur(s.s.P50), fmtDur(s.s.P90), fmtDur(s.s.P99), fmtDur(s.s.P999), fmtDur(s.s.Max), at, fmtDur(s.s.MaxGap), s.s.Failed)
	}
	fmt.Fprintf(w, "transfer p99 / baseline p99 = %.2fx; longest commit gap during the transfer = %.3f of the election timeout\n", r.P99Ratio, r.MaxGapFracET)
}
