package kvproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/poller"
)

// statsEvery is how often the reporter looks for a role change to
// report, and the polling goroutine copies its state when nothing moved.
const statsEvery = 5 * time.Millisecond

// statsPoller polls the replica and copies what only the polling goroutine
// may read (delivery count, anomalies, the table's header and size) for
// status requests after every Poll that made progress (so that a status
// shows every entry applied before it was asked for), and every
// statsEvery anyway.
type statsPoller struct {
	r    *kv.Replica
	mu   sync.Mutex
	st   Status // Delivered, Applied, Records, Dups, Gaps, Stale, UnixNS
	last time.Duration
}

func (p *statsPoller) Poll(now time.Duration) bool {
	progress := p.r.Poll(now)
	if progress || now-p.last >= statsEvery {
		p.last = now
		mc := p.r.Multicast()
		d, g, s := mc.Anomalies()
		h := p.r.Table().Header()
		p.mu.Lock()
		p.st.Delivered, p.st.Applied, p.st.Records = mc.Delivered(), h.Applied, p.r.Table().Len()
		p.st.Dups, p.st.Gaps, p.st.Stale = d, g, s
		p.st.UnixNS = time.Now().UnixNano()
		p.mu.Unlock()
	}
	return progress
}

func (p *statsPoller) NextDeadline() time.Duration { return p.r.NextDeadline() }

// status is the replica's state now (any goroutine).
func (p *statsPoller) status(cfg *Config) Status {
	p.mu.Lock()
	s := p.st
	p.mu.Unlock()
	s.Group, s.Replica, s.Inc, s.Pid = cfg.Group, cfg.Replica, cfg.Inc, os.Getpid()
	b := p.r.Multicast().Broadcast()
	s.Epoch, s.Leading = b.Leading()
	bs := b.Status()
	s.CatchingUp, s.SnapshotsRestored = bs.CatchingUp, bs.Counters.SnapshotsRestored
	return s
}

// serveReplica runs a replica process after its config line.
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
	node, err := fabric.Open(spec, self)
	if err != nil {
		return fmt.Errorf("kvproc: %w", err)
	}
	tu := cfg.Tuning
	bc := broadcast.Config{Self: self, Start: cfg.Start,
		RingSize: tu.RingSize, HeartbeatInterval: tu.HeartbeatInterval, ElectionTimeout: tu.ElectionTimeout,
		MaxLogEntries: tu.MaxLogEntries, MaxCatchUpLogEntries: tu.MaxCatchUpLogEntries, ProposeTimeout: tu.ProposeTimeout,
		ReconnectMin: tu.ReconnectMin, ReconnectMax: tu.ReconnectMax}
	var stable broadcast.Stable = &broadcast.MemStable{}
	if cfg.StablePath != "" {
		stable = broadcast.FileStable{Path: cfg.StablePath}
	} else {
		bc.Start = broadcast.StartNew
	}
	rc, err := m.ReplicaConfig(cfg.Group, bc)
	if err != nil {
		node.Close()
		return fmt.Errorf("kvproc: group %d replica %d: %w", cfg.Group, cfg.Replica, err)
	}
	r, err := kv.NewReplica(rc, node, stable)
	if err != nil {
		node.Close()
		return fmt.Errorf("kvproc: group %d replica %d: %w", cfg.Group, cfg.Replica, err)
	}
	maxPark := tu.HeartbeatInterval
	if maxPark <= 0 {
		maxPark = broadcast.DefaultHeartbeatInterval
	}
	sp := &statsPoller{r: r, last: -time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		g := poller.NewGroup(poller.GroupConfig{Pollers: 1, MaxPark: maxPark, Spin: cfg.Spin})
		g.Add(sp, node)
		g.Run(ctx)
	})
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
			s := sp.status(&cfg)
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
			s := sp.status(&cfg)
			w.emit(Line{ID: req.ID, Status: &s})
		default:
			w.emit(Line{ID: req.ID, Err: fmt.Sprintf("replica: unknown command %q", req.Cmd)})
		}
	}
	cancel()
	wg.Wait()
	return errors.Join(sc.Err(), r.Close(), node.Close())
}
