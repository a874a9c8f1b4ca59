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
}

// Start starts every replica of m (Fabric mem or shm) and waits until
// every group has a leader serving gets.
func Start(ctx context.Context, m *cluster.Map, bc broadcast.Config) (*Cluster, error) {
	if m.Fabric != "mem" && m.Fabric != "shm" {
		return nil, fmt.Errorf("localcluster: fabric %q: want mem or shm", m.Fabric)
	}
	p, err := server.StartProcess(server.ProcessConfig{Map: m, Broadcast: bc})
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := p.WaitServing(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	return &Cluster{Process: p, Broadcast: bc}, nil
}

// ResumeReplica resumes polling replica (g, i) (Process.Resume).
func (c *Cluster) ResumeReplica(g, i int) { c.Resume(g, i) }
