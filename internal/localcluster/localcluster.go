// Package localcluster runs every replica of a cluster map in this process:
// one rdma node per replica (mem or shm fabric), all polled by one
// poller.Group (one poller goroutine per core, each owning a fixed share of
// the replicas and parking once on all its nodes' doorbells). Tests,
// kvbench and the embedded cluster use it; a replica can be stopped (its
// memory lost) or paused (its memory still readable one-sided).
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// Cluster is a running local cluster.
type Cluster struct {
	Map *cluster.Map
	// Broadcast is the Acuerdo configuration every replica uses (Self
	// and Start are set per replica).
	Broadcast broadcast.Config
	spec      fabric.Spec // the map's, with its mem.Fabric on mem
	pollers   *poller.Group
	stop      context.CancelFunc
	done      chan struct{} // closed when the pollers returned
	mu        sync.Mutex
	reps      [][]*replica
	clients   map[rdma.NodeID]rdma.Node
}

type replica struct {
	g, i int
	node rdma.Node
	r    *kv.Replica
	sr   *server.Replica // r as the control port sees it, the polled task
	h    *poller.Handle
}

// Start starts every replica of m (Fabric mem or shm) and waits until
// every group has a leader serving gets.
func Start(ctx context.Context, m *cluster.Map, bc broadcast.Config) (*Cluster, error) {
	if err := m.Fill(); err != nil {
		return nil, err
	}
	c := &Cluster{Map: m, Broadcast: bc, clients: map[rdma.NodeID]rdma.Node{}, spec: fabric.ForMap(m)}
	if m.Fabric == "mem" {
		c.spec.Mem = mem.New(mem.Options{}) // a closed node's id may be reused
	} else if m.Fabric != "shm" {
		return nil, fmt.Errorf("localcluster: fabric %q: want mem or shm", m.Fabric)
	}
	c.pollers = poller.NewGroup(poller.GroupConfig{})
	pctx, stop := context.WithCancel(context.Background())
	c.stop, c.done = stop, make(chan struct{})
	go func() {
		defer close(c.done)
		c.pollers.Run(pctx)
	}()
	c.reps = make([][]*replica, len(m.Groups))
	for g, ms := range m.Groups {
		c.reps[g] = make([]*replica, len(ms))
		for i := range ms {
			if err := c.start(g, i); err != nil {
				c.Close()
				return nil, err
			}
		}
	}
	if err := c.WaitServing(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(g, i int) error {
	id := c.Map.Groups[g][i]
	node, err := fabric.Open(c.spec, id)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	bc := c.Broadcast
	bc.Self, bc.Start = id, broadcast.StartNew
	cfg, err := c.Map.ReplicaConfig(g, bc)
	if err != nil {
		return err
	}
	r, err := kv.NewReplica(cfg, node, &broadcast.MemStable{})
	if err != nil {
		node.Close()
		return fmt.Errorf("localcluster: replica %d of group %d: %w", i, g, err)
	}
	sr := server.NewReplica(g, i, id, r)
	// A group's replicas share a poller: their messages to each other
	// then need no wake-up.
	rp := &replica{g: g, i: i, node: node, r: r, sr: sr, h: c.pollers.AddTo(g, sr, node)}
	c.mu.Lock()
	c.reps[g][i] = rp
	c.mu.Unlock()
	return nil
}

// Do runs f on replica (g, i)'s polling goroutine, between two of its
// Polls (paused or not), and waits for it.
func (c *Cluster) Do(g, i int, f func(*kv.Replica)) error {
	c.mu.Lock()
	rp := c.reps[g][i]
	c.mu.Unlock()
	if rp == nil {
		return fmt.Errorf("localcluster: replica %d of group %d is stopped", i, g)
	}
	if err := rp.h.Do(func() { f(rp.r) }); err != nil {
		return errors.New("localcluster: replica stopped")
	}
	return nil
}

// WaitServing waits until every group has a replica serving
// linearizable gets.
func (c *Cluster) WaitServing(ctx context.Context) error {
	for {
		missing := -1
		for g := range c.reps {
			if c.Leader(g) < 0 {
				missing = g
				break
			}
		}
		if missing < 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("localcluster: group %d has no leader: %w", missing, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// Leader is the index of the replica of group g that leads a committed
// epoch, or -1.
func (c *Cluster) Leader(g int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, rp := range c.reps[g] {
		if rp == nil {
			continue
		}
		if _, ok := rp.r.Multicast().Broadcast().Leading(); ok {
			return i
		}
	}
	return -1
}

// Replicas are the running replicas, for the control port (the list does
// not follow later Stops and restarts).
func (c *Cluster) Replicas() []*server.Replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rs []*server.Replica
	for _, g := range c.reps {
		for _, rp := range g {
			if rp != nil {
				rs = append(rs, rp.sr)
			}
		}
	}
	return rs
}

// Stop stops replica (g, i) and closes its node: its memory is gone
// (kill -9 of its process).
func (c *Cluster) Stop(g, i int) {
	c.mu.Lock()
	rp := c.reps[g][i]
	c.reps[g][i] = nil
	c.mu.Unlock()
	if rp == nil {
		return
	}
	rp.h.Remove()
	rp.r.Close()
	rp.node.Close()
}

// Pause stops polling replica (g, i) until Resume (once it returns, no
// Poll of the replica runs): its memory stays readable one-sided.
func (c *Cluster) Pause(g, i int) {
	c.mu.Lock()
	rp := c.reps[g][i]
	c.mu.Unlock()
	if rp != nil {
		rp.h.Pause()
	}
}

// ResumeReplica resumes polling replica (g, i).
func (c *Cluster) ResumeReplica(g, i int) {
	c.mu.Lock()
	rp := c.reps[g][i]
	c.mu.Unlock()
	if rp != nil {
		rp.h.Resume()
	}
}

// ClientNode opens (once) the node of client slot k, for client.WithNode.
func (c *Cluster) ClientNode(k int) (rdma.Node, error) {
	id := c.Map.ClientNodes[k]
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.clients[id]; n != nil {
		return n, nil
	}
	n, err := fabric.Open(c.spec, id)
	if err != nil {
		return nil, err
	}
	c.clients[id] = n
	return n, nil
}

// PollerStats are the pollers' counters.
func (c *Cluster) PollerStats() []poller.PollerStats { return c.pollers.Stats() }

// Close stops every replica and closes every node.
func (c *Cluster) Close() {
	for g := range c.reps {
		for i := range c.reps[g] {
			c.Stop(g, i)
		}
	}
	c.stop()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.clients {
		n.Close()
		delete(c.clients, id)
	}
}
