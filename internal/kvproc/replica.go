package kvproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// statsEvery is how often the reporter looks for a role change to
// report, and the polling goroutine copies its state when nothing moved.
const statsEvery = 5 * time.Millisecond

// stats holds what only the polling goroutine may read (delivery count,
// anomalies, the table's header and size), copied there (the Process's
// AfterPoll) after every Poll that made progress, so that a status shows
// every entry applied before it was asked for, and every statsEvery
// anyway.
type stats struct {
	mu   sync.Mutex
	st   Status // Delivered, Applied, Records, Dups, Gaps, Stale, UnixNS
	last time.Duration
}

func (p *stats) afterPoll(r *kv.Replica, now time.Duration, progress bool) {
	if progress || now-p.last >= statsEvery {
		p.last = now
		mc := r.Multicast()
		d, g, s := mc.Anomalies()
		h := r.Table().Header()
		p.mu.Lock()
		p.st.Delivered, p.st.Applied, p.st.Records = mc.Delivered(), h.Applied, r.Table().Len()
		p.st.Dups, p.st.Gaps, p.st.Stale = d, g, s
		p.st.UnixNS = time.Now().UnixNano()
		p.mu.Unlock()
	}
}

// status is the replica's state now (any goroutine).
func (p *stats) status(cfg *Config, r *kv.Replica) Status {
	p.mu.Lock()
	s := p.st
	p.mu.Unlock()
	s.Group, s.Replica, s.Inc, s.Pid = cfg.Group, cfg.Replica, cfg.Inc, os.Getpid()
	b := r.Multicast().Broadcast()
	s.Epoch, s.Leading = b.Leading()
	bs := b.Status()
	s.CatchingUp, s.SnapshotsRestored = bs.CatchingUp, bs.Counters.SnapshotsRestored
	return s
}

// serveReplica runs a replica process after its config line: a
// server.Process hosting the one replica.
func serveReplica(cfg Config, sc *bufio.Scanner, w *lineWriter) error {
	m := &cfg.Map
	if err := m.Fill(); err != nil {
		return fmt.Errorf("kvproc: %w", err)
	}
	if m.Fabric != "shm" {
		return fmt.Errorf("kvproc: fabric %q: want shm", m.Fabric)
	}
	if cfg.Group < 0 || cfg.Group >= len(m.Groups) || cfg.Replica < 0 || cfg.Replica >= len(m.Groups[cfg.Group]) {
		return fmt.Errorf("kvproc: replica %d of group %d is not in the map's groups %v", cfg.Replica, cfg.Group, m.Groups)
	}
	self := m.Groups[cfg.Group][cfg.Replica]
	spec := fabric.ForMap(m)
	spec.Spin, spec.PeerTimeout = cfg.Spin, cfg.PeerTimeout
	tu := cfg.Tuning
	bc := broadcast.Config{RingSize: tu.RingSize, HeartbeatInterval: tu.HeartbeatInterval, ElectionTimeout: tu.ElectionTimeout,
		MaxLogEntries: tu.MaxLogEntries, MaxCatchUpLogEntries: tu.MaxCatchUpLogEntries, ProposeTimeout: tu.ProposeTimeout,
		ReconnectMin: tu.ReconnectMin, ReconnectMax: tu.ReconnectMax}
	maxPark := tu.HeartbeatInterval
	if maxPark <= 0 {
		maxPark = broadcast.DefaultHeartbeatInterval
	}
	sp := &stats{last: -time.Hour}
	p, err := server.StartProcess(server.ProcessConfig{Map: m, IDs: []rdma.NodeID{self}, Spec: &spec, Broadcast: bc,
		Pollers: 1, MaxPark: maxPark, Spin: cfg.Spin,
		Prepare: func(_ rdma.Node, _, _ int, bc *broadcast.Config) (broadcast.Stable, error) {
			if cfg.StablePath == "" {
				return &broadcast.MemStable{}, nil // always new
			}
			bc.Start = cfg.Start
			return broadcast.FileStable{Path: cfg.StablePath}, nil
		},
		AfterPoll: func(_, _ int, r *kv.Replica, now time.Duration, progress bool) { sp.afterPoll(r, now, progress) }})
	if err != nil {
		return fmt.Errorf("kvproc: group %d replica %d: %w", cfg.Group, cfg.Replica, err)
	}
	r := p.Replicas()[0].KV()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// The reporter: a role change is an event line.
	wg.Go(func() {
		var last Status
		first := true
		t := time.NewTicker(statsEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s := sp.status(&cfg, r)
			if first || s.Leading != last.Leading || s.Epoch != last.Epoch || s.CatchingUp != last.CatchingUp || s.SnapshotsRestored != last.SnapshotsRestored {
				w.emit(Line{Event: &s})
				last, first = s, false
			}
		}
	})
	w.emit(Line{Ready: true, Pid: os.Getpid()})
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			w.emit(Line{Err: fmt.Sprintf("bad request %q: %v", sc.Text(), err)})
			continue
		}
		switch req.Cmd {
		case CmdStatus:
			s := sp.status(&cfg, r)
			w.emit(Line{ID: req.ID, Status: &s})
		default:
			w.emit(Line{ID: req.ID, Err: fmt.Sprintf("replica: unknown command %q", req.Cmd)})
		}
	}
	cancel()
	wg.Wait()
	p.Close()
	return sc.Err()
}
