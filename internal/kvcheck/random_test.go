package kvcheck

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// simStore is a sequential kv store with per-group entry indexes and the
// per-key history of writes that stale-ok gets read old states from.
type simStore struct {
	state map[string]string
	index [2]uint64 // per group
	log   map[string][]simWrite
}

type simWrite struct {
	idx uint64
	eff effect
}

var simKeys = []string{"a", "b", "c", "d", "e"}

// groupOf: a, b, c in group 0; d, e in group 1.
func groupOf(k string) int {
	if k >= "d" {
		return 1
	}
	return 0
}

func newSimStore() *simStore {
	return &simStore{state: map[string]string{}, log: map[string][]simWrite{}}
}

// randomOp returns a random op for client c (CAS expecting often what s
// holds).
func (s *simStore) randomOp(r *rand.Rand, c int) Op {
	k := simKeys[r.IntN(len(simKeys))]
	v := fmt.Sprint(r.IntN(4))
	switch n := r.IntN(100); {
	case n < 30:
		return Op{Client: c, Kind: Get, Key: k}
	case n < 45:
		return Op{Client: c, Kind: Get, Key: k, Stale: true}
	case n < 65:
		return Op{Client: c, Kind: Put, Key: k, Value: v}
	case n < 70:
		return Op{Client: c, Kind: Delete, Key: k}
	case n < 85:
		old, ok := s.state[k]
		if r.IntN(3) == 0 {
			old, ok = fmt.Sprint(r.IntN(4)), r.IntN(4) != 0
		}
		return Op{Client: c, Kind: CAS, Key: k, Old: old, OldAbsent: !ok, Value: v}
	default:
		o := Op{Client: c, Kind: Batch}
		for range 1 + r.IntN(3) {
			o.Batch = append(o.Batch, BatchOp{Key: simKeys[r.IntN(len(simKeys))], Value: fmt.Sprint(r.IntN(4)), Delete: r.IntN(4) == 0})
		}
		return o
	}
}

// do executes o at once and returns what the client sees.
func (s *simStore) do(r *rand.Rand, o *Op) Output {
	if o.Kind == Get {
		if !o.Stale {
			v, ok := s.state[o.Key]
			return Output{Found: ok, Value: v}
		}
		// A replica that applied some prefix of the group's entries.
		g := groupOf(o.Key)
		a := s.index[g] - uint64(r.IntN(int(s.index[g])+1))
		out := Output{Applied: a, Group: g}
		for _, w := range s.log[o.Key] {
			if w.idx > a {
				break
			}
			out.Found, out.Value = w.eff.present, w.eff.value
		}
		return out
	}
	// A write: one entry in each group it touches.
	keys := []string{o.Key}
	if o.Kind == Batch {
		keys = nil
		for _, b := range o.Batch {
			keys = append(keys, b.Key)
		}
	}
	var entry [2]uint64
	for _, k := range keys {
		if g := groupOf(k); entry[g] == 0 {
			s.index[g]++
			entry[g] = s.index[g]
		}
	}
	g := groupOf(keys[0])
	out := Output{Index: entry[g], Group: g}
	if r.IntN(2) == 0 {
		out.Version = entry[g] << 16
	}
	if r.IntN(4) == 0 {
		out.Index = 0 // only the version came back
	}
	set := func(k string, e effect) {
		if e.present {
			s.state[k] = e.value
		} else {
			delete(s.state, k)
		}
		s.log[k] = append(s.log[k], simWrite{entry[groupOf(k)], e})
	}
	switch o.Kind {
	case Put:
		set(o.Key, effect{true, o.Value})
	case Delete:
		set(o.Key, effect{})
	case CAS:
		v, ok := s.state[o.Key]
		out.OK = !ok && o.OldAbsent || ok && !o.OldAbsent && v == o.Old
		if out.OK {
			set(o.Key, effect{true, o.Value})
		}
	case Batch:
		for _, b := range o.Batch {
			set(b.Key, effect{!b.Delete, b.Value})
		}
	}
	return out
}

// randomHistory simulates a sequential execution: op i takes effect at
// time 100*i (or later, when no client is free), inside a random interval
// of a client that is not busy then. Some writes end with an unknown
// outcome and take effect or not.
func randomHistory(r *rand.Rand, n, clients int) []Op {
	s := newSimStore()
	free := make([]int64, clients)
	var h []Op
	t := int64(0)
	for range n {
		t += 100
		var idle []int
		for len(idle) == 0 {
			for c := range clients {
				if free[c] < t {
					idle = append(idle, c)
				}
			}
			if len(idle) == 0 {
				t += 100
			}
		}
		c := idle[r.IntN(len(idle))]
		o := s.randomOp(r, c)
		o.Call = max(free[c]+1, t-r.Int64N(400))
		o.Return = t + r.Int64N(400)
		free[c] = o.Return
		if o.isWrite() && r.IntN(10) == 0 {
			if r.IntN(2) == 0 {
				s.do(r, &o)
			}
			o.Out = Output{Unknown: true, OK: r.IntN(2) == 0}
		} else {
			o.Out = s.do(r, &o)
		}
		h = append(h, o)
	}
	return h
}

// Histories of simulated sequential executions pass both checks, and a
// planted never-written value is caught by each.
func TestRandomHistories(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		h := randomHistory(r, 20+r.IntN(60), 1+r.IntN(6))
		res, err := CheckLinearizable(h, testTimeout)
		if err != nil || res.Outcome != Ok {
			t.Fatalf("seed %d: %v %v\n%s", seed, err, res.Err(), dump(h))
		}
		if err := CheckStale(h); err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, dump(h))
		}
		// Plant a bogus value in a random get.
		var gets []int
		for i, o := range h {
			if o.Kind == Get {
				gets = append(gets, i)
			}
		}
		if len(gets) == 0 {
			continue
		}
		i := gets[r.IntN(len(gets))]
		bad := slices.Clone(h)
		bad[i].Out.Found, bad[i].Out.Value = true, "bogus"
		if bad[i].Stale {
			if se := staleErr(t, CheckStale(bad)); se.Property != NeverWritten || se.Pos != i {
				t.Fatalf("seed %d: want (a) at op %d, got %v", seed, i, se)
			}
			continue
		}
		res, err = CheckLinearizable(bad, testTimeout)
		if err != nil || res.Outcome != Illegal || !slices.ContainsFunc(res.Failed, func(p Partition) bool {
			return slices.Contains(p.Keys, bad[i].Key)
		}) {
			t.Fatalf("seed %d: bogus get %d not caught: %+v %v", seed, i, res, err)
		}
	}
}

// Real goroutines against a locked store, recorded by a Recorder with
// its default clock: the history passes both checks.
func TestConcurrentRecorder(t *testing.T) {
	var mu sync.Mutex
	s := newSimStore()
	rec := NewRecorder(nil)
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 1))
			for range 100 {
				mu.Lock()
				o := s.randomOp(r, c)
				mu.Unlock()
				id := rec.Begin(c, o)
				mu.Lock()
				var out Output
				switch {
				case o.isWrite() && r.IntN(20) == 0: // timed out
					if r.IntN(2) == 0 {
						s.do(r, &o)
					}
					out.Unknown = true
				default:
					out = s.do(r, &o)
				}
				mu.Unlock()
				rec.End(id, out)
			}
		})
	}
	wg.Wait()
	h := rec.History()
	if len(h) != 8*100 {
		t.Fatalf("%d ops recorded", len(h))
	}
	mustLinearizable(t, h)
	if err := CheckStale(h); err != nil {
		t.Fatal(err)
	}
}

// The injected clock stamps calls and returns; History copies.
func TestRecorderClock(t *testing.T) {
	var now int64
	rec := NewRecorder(func() int64 { now += 5; return now })
	b := []BatchOp{{Key: "k", Value: "v"}}
	a := rec.Begin(3, Op{Kind: Batch, Batch: b})
	g := rec.Begin(4, Op{Kind: Get, Key: "k"})
	b[0].Value = "changed"
	rec.End(a, Output{Index: 9})
	h := rec.History()
	want := []Op{
		{Client: 3, Kind: Batch, Batch: []BatchOp{{Key: "k", Value: "v"}}, Call: 5, Return: 15, Out: Output{Index: 9}},
		{Client: 4, Kind: Get, Key: "k", Call: 10, Out: Output{Unknown: true}},
	}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Fatalf("history %+v, want %+v", h, want)
	}
	rec.End(g, Output{Found: true, Value: "v"})
	if h[1].Out.Found || rec.History()[1].Return != 20 {
		t.Fatal("History shares its ops")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("ending an op twice did not panic")
			}
		}()
		rec.End(g, Output{})
	}()
	// The zero Recorder works, with a clock that moves forward.
	var z Recorder
	id := z.Begin(0, Op{Kind: Get, Key: "k"})
	z.End(id, Output{})
	if o := z.History()[0]; o.Return < o.Call {
		t.Fatalf("zero Recorder: %+v", o)
	}
}
