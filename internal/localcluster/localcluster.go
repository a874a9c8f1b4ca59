// Package localcluster runs every replica of a cluster map in this process
// and waits until each group serves: a thin wrapper of server.Process (the
// one node runtime), for tests, kvbench and the embedded cluster. A replica
// can be stopped (its memory lost) or paused (its memory still readable
// one-sided).
package localcluster

import (
	"context"
	"fmt"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

// Cluster is a running local cluster: a server.Process hosting every
// replica of its map.
type Cluster struct {
	*server.Process
	// Broadcast is the Acuerdo configuration every replica uses (Self
	// and Start are set per replica).
	Broadcast broadcast.Config

	unlock func()
}

// Start starts every replica of m (Fabric mem or shm) in memory mode
// (nothing on disk) and waits until every group has a leader serving gets.
func Start(ctx context.Context, m *cluster.Map, bc broadcast.Config) (*Cluster, error) {
	return StartWith(ctx, m, bc, Options{})
}

// Options are a local cluster's durability: with DataDir set, the
// replicas keep their state there (server.UseDataDir: the embedded
// cluster's layout, identity and lock) with Durable's mode.
type Options struct {
	DataDir string
	Durable server.DurableConfig
	// WALLayout is the log layout a new data dir gets
	// (server.ProcessConfig.WALLayout: cluster.WALShared, else a log
	// per replica).
	WALLayout string
	// SpareP lets the pollers take a spare P while a stream is dense
	// (server.ProcessConfig.SpareP; kvserver's default, off here: it
	// changes the GOMAXPROCS of the whole test process).
	SpareP bool
}

// StartWith is Start with o's durability.
func StartWith(ctx context.Context, m *cluster.Map, bc broadcast.Config, o Options) (*Cluster, error) {
	if m.Fabric != "mem" && m.Fabric != "shm" {
		return nil, fmt.Errorf("localcluster: fabric %q: want mem or shm", m.Fabric)
	}
	pc := server.ProcessConfig{Map: m, Broadcast: bc, Durable: o.Durable, WALLayout: o.WALLayout, SpareP: o.SpareP}
	unlock := func() {}
	if o.DataDir != "" {
		var err error
		if unlock, err = server.UseDataDir(&pc, o.DataDir); err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
	}
	p, err := server.StartProcess(pc)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := p.WaitServing(ctx); err != nil {
		p.Close()
		unlock()
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	return &Cluster{Process: p, Broadcast: bc, unlock: unlock}, nil
}

// Close stops every replica (a durable one syncs its log first) and
// releases the data dir.
func (c *Cluster) Close() {
	c.Process.Close()
	if c.unlock != nil {
		c.unlock()
	}
}

// ResumeReplica resumes polling replica (g, i) (Process.Resume).
func (c *Cluster) ResumeReplica(g, i int) { c.Resume(g, i) }
