package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// Registration with the groups, and partial availability: a group without
// a leader costs only its own calls.

// registerGrace is how long Open waits for every group before it asks
// the missing groups' replicas (their headers) whether they can elect a
// leader at all; registerProbe is how often it asks again. Open gives up
// on the missing groups once registerDead probes in a row found that none
// of them can (a replica that is starting is unreachable for a moment).
const (
	registerGrace = time.Second
	registerProbe = 500 * time.Millisecond
	registerDead  = 3
)

// multicast sends payload to dst and waits for the replies (Do). A call to
// a group that has not registered the client fails at once with
// *UnavailableError (nothing was sent).
func (c *Client) multicast(ctx context.Context, dst tree.Set, payload []byte) (multicast.Outcome, error) {
	if err := c.registered(dst); err != nil {
		return multicast.Outcome{}, err
	}
	o, err := c.mc.Do(ctx, dst, payload)
	if errors.Is(err, multicast.ErrNotReady) {
		if uerr := c.registered(dst); uerr != nil {
			return o, uerr
		}
	}
	return o, err
}

// registered returns nil if the groups a message to dst needs (dst and
// its lca) registered the client, else an *UnavailableError naming the
// first that did not.
func (c *Client) registered(dst tree.Set) error {
	need := dst
	if lca, err := c.tree.LCA(dst); err == nil {
		need = need.Add(lca)
	}
	missing := need &^ c.mc.RegisteredNow()
	if missing.Empty() {
		return nil
	}
	g, _ := missing.Min()
	c.downMu.Lock()
	why, ok := c.down[uint32(g)]
	c.downMu.Unlock()
	if !ok {
		why = "no leader since the client opened (it has not registered the client)"
	}
	return &UnavailableError{Group: uint32(g), Err: errors.New(why)}
}

// register waits until every group registered the client, or until wait
// ends or each missing group is known unable to elect a leader; it fails
// if no group registered the client, and at once if a replica refused the
// client's cluster secret. wait is ctx, the caller's, or ctx bounded by
// WithTimeout. register never waits past ctx: once ctx is done it
// returns at once (its error wraps ctx's if no group registered the
// client); only when the WithTimeout bound ends with ctx still running
// does it take one last, bounded look at the missing groups.
func (c *Client) register(ctx, wait context.Context) error {
	all := c.tree.All()
	start := time.Now()
	probeAt := start.Add(registerGrace)
	var down map[uint32]string
	deadProbes := 0
	for {
		reg, changed := c.mc.Registered()
		if reg == all {
			return nil
		}
		if err := c.authFailure(); err != nil {
			return err
		}
		missing := all &^ reg
		if !time.Now().Before(probeAt) {
			var dead bool
			down, dead = c.diagnose(wait, missing)
			if wait.Err() != nil {
				dead = false // the probe was cut short: it proves nothing
			}
			if !dead {
				deadProbes = 0
			} else if deadProbes++; deadProbes >= registerDead {
				break
			}
			if c.o.degraded {
				break
			}
			probeAt = time.Now().Add(registerProbe)
		}
		t := time.NewTimer(time.Until(probeAt))
		select {
		case <-changed:
		case <-t.C:
		case <-wait.Done():
		}
		t.Stop()
		if wait.Err() != nil {
			if reg, _ = c.mc.Registered(); reg == all {
				return nil
			}
			if ctx.Err() == nil {
				// One last look, bounded: the WithTimeout bound has
				// ended, the caller's ctx has not.
				pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				down, _ = c.diagnose(pctx, all&^reg)
				cancel()
			}
			// Else no more waiting: what the last probe found.
			down = notRegistered(down, all&^reg)
			for g, why := range down {
				down[g] = why + fmt.Sprintf(" (waited %v)", time.Since(start).Round(time.Millisecond))
			}
			break
		}
	}
	reg, _ := c.mc.Registered()
	if reg.Empty() && !c.o.degraded {
		if err := ctx.Err(); err != nil {
			return &openCtxError{ctx: err, down: down}
		}
		return &openError{down: down}
	}
	c.downMu.Lock()
	c.down = down
	c.downMu.Unlock()
	return nil
}

// notRegistered is why for each group of missing: down's reason, or
// "has not registered the client" where no probe said more.
func notRegistered(down map[uint32]string, missing tree.Set) map[uint32]string {
	out := map[uint32]string{}
	for _, g := range missing.Groups() {
		if why, ok := down[uint32(g)]; ok {
			out[uint32(g)] = why
		} else {
			out[uint32(g)] = "it has not registered the client"
		}
	}
	return out
}

// authFailure returns a final error if a replica refused the client's
// cluster secret (or protocol version): retrying cannot help.
func (c *Client) authFailure() error {
	for _, e := range c.mc.PeerErrors(c.tree.All()) {
		if errors.Is(e.Err, tcp.ErrAuth) {
			from := "the cluster secret this client was given"
			if c.o.configFile != "" {
				from = "the secret of config " + c.o.configFile + " (fix it there)"
			}
			return fmt.Errorf("%w: node %d refused %s", tcp.ErrAuth, e.Node, from)
		}
		if errors.Is(e.Err, tcp.ErrVersion) {
			return fmt.Errorf("node %d: %w: client and servers are different versions", e.Node, tcp.ErrVersion)
		}
	}
	return nil
}

// diagnose reads the headers of groups' replicas and says, per group, why
// it has not registered the client; dead reports whether none of groups
// can elect a leader (describeGroup: no majority of its replicas is
// reachable and able to vote).
func (c *Client) diagnose(ctx context.Context, groups tree.Set) (why map[uint32]string, dead bool) {
	timeout := statusReadTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(d)), time.Millisecond)
	}
	res := map[uint32]string{}
	resDead := true
	over := false // diagnose returned: late results are dropped
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, g := range groups.Groups() {
		members := c.m.Groups[g]
		rs := make([]ReplicaStatus, len(members))
		for i, id := range members {
			rs[i] = ReplicaStatus{Node: id, Member: i}
		}
		wg.Go(func() {
			var rw sync.WaitGroup
			for i := range rs {
				rw.Go(func() { c.readReplica(uint32(g), &rs[i], timeout) })
			}
			rw.Wait()
			text, canElect := describeGroup(rs, c.mc.PeerErrors(tree.Of(g)))
			mu.Lock()
			if !over {
				res[uint32(g)] = text
				if canElect {
					resDead = false
				}
			}
			mu.Unlock()
		})
	}
	// Return when ctx ends even if a read still waits (a tcp Connect may
	// take its peer timeout): Open honours its ctx.
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	over = true
	// A group not heard from is not known dead.
	return maps.Clone(res), resDead && len(res) == len(groups.Groups())
}

// describeGroup says why a group with replicas rs has not registered the
// client ("no leader: replicas 2 and 3 unreachable"), and whether it
// could elect a leader: a majority of its replicas are voters, reachable
// and not catching up (a replica that restarted without its data cannot
// vote until a leader catches it up), or a reachable replica's header
// says it leads (it catches the others up itself).
func describeGroup(rs []ReplicaStatus, perr []multicast.PeerError) (string, bool) {
	var down, catching []rdma.NodeID
	leader := rdma.NodeID(0)
	hasLeader := false
	var epoch uint64
	for _, r := range rs {
		if !r.Reachable {
			down = append(down, r.Node)
			continue
		}
		if r.CatchingUp {
			catching = append(catching, r.Node)
		}
		if r.Serving > epoch {
			epoch, leader, hasLeader = r.Serving, r.Node, true
		}
	}
	majority := len(rs)/2 + 1
	if len(rs)-len(down) < majority {
		return "no leader: " + replicaList(down) + " unreachable", false
	}
	if !hasLeader && len(rs)-len(down)-len(catching) < majority {
		text := "no leader: "
		if len(down) > 0 {
			text += replicaList(down) + " unreachable; "
		}
		see := ` (see docs/deploy.md "force-new-cluster")`
		if len(down)+len(catching) == len(rs) {
			// No reachable replica kept the data: nothing to go on from.
			see = ` (see docs/deploy.md "When a whole group is down")`
		}
		return text + restartedList(catching) + see, false
	}
	if !hasLeader {
		return "no leader (an election is under way)", true
	}
	text := fmt.Sprintf("no answer to the client's registration (node %d's header says it leads", leader)
	if len(down) > 0 {
		text += "; " + replicaList(down) + " unreachable"
	}
	if len(catching) > 0 {
		text += "; " + replicaList(catching) + " catching up"
	}
	text += ")"
	for _, e := range perr {
		text += fmt.Sprintf("; node %d: %v", e.Node, e.Err)
	}
	return text, true
}

// restartedList is "replica 2 restarted without its data and cannot
// vote", "replicas 2 and 3 restarted without their data and cannot vote".
func restartedList(ids []rdma.NodeID) string {
	if len(ids) == 1 {
		return replicaList(ids) + " restarted without its data and cannot vote"
	}
	return replicaList(ids) + " restarted without their data and cannot vote"
}

// replicaList is "replica 2", "replicas 2 and 3", "replicas 1, 2 and 3".
func replicaList(ids []rdma.NodeID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	switch len(s) {
	case 0:
		return "no replica"
	case 1:
		return "replica " + s[0]
	}
	return "replicas " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// openError: Open found no group that registered the client.
type openError struct {
	down map[uint32]string
}

func (e *openError) Error() string {
	if len(e.down) == 0 {
		return "no group registered this client"
	}
	gs := make([]int, 0, len(e.down))
	for g := range e.down {
		gs = append(gs, int(g))
	}
	sortInts(gs)
	var b strings.Builder
	for i, g := range gs {
		if i > 0 {
			b.WriteString("; ")
		}
		if why := e.down[uint32(g)]; strings.HasPrefix(why, "no leader") {
			fmt.Fprintf(&b, "group %d has %s", g, why)
		} else {
			fmt.Fprintf(&b, "group %d: %s", g, why)
		}
	}
	return b.String()
}

func (e *openError) Unwrap() error { return ErrUnavailable }

// openCtxError: Open's ctx ended before any group registered the client.
type openCtxError struct {
	ctx  error
	down map[uint32]string
}

func (e *openCtxError) Error() string {
	return fmt.Sprintf("%v before any group registered the client: %v", e.ctx, &openError{down: e.down})
}

func (e *openCtxError) Unwrap() []error { return []error{e.ctx, ErrUnavailable} }

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}
