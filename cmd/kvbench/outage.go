package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/groupproc"
)

// The follower-outage test (kvbench broadcast --kill-follower): what a
// leader under load does while one follower is down for a long time, and
// how long the follower takes to catch up when it comes back.
//
//  1. A group (--soak-group, default shm:3; every replica its own process)
//     runs a closed-loop client at the leader (--soak-window proposals of
//     --soak-size bytes outstanding) for the whole test.
//  2. After --soak-warmup, the first follower is killed with kill -9 and
//     left down for --down. The leader process's VmRSS and Status (Index,
//     LogLen) are sampled at the kill, every --outage-every (a progress
//     line on stderr) and at the end of the outage; commits/s is the
//     leader's delivered index over the interval.
//  3. The follower is restarted with the same Config and stable file, so it
//     comes back as a restarted member (a higher incarnation), and the
//     time until its delivered index reaches the leader's index at the
//     restart is the catch-up time (bounded by --catchup-timeout).

// outageSample is one look at the leader.
type outageSample struct {
	ElapsedNS   int64   `json:"elapsed_ns"` // since the kill
	RSSKB       int64   `json:"rss_kb"`
	Index       uint64  `json:"index"`
	LogLen      int     `json:"log_len"`
	CommitsPerS float64 `json:"commits_per_s"` // since the previous sample
	Leads       bool    `json:"leads"`
}

// faultRow is what the rows of the broadcast fault tests (--kill-follower,
// --snapshot-catchup) begin with: the group, the load, and the members.
type faultRow struct {
	Bench     string `json:"bench"` // "broadcast"
	Table     string `json:"table"` // "outage", "snapshot-catchup"
	Fabric    string `json:"fabric"`
	Placement string `json:"placement"`
	Replicas  int    `json:"replicas"`
	Window    int    `json:"window"`
	Size      int    `json:"size"`
	Leader    int    `json:"leader"`   // member number (node id)
	Follower  int    `json:"follower"` // the member killed and restarted
}

// openFaultGroup opens the --soak-group group for a fault test (with
// adjust, if set, applied to each member's Config), waits for its leader,
// and returns the row header naming the leader and the follower the test
// kills (the member after the leader).
func openFaultGroup(ctx context.Context, o *bcastFlags, tuning groupproc.Tuning, adjust func(*groupproc.Config), table string, window, size int) (*bgroup, faultRow, error) {
	spec := o.soakGroup
	g, err := openGroupWith(ctx, spec, tuning, o.spin, o.shmDir, adjust)
	if err != nil {
		return nil, faultRow{}, err
	}
	ldr, err := g.leader(ctx, -1)
	if err != nil {
		g.close()
		return nil, faultRow{}, err
	}
	return g, faultRow{Bench: "broadcast", Table: table, Fabric: spec.fabric, Placement: placement(spec.fabric),
		Replicas: spec.n, Window: window, Size: size, Leader: ldr + 1, Follower: (ldr+1)%spec.n + 1}, nil
}

// outageRow is the test's summary (one JSON object with --json).
type outageRow struct {
	faultRow
	DownNS int64 `json:"down_ns"`

	// The leader's process and Status at the kill, at the end of the
	// outage (before the restart) and after the catch-up; the largest RSS
	// of any sample.
	RSSStartKB    int64   `json:"rss_start_kb"`
	RSSEndKB      int64   `json:"rss_end_kb"`
	RSSPeakKB     int64   `json:"rss_peak_kb"`
	RSSAfterKB    int64   `json:"rss_after_kb"`
	LogLenStart   int     `json:"log_len_start"`
	LogLenEnd     int     `json:"log_len_end"`
	LogLenAfter   int     `json:"log_len_after"`
	CommitsPerS   float64 `json:"commits_per_s"` // the leader's mean over the outage
	CommittedDown uint64  `json:"committed_down"`

	// The restart.
	Restarted         bool           `json:"restarted"` // came back with a higher incarnation
	IncarnationBefore uint64         `json:"incarnation_before"`
	IncarnationAfter  uint64         `json:"incarnation_after"`
	ReadyNS           int64          `json:"ready_ns"` // restart to the process serving
	CaughtUp          bool           `json:"caught_up"`
	CatchupNS         int64          `json:"catchup_ns"` // restart to index >= target
	TargetIndex       uint64         `json:"target_index"`
	FollowerIndex     uint64         `json:"follower_index"`
	LagAfter          int64          `json:"lag_after"` // leader index - follower index, read in turn after the catch-up
	SnapshotsRestored uint64         `json:"snapshots_restored"`
	DiffsAccepted     uint64         `json:"diffs_accepted"`
	LoadOpsPerS       float64        `json:"load_ops_per_s"` // the client's, whole test
	LoadFailed        uint64         `json:"load_failed"`
	LeaderChanged     bool           `json:"leader_changed"`
	Samples           []outageSample `json:"samples"`
}

// runOutage runs the follower-outage test.
func runOutage(o *bcastFlags, stdout, stderr io.Writer) error {
	spec := o.soakGroup
	if spec.n < 3 {
		return fmt.Errorf("broadcast: --kill-follower: %v: needs at least 3 replicas", spec)
	}
	ctx := runCtx
	g, hdr, err := openFaultGroup(ctx, o, groupproc.Tuning{ElectionTimeout: o.commitET}, nil, "outage", o.soakWindow, o.soakSize)
	if err != nil {
		return fmt.Errorf("broadcast: outage: %w", err)
	}
	defer g.close()
	ldr, fol := hdr.Leader-1, hdr.Follower-1
	lpid := g.procs[ldr].Pid()
	row := outageRow{faultRow: hdr, DownNS: int64(o.down)}
	fmt.Fprintf(stderr, "kvbench broadcast --kill-follower: %v group, client at the leader (member %d, pid %d), W=%d, %d B; member %d down for %v; load average %s\n",
		spec, ldr+1, lpid, o.soakWindow, o.soakSize, fol+1, o.down, loadAvg())

	// The load runs until it is stopped (stop-load) after the catch-up.
	type loadOut struct {
		r   groupproc.LoadResult
		err error
	}
	loadDone := make(chan loadOut, 1)
	lspec := groupproc.LoadSpec{Window: o.soakWindow, Size: o.soakSize, Duration: 100 * 365 * 24 * time.Hour, Samples: 1 << 16}
	go func() {
		r, err := g.load(ctx, ldr, lspec)
		loadDone <- loadOut{r, err}
	}()
	stopLoad := func() (groupproc.LoadResult, error) {
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
	if err := sleep(o.soakWarm); err != nil {
		return fmt.Errorf("broadcast: outage: warm-up: %w", err)
	}
	fst, err := g.status(ctx, fol)
	if err != nil {
		return fmt.Errorf("broadcast: outage: follower status: %w", err)
	}
	row.IncarnationBefore = fst.Incarnation

	var last outageSample
	var lastAt time.Time
	var killAt time.Time
	sample := func() (outageSample, broadcast.Status, error) {
		st, err := g.status(ctx, ldr)
		if err != nil {
			return outageSample{}, st, fmt.Errorf("leader status: %w", err)
		}
		kb, err := rssKB(lpid)
		if err != nil {
			return outageSample{}, st, err
		}
		now := time.Now()
		s := outageSample{ElapsedNS: int64(now.Sub(killAt)), RSSKB: kb, Index: st.Index, LogLen: st.LogLen, Leads: st.Role == broadcast.Leader}
		if !lastAt.IsZero() && now.After(lastAt) {
			s.CommitsPerS = float64(st.Index-last.Index) / now.Sub(lastAt).Seconds()
		}
		if !s.Leads {
			row.LeaderChanged = true
		}
		row.RSSPeakKB = max(row.RSSPeakKB, kb)
		last, lastAt = s, now
		row.Samples = append(row.Samples, s)
		return s, st, nil
	}
	progress := func(what string, s outageSample) {
		fmt.Fprintf(stderr, "[%8v] %-14s leader RSS %6d KiB  LogLen %7d  index %10d  %8s commits/s%s\n",
			time.Duration(s.ElapsedNS).Round(time.Second), what, s.RSSKB, s.LogLen, s.Index, fmtOps(s.CommitsPerS), leads(s.Leads))
	}

	killAt = time.Now()
	if err := g.kill(fol); err != nil {
		return fmt.Errorf("broadcast: outage: kill member %d: %w", fol+1, err)
	}
	s0, _, err := sample()
	if err != nil {
		return fmt.Errorf("broadcast: outage: %w", err)
	}
	row.RSSStartKB, row.LogLenStart = s0.RSSKB, s0.LogLen
	progress(fmt.Sprintf("killed %d", fol+1), s0)
	for {
		left := o.down - time.Since(killAt)
		if left <= 0 {
			break
		}
		if err := sleep(min(o.outageEvery, left)); err != nil {
			return fmt.Errorf("broadcast: outage: %w", err)
		}
		s, _, err := sample()
		if err != nil {
			return fmt.Errorf("broadcast: outage: %w", err)
		}
		progress("down", s)
	}
	end := last
	row.RSSEndKB, row.LogLenEnd = end.RSSKB, end.LogLen
	row.CommittedDown = end.Index - s0.Index
	if d := time.Duration(end.ElapsedNS - s0.ElapsedNS); d > 0 {
		row.CommitsPerS = float64(row.CommittedDown) / d.Seconds()
	}

	// Restart: the same Config, so the same stable file.
	lst, err := g.status(ctx, ldr)
	if err != nil {
		return fmt.Errorf("broadcast: outage: leader status: %w", err)
	}
	row.TargetIndex = lst.Index
	restartAt := time.Now()
	g.cfgs[fol].Start = broadcast.StartExisting // a restart: its stable file must be there
	if err := g.start(fol); err != nil {
		return fmt.Errorf("broadcast: outage: restart member %d: %w", fol+1, err)
	}
	row.ReadyNS = int64(time.Since(restartAt))
	fmt.Fprintf(stderr, "[%8v] restarted %d   ready after %v; catching up to index %d\n",
		time.Since(killAt).Round(time.Second), fol+1, time.Duration(row.ReadyNS).Round(time.Millisecond), row.TargetIndex)
	deadline := restartAt.Add(o.catchupTimeout)
	nextNote := time.Now().Add(o.outageEvery)
	var fs broadcast.Status
	for {
		fs, err = g.status(ctx, fol)
		if err != nil {
			return fmt.Errorf("broadcast: outage: restarted member %d: %w", fol+1, err)
		}
		if fs.Index >= row.TargetIndex {
			row.CaughtUp, row.CatchupNS = true, int64(time.Since(restartAt))
			break
		}
		if time.Now().After(deadline) {
			break
		}
		if time.Now().After(nextNote) {
			fmt.Fprintf(stderr, "[%8v] catching up     member %d index %d of %d (catching up %v)\n",
				time.Since(killAt).Round(time.Second), fol+1, fs.Index, row.TargetIndex, fs.CatchingUp)
			nextNote = time.Now().Add(o.outageEvery)
		}
		if err := sleep(2 * time.Millisecond); err != nil {
			return fmt.Errorf("broadcast: outage: %w", err)
		}
	}
	row.IncarnationAfter = fs.Incarnation
	row.Restarted = fs.Incarnation > row.IncarnationBefore
	row.SnapshotsRestored, row.DiffsAccepted = fs.Counters.SnapshotsRestored, fs.Counters.DiffsAccepted
	sa, _, err := sample()
	if err != nil {
		return fmt.Errorf("broadcast: outage: %w", err)
	}
	if fs2, err := g.status(ctx, fol); err == nil {
		row.FollowerIndex = fs2.Index
		row.LagAfter = int64(sa.Index) - int64(fs2.Index)
	}
	row.RSSAfterKB, row.LogLenAfter = sa.RSSKB, sa.LogLen
	if row.CaughtUp {
		progress(fmt.Sprintf("caught up %v", time.Duration(row.CatchupNS).Round(time.Millisecond)), sa)
	} else {
		progress("NOT caught up", sa)
	}
	lr, lerr := stopLoad()
	row.LoadOpsPerS, row.LoadFailed = lr.OpsPerS, lr.Failed

	if o.json {
		if err := json.NewEncoder(stdout).Encode(row); err != nil {
			return err
		}
	} else {
		printOutage(stdout, row, o)
	}
	switch {
	case lerr != nil:
		return fmt.Errorf("broadcast: outage: load: %w", lerr)
	case !row.CaughtUp:
		return fmt.Errorf("broadcast: outage: member %d did not catch up within %v (index %d, leader's at restart %d)",
			fol+1, o.catchupTimeout, fs.Index, row.TargetIndex)
	case !row.Restarted:
		return fmt.Errorf("broadcast: outage: member %d came back with incarnation %d, not above %d: not a restart",
			fol+1, row.IncarnationAfter, row.IncarnationBefore)
	}
	return nil
}

func leads(b bool) string {
	if b {
		return ""
	}
	return "  (no longer leads)"
}

func printOutage(w io.Writer, r outageRow, o *bcastFlags) {
	fmt.Fprintf(w, "kvbench broadcast --kill-follower --down %v  %s  %s, %d CPUs, %s\n", o.down,
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(w, "%s:%d group (one OS process per replica), client at leader %d, W=%d, %d B; follower %d killed (kill -9), down %v, restarted with its stable file\n\n",
		r.Fabric, r.Replicas, r.Leader, r.Window, r.Size, r.Follower, time.Duration(r.DownNS))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "since kill\tleader RSS KiB\tLogLen\tindex\tcommits/s\t")
	for _, s := range r.Samples {
		fmt.Fprintf(tw, "%v\t%d\t%d\t%d\t%s\t%s\n", time.Duration(s.ElapsedNS).Round(time.Second), s.RSSKB, s.LogLen, s.Index, fmtOps(s.CommitsPerS), leads(s.Leads))
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "leader RSS KiB: at the kill %d, end of outage %d, peak %d, after the catch-up %d\n", r.RSSStartKB, r.RSSEndKB, r.RSSPeakKB, r.RSSAfterKB)
	fmt.Fprintf(w, "leader LogLen: at the kill %d, end of outage %d, after the catch-up %d\n", r.LogLenStart, r.LogLenEnd, r.LogLenAfter)
	fmt.Fprintf(w, "leader commits/s during the outage: %s (%d committed); client over the whole test: %s msgs/s, %d failed\n",
		fmtOps(r.CommitsPerS), r.CommittedDown, fmtOps(r.LoadOpsPerS), r.LoadFailed)
	catch := "NOT caught up"
	if r.CaughtUp {
		catch = "caught up after " + fmtDur(time.Duration(r.CatchupNS))
	}
	fmt.Fprintf(w, "restart: incarnation %d -> %d, serving after %s, %s (index >= %d, the leader's at the restart); snapshots restored %d, diffs accepted %d; lag after %d\n",
		r.IncarnationBefore, r.IncarnationAfter, fmtDur(time.Duration(r.ReadyNS)), catch, r.TargetIndex, r.SnapshotsRestored, r.DiffsAccepted, r.LagAfter)
}
