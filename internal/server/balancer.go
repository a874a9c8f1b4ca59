package server

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmakv/rdmakv/client"
)

// The tablet balancer of a process (docs/btree.md, "Who decides").
//
// Who runs it: every process that hosts a replica of group 0 keeps a
// balancer, and only the one hosting group 0's leader acts: at each
// interval it checks that a replica here leads group 0, opens (once) a
// client of its own on the highest free client slot of the host
// (client.OpenHighSlot), and runs one round (client.Balancer.Round: at
// most one move). A process that no longer hosts the leader closes its
// client (the slot goes back) and waits. Leadership is the only
// coordination: there is no lease to take or lose, and every replica
// process is equally able to balance.
//
// If the process dies mid-move (kill -9), the group elects a leader in
// another process, whose balancer finds the tablet frozen (or installing)
// and, once it has stayed so for StuckAfter, finishes the move
// (MoveTablet's steps are idempotent: a step the dead process sent is
// not applied twice). Two processes that both believe they host the
// leader for a moment (an old leader not yet told) plan the same move
// from the same tablets, and the steps' checks at apply refuse whatever
// conflicts: the worst case is a failed round, retried.

// BalanceConfig is the balancer of a Process (ProcessConfig.Balance).
type BalanceConfig struct {
	// Interval is the pause between rounds; 0: no balancer.
	Interval time.Duration
	// StuckAfter is client.BalancerConfig's (0: its default).
	StuckAfter time.Duration
	// MinWrites and SplitKeys are client.BalancerConfig's, the rule by
	// load's thresholds ([ordered] balance_min_writes and
	// balance_split_keys; 0: its defaults).
	MinWrites, SplitKeys uint64
	// Secret is the cluster secret its client proves on tcp.
	Secret []byte
	// Log, if set, gets the balancer's lines instead of the process's
	// log (the embedded cluster shows them at info).
	Log *slog.Logger
	// BeforeStep, if set (tests), is called before each step of the
	// balancer's moves.
	BeforeStep func(step string)
}

// balancer is a Process's balancer and its state.
type balancer struct {
	b      *client.Balancer
	active atomic.Bool // this process's balancer runs rounds
	stop   context.CancelFunc
	done   chan struct{}
}

// startBalancer starts the process's balancer if the map has ordered
// keyspaces, more than one group, and the process hosts a replica of
// group 0 (with Interval 0 it only reports "off").
func (p *Process) startBalancer() {
	m, bc := p.Map, p.cfg.Balance
	hosts0 := false
	p.mu.Lock()
	for _, h := range p.reps[0] {
		hosts0 = hosts0 || h != nil
	}
	p.mu.Unlock()
	if len(m.Keyspaces) == 0 || len(m.Groups) < 2 || !hosts0 {
		return
	}
	log := bc.Log
	if log == nil {
		log = p.cfg.Log
	}
	bl := &balancer{done: make(chan struct{}),
		b: client.NewBalancer(client.BalancerConfig{Interval: bc.Interval, StuckAfter: bc.StuckAfter, Log: log, BeforeStep: bc.BeforeStep,
			MinWrites: bc.MinWrites, SplitKeys: bc.SplitKeys})}
	p.balancer = bl
	if bc.Interval <= 0 {
		bl.b.SetState("off")
		close(bl.done)
		return
	}
	if len(m.ClientNodes) < 2 {
		// It would hold the one slot every other client needs.
		bl.b.SetState("off: the cluster has one client slot")
		close(bl.done)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	bl.stop = stop
	go func() {
		defer close(bl.done)
		p.runBalancer(ctx, bl, log)
	}()
}

// stopBalancer stops the balancer (a move under way is cut short: the
// next balancer finishes it) and waits for it.
func (p *Process) stopBalancer() {
	if bl := p.balancer; bl != nil {
		if bl.stop != nil {
			bl.stop()
		}
		<-bl.done
	}
}

const standby = "standby: group 0's leader is not in this process"

func (p *Process) runBalancer(ctx context.Context, bl *balancer, log *slog.Logger) {
	var c *client.Client
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	bl.b.SetState(standby)
	lastErr := ""
	// A timer set again after each round: a full interval between the
	// end of a move and the start of the next, however long it took.
	t := time.NewTimer(p.cfg.Balance.Interval)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			t.Reset(p.cfg.Balance.Interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.Leader(0) < 0 {
			if release != nil {
				release()
				c, release = nil, nil
			}
			bl.active.Store(false)
			bl.b.SetState(standby)
			continue
		}
		bl.active.Store(true)
		if c == nil {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var err error
			c, release, err = p.openBalancerClient(octx)
			cancel()
			if err != nil {
				err = fmt.Errorf("opening its client: %w", err)
				bl.b.Fail(err)
				if err.Error() != lastErr {
					// Once per distinct error, not once a round.
					log.Warn("balancer: " + err.Error())
					lastErr = err.Error()
				}
				continue
			}
			lastErr = ""
		}
		bl.b.Round(ctx, c)
	}
}

// openBalancerClient opens the balancer's client: on mem (a process of
// tests) on the map's last client slot, through the process's fabric;
// else on the host's highest free slot.
func (p *Process) openBalancerClient(ctx context.Context) (*client.Client, func(), error) {
	m := p.Map
	if p.spec.Fabric == "mem" {
		k := len(m.ClientNodes) - 1
		n, err := p.ClientNode(k)
		if err != nil {
			return nil, nil, err
		}
		c, err := client.Open(ctx, client.WithMap(m), client.WithNode(n), client.WithSlot(k))
		if err != nil {
			return nil, nil, err
		}
		return c, func() { c.Close() }, nil
	}
	return client.OpenHighSlot(ctx, m, p.cfg.Balance.Secret)
}

// BalancerStatus is the process's balancer's state (nil: it runs none).
func (p *Process) BalancerStatus() *client.BalancerStatus {
	if p.balancer == nil {
		return nil
	}
	st := p.balancer.b.Status()
	return &st
}

var (
	dBalMoves   = prometheus.NewDesc("rdmakv_balancer_moves_total", "Tablet moves the process's balancer completed (resumed ones included).", nil, nil)
	dBalResumed = prometheus.NewDesc("rdmakv_balancer_resumed_total", "Half-done tablet moves (another mover's, or its own failed ones) the process's balancer finished.", nil, nil)
	dBalAborted = prometheus.NewDesc("rdmakv_balancer_aborted_total", "Moves of its own the process's balancer undid after they failed 3 times in a row.", nil, nil)
	dBalErrors  = prometheus.NewDesc("rdmakv_balancer_errors_total", "Balancer rounds that failed (a move that failed, tablets not readable, no client).", nil, nil)
	dBalActive  = prometheus.NewDesc("rdmakv_balancer_active", "1 while the process's balancer runs rounds (it hosts group 0's leader), else 0.", nil, nil)
	dBalMoving  = prometheus.NewDesc("rdmakv_balancer_moving", "1 while the process's balancer moves a tablet.", nil, nil)
	dBalTablets = prometheus.NewDesc("rdmakv_balancer_tablets", "Tablets of each group at the balancer's last round.", []string{"group"}, nil)
	dBalSplits  = prometheus.NewDesc("rdmakv_balancer_splits_total", "Hot tablets the process's balancer split (the rule by load).", nil, nil)
	dBalWrites  = prometheus.NewDesc("rdmakv_balancer_writes", "Writes each group's tablets took between the balancer's last two rounds that measured them (its load).", []string{"group"}, nil)
	dBalGarbage = prometheus.NewDesc("rdmakv_balancer_garbage_keys", "Garbage keys (keys of tablets that left the group, not deleted yet) of each group after the balancer's last round's collections (-1: not read).", []string{"group"}, nil)
	dBalGC      = prometheus.NewDesc("rdmakv_balancer_garbage_collected_total", "Garbage keys the process's balancer's collection requests deleted.", nil, nil)
	dBalLeft    = prometheus.NewDesc("rdmakv_balancer_leftovers_removed_total", "Leftover installing tablets (copies interrupted undos left at a move's target) the process's balancer removed.", nil, nil)
)

// balancerCollector exports the balancer's status.
type balancerCollector struct{ p *Process }

func (c balancerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dBalMoves, dBalResumed, dBalAborted, dBalErrors, dBalActive, dBalMoving, dBalTablets, dBalSplits, dBalWrites, dBalGarbage, dBalGC, dBalLeft} {
		ch <- d
	}
}

func (c balancerCollector) Collect(ch chan<- prometheus.Metric) {
	bl := c.p.balancer
	if bl == nil {
		return
	}
	st := bl.b.Status()
	ch <- prometheus.MustNewConstMetric(dBalMoves, prometheus.CounterValue, float64(st.Moves))
	ch <- prometheus.MustNewConstMetric(dBalResumed, prometheus.CounterValue, float64(st.Resumed))
	ch <- prometheus.MustNewConstMetric(dBalAborted, prometheus.CounterValue, float64(st.Aborted))
	ch <- prometheus.MustNewConstMetric(dBalErrors, prometheus.CounterValue, float64(st.Errors))
	ch <- prometheus.MustNewConstMetric(dBalActive, prometheus.GaugeValue, b2f(bl.active.Load() && !strings.HasPrefix(st.State, "off")))
	ch <- prometheus.MustNewConstMetric(dBalMoving, prometheus.GaugeValue, b2f(st.State == "moving"))
	for g, n := range st.Tablets {
		ch <- prometheus.MustNewConstMetric(dBalTablets, prometheus.GaugeValue, float64(n), strconv.Itoa(g))
	}
	ch <- prometheus.MustNewConstMetric(dBalSplits, prometheus.CounterValue, float64(st.Splits))
	for g, n := range st.Writes {
		ch <- prometheus.MustNewConstMetric(dBalWrites, prometheus.GaugeValue, float64(n), strconv.Itoa(g))
	}
	for g, n := range st.Garbage {
		ch <- prometheus.MustNewConstMetric(dBalGarbage, prometheus.GaugeValue, float64(n), strconv.Itoa(g))
	}
	ch <- prometheus.MustNewConstMetric(dBalGC, prometheus.CounterValue, float64(st.GarbageCollected))
	ch <- prometheus.MustNewConstMetric(dBalLeft, prometheus.CounterValue, float64(st.Leftovers))
}
