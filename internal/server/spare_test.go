package server

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmakv/rdmakv/poller"
)

// burstTask makes progress for burst passes after each wake, then asks
// to be polled again 10 µs later: every busy spell of its poller has
// burst passes that made progress, as many writers' batches give a
// replica's poller, with no doorbell and no clock in the test.
type burstTask struct {
	burst atomic.Int64
	left  int64
	next  time.Duration
}

func (b *burstTask) Poll(now time.Duration) bool {
	if b.left > 0 {
		b.left--
		return true
	}
	b.left = b.burst.Load()
	b.next = now + 10*time.Microsecond
	return false
}

func (b *burstTask) NextDeadline() time.Duration { return b.next }

// TestSpareStatus: /status's spare_p and its pollers' dense, spells and
// busy_share (and their /metrics) follow a process's pollers through a
// dense stream and back: a poller whose every spell is busy turns dense
// and the group takes its spare P (held, one switch, GOMAXPROCS pollers
// + 1); once its spells are idle it turns sparse and gives the P back
// (not held, two switches). The fields are asserted, not how long the
// rule took.
func TestSpareStatus(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)
	g := poller.NewGroup(poller.GroupConfig{Pollers: procs, Spin: -1, MaxPark: time.Hour, SpareP: true})
	task := &burstTask{}
	task.burst.Store(20) // every spell busy (16+ progress passes)
	g.Add(task)
	reps := []*Replica{{pollers: g}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	// status is what /status shows (spare_p and pollers), through JSON.
	type shown struct {
		SpareP  *SpareStatus   `json:"spare_p"`
		Pollers []PollerStatus `json:"pollers"`
	}
	status := func() shown {
		t.Helper()
		sp := spareStatus(reps) // first, as ServeControlWith reads them
		b, err := json.Marshal(ProcessStatus{Pollers: pollerStatus(reps), SpareP: sp})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{`"spare_p":{"on_demand":`, `"held":`, `"switches":`, `"dense":`, `"busy_share":`, `"spells":`} {
			if !strings.Contains(string(b), f) {
				t.Fatalf("/status lacks %s: %s", f, b)
			}
		}
		var s shown
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// metrics is what /metrics shows of the spare P and the task's poller.
	metrics := func() map[string]float64 {
		t.Helper()
		reg := prometheus.NewRegistry()
		reg.MustRegister(pollerCollector{reps})
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() != "0" {
					continue // another poller: the task is on poller 0
				}
				out[f.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return out
	}
	waitFor := func(what string, ok func(shown) bool) shown {
		t.Helper()
		for end := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
			s := status()
			if ok(s) {
				return s
			}
			if time.Now().After(end) {
				t.Fatalf("not within 60 s: %s: spare_p %+v, poller 0 %+v", what, *s.SpareP, s.Pollers[0])
			}
		}
	}

	s := waitFor("the dense stream takes the spare P", func(s shown) bool { return s.SpareP.Held })
	if !s.SpareP.OnDemand || !s.SpareP.Holding || s.SpareP.Switches != 1 || s.SpareP.GOMAXPROCS != procs+1 {
		t.Fatalf("dense: spare_p %+v, want on demand, holding, 1 switch, GOMAXPROCS %d", *s.SpareP, procs+1)
	}
	p0 := s.Pollers[0]
	if p0.Tasks != 1 || !p0.Dense || p0.Spells == 0 || p0.BusyShare < 0.5 {
		t.Fatalf("dense: poller 0 %+v, want its one task, dense, most spells busy", p0)
	}
	if m := metrics(); m["rdmakv_spare_p_held"] != 1 || m["rdmakv_spare_p_switches_total"] != 1 || m["rdmakv_poller_dense"] != 1 ||
		m["rdmakv_poller_busy_spells_total"] == 0 || m["rdmakv_poller_spells_total"] < m["rdmakv_poller_busy_spells_total"] {
		t.Fatalf("dense: /metrics %v", m)
	}

	task.burst.Store(0) // spells of no progress: an idle stream
	s = waitFor("the idle stream gives the spare P back", func(s shown) bool { return !s.SpareP.Held })
	if !s.SpareP.OnDemand || s.SpareP.Holding || s.SpareP.Switches != 2 || s.SpareP.GOMAXPROCS != procs {
		t.Fatalf("sparse: spare_p %+v, want on demand, not holding, 2 switches, GOMAXPROCS %d", *s.SpareP, procs)
	}
	if p := s.Pollers[0]; p.Dense || p.Spells <= p0.Spells || p.BusySpells < p0.BusySpells || p.BusyShare >= p0.BusyShare {
		t.Fatalf("sparse: poller 0 %+v after %+v, want not dense, more spells, a lower busy share", p, p0)
	}
	if m := metrics(); m["rdmakv_spare_p_held"] != 0 || m["rdmakv_spare_p_switches_total"] != 2 || m["rdmakv_poller_dense"] != 0 {
		t.Fatalf("sparse: /metrics %v", m)
	}
}

// pollerCollector collects what collectPollers sends (the pollers' part
// of the control port's collector).
type pollerCollector struct{ reps []*Replica }

func (c pollerCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c pollerCollector) Collect(ch chan<- prometheus.Metric) { collectPollers(c.reps, ch) }
