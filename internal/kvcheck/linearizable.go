package kvcheck

import (
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Outcome is a linearizability check's verdict.
type Outcome uint8

// Outcomes.
const (
	Ok      Outcome = iota // linearizable
	Illegal                // not linearizable
	Unknown                // the check timed out
)

func (o Outcome) String() string { return enumString(o, "outcome", "Ok", "Illegal", "Unknown") }

// Partition is a set of keys checked on its own: one key, or the keys that
// batches link (the connected components of the graph whose edges are
// batches touching two keys).
type Partition struct {
	Keys    []string // sorted
	Ops     int      // operations checked (stale gets and gets of unknown outcome are left out)
	Outcome Outcome
}

func (p Partition) String() string {
	return fmt.Sprintf("partition %q (%d ops): %v", p.Keys, p.Ops, p.Outcome)
}

// Result is a linearizability check's result.
type Result struct {
	// Outcome: Illegal if some partition is, else Unknown if some
	// partition's check timed out, else Ok.
	Outcome Outcome
	// Partitions: every partition, ordered by their first key.
	Partitions []Partition
	// Failed: the partitions whose outcome is not Ok.
	Failed []Partition
	// Visualization: the file the visualization was written to, if any.
	Visualization string
}

// Err is nil if r is Ok, else an error naming the failed partitions.
func (r Result) Err() error {
	if r.Outcome == Ok {
		return nil
	}
	head := "kvcheck: history not linearizable: "
	if r.Outcome != Illegal {
		head = "kvcheck: linearizability check timed out: "
	}
	return errors.New(failureString(head, "", r.Failed, r.Visualization))
}

// failureString is Result.Err's and DurableError's text: head, the
// partitions parts (the first 8: the first after sep, the others after
// "; "), and the visualization file if any.
func failureString(head, sep string, parts []Partition, visualization string) string {
	var b strings.Builder
	b.WriteString(head)
	for i, p := range parts {
		if i == 8 {
			fmt.Fprintf(&b, "; and %d more", len(parts)-i)
			break
		}
		if i > 0 {
			sep = "; "
		}
		b.WriteString(sep)
		b.WriteString(p.String())
	}
	if visualization != "" {
		fmt.Fprintf(&b, " (visualization: %s)", visualization)
	}
	return b.String()
}

// Options tune CheckLinearizableOptions.
type Options struct {
	// Timeout bounds the check (0: none); partitions not decided by then
	// are Unknown.
	Timeout time.Duration
	// VisualizeTo, if set, is a file to write porcupine's HTML
	// visualization to: of the failed partitions if the outcome is not
	// Ok, else of all of them. This checks those partitions a second
	// time, recording the partial linearizations (bounded by Timeout too).
	VisualizeTo string
}

// CheckLinearizable checks that h's writes and linearizable gets are
// linearizable against a sequential key-value map (see
// CheckLinearizableOptions).
func CheckLinearizable(h []Op, timeout time.Duration) (Result, error) {
	return CheckLinearizableOptions(h, Options{Timeout: timeout})
}

// CheckLinearizableOptions checks with porcupine that h's writes and
// linearizable gets are linearizable against a sequential key-value map:
// a get returns whether the key is present and its value; a put sets it; a
// delete removes it; a CAS writes iff the key holds Old (or is absent, with
// OldAbsent) and must report OK accordingly; a merge sets its fields in
// the key's fielded value (absent: stores them) and must report OK iff the
// key held no value or a fielded one; a batch applies all its ops
// at one point. A write of unknown outcome may take effect at any point
// after its call, or never (its CAS outcome is unconstrained); stale-ok
// gets and gets of unknown outcome are left out.
//
// The history is checked per partition: per key, or per set of keys that
// batches link. The error is non-nil only if h cannot be checked (a
// malformed op) or the visualization could not be written; whether h is
// linearizable is the Result's Outcome (Result.Err describes it).
func CheckLinearizableOptions(h []Op, opts Options) (Result, error) {
	if err := validate(h); err != nil {
		return Result{}, err
	}
	parts := partition(h)
	res := Result{Partitions: make([]Partition, len(parts))}
	var deadline time.Time
	if opts.Timeout > 0 {
		deadline = time.Now().Add(opts.Timeout)
	}
	jobs := make([]job, len(parts))
	for i, p := range parts {
		jobs[i] = job{model: model, ops: p.ops}
	}
	for i, out := range runJobs(jobs, deadline) {
		res.Partitions[i] = Partition{Keys: parts[i].keys, Ops: len(parts[i].ops), Outcome: out}
	}
	var failed [][]porcupine.Operation
	for i, p := range res.Partitions {
		if p.Outcome == Illegal {
			res.Outcome = Illegal
		} else if p.Outcome == Unknown && res.Outcome == Ok {
			res.Outcome = Unknown
		}
		if p.Outcome != Ok {
			res.Failed = append(res.Failed, p)
			failed = append(failed, parts[i].ops)
		}
	}
	if opts.VisualizeTo != "" {
		show := failed
		if res.Outcome == Ok {
			show = make([][]porcupine.Operation, len(parts))
			for i := range parts {
				show[i] = parts[i].ops
			}
		}
		if err := visualizeModel(model, show, opts.VisualizeTo, opts.Timeout); err != nil {
			return res, fmt.Errorf("kvcheck: visualization: %w", err)
		}
		res.Visualization = opts.VisualizeTo
	}
	return res, nil
}

// job is one porcupine check.
type job struct {
	model porcupine.Model
	ops   []porcupine.Operation
}

// runJobs runs jobs on GOMAXPROCS workers, each check within what is
// left until deadline (zero: no deadline); a check not decided by then
// is Unknown.
func runJobs(jobs []job, deadline time.Time) []Outcome {
	res := make([]Outcome, len(jobs))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(runtime.GOMAXPROCS(0), max(len(jobs), 1)) {
		wg.Go(func() {
			for i := range next {
				res[i] = checkJob(jobs[i], deadline)
			}
		})
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return res
}

func checkJob(j job, deadline time.Time) Outcome {
	left := time.Duration(0)
	if !deadline.IsZero() {
		if left = time.Until(deadline); left <= 0 {
			return Unknown
		}
	}
	switch porcupine.CheckOperationsTimeout(j.model, j.ops, left) {
	case porcupine.Ok:
		return Ok
	case porcupine.Illegal:
		return Illegal
	}
	return Unknown
}

// visualizeModel writes porcupine's visualization of the partitions
// parts under m to path.
func visualizeModel(m porcupine.Model, parts [][]porcupine.Operation, path string, timeout time.Duration) error {
	var all []porcupine.Operation
	for _, p := range parts {
		all = append(all, p...)
	}
	m.Partition = func([]porcupine.Operation) [][]porcupine.Operation { return parts }
	_, info := porcupine.CheckOperationsVerbose(m, all, timeout)
	return porcupine.VisualizePath(m, info, path)
}

// part is one partition's keys and operations.
type part struct {
	keys []string
	ops  []porcupine.Operation
}

// input is a porcupine operation's input: the op (Out is its output).
type input struct {
	pos int
	op  *Op
}

// opKeys calls f with each key o touches. A scan touches every key of
// the history in its range (keys is the history's keys, sorted), or, if
// none, a key of its own (its result must then be empty).
func opKeys(o *Op, pos int, keys []string, f func(string)) {
	if o.Kind == Scan {
		i, _ := slices.BinarySearch(keys, o.Key)
		n := 0
		for ; i < len(keys) && (o.End == "" || keys[i] < o.End); i++ {
			f(keys[i])
			n++
		}
		if n == 0 {
			f(scanKey(pos))
		}
		return
	}
	if o.Kind == Batch {
		for _, b := range o.Batch {
			f(b.Key)
		}
		return
	}
	f(o.Key)
}

// partition splits the checked operations of h into the connected
// components of keys that batches link (one key each when no batch
// touches two keys), ordered by their smallest key.
func partition(h []Op) []part {
	uf := unionFind{}
	keySet := map[string]bool{}
	for i := range h {
		if o := &h[i]; o.Kind != Scan {
			opKeys(o, i, nil, func(k string) { keySet[k] = true })
		}
	}
	keys := slices.Sorted(maps.Keys(keySet))
	for i := range h {
		o := &h[i]
		if o.Kind == Scan && o.Out.Unknown {
			continue
		}
		first := ""
		n := 0
		opKeys(o, i, keys, func(k string) {
			uf.add(k)
			if n == 0 {
				first = k
			} else {
				uf.union(first, k)
			}
			n++
		})
	}
	byRoot := map[string]int{}
	var parts []part
	comp := func(k string) *part {
		r := uf.find(k)
		i, ok := byRoot[r]
		if !ok {
			i = len(parts)
			byRoot[r] = i
			parts = append(parts, part{})
		}
		return &parts[i]
	}
	for _, k := range slices.Sorted(maps.Keys(uf.parent)) {
		p := comp(k)
		p.keys = append(p.keys, k)
	}
	for i := range h {
		o := &h[i]
		if o.Kind == Get && (o.Stale || o.Out.Unknown) || o.Kind == Scan && o.Out.Unknown {
			continue
		}
		ret := o.Return
		if o.Out.Unknown {
			ret = math.MaxInt64
		}
		k := o.Key
		switch o.Kind {
		case Batch:
			k = o.Batch[0].Key
		case Scan:
			opKeys(o, i, keys, func(x string) { k = x })
		}
		p := comp(k)
		p.ops = append(p.ops, porcupine.Operation{ClientId: o.Client, Input: input{i, o}, Call: o.Call,
			Output: o.Out, Return: ret})
	}
	// A partition of only stale or unknown gets has nothing to check.
	return slices.DeleteFunc(parts, func(p part) bool { return len(p.ops) == 0 })
}

// unionFind is a disjoint-set forest over keys.
type unionFind struct {
	parent map[string]string
	size   map[string]int
}

func (u *unionFind) add(k string) {
	if u.parent == nil {
		u.parent, u.size = map[string]string{}, map[string]int{}
	}
	if _, ok := u.parent[k]; !ok {
		u.parent[k], u.size[k] = k, 1
	}
}

func (u *unionFind) find(k string) string {
	r := k
	for u.parent[r] != r {
		r = u.parent[r]
	}
	for u.parent[k] != r { // path compression
		u.parent[k], k = r, u.parent[k]
	}
	return r
}

func (u *unionFind) union(a, b string) {
	a, b = u.find(a), u.find(b)
	if a == b {
		return
	}
	if u.size[a] < u.size[b] {
		a, b = b, a
	}
	u.parent[b] = a
	u.size[a] += u.size[b]
}

// scanKey is the partition key of a scan whose range holds no key of
// the history (not a key any op names: keys are compared as strings, and
// the model's state never holds it).
func scanKey(pos int) string { return fmt.Sprintf("\x00scan %d", pos) }

// state is the model's state: the partition's keys that are present and
// their values. It is never modified once made (porcupine's Step must be
// pure): a write makes a copy.
type state map[string]string

var hashSeed = maphash.MakeSeed()

// model is the sequential key-value map.
var model = porcupine.Model{
	Init: func() any { return state{} },
	Step: func(st, in, out any) (bool, any) {
		s, o, got := st.(state), in.(input).op, out.(Output)
		switch o.Kind {
		case Get:
			v, ok := s[o.Key]
			return ok == got.Found && (!ok || v == got.Value), s
		case Scan:
			return slices.Equal(scanOf(s, o), got.Pairs), s
		case Put:
			return true, with(s, func(n state) { n[o.Key] = o.Value })
		case Delete:
			if _, ok := s[o.Key]; !ok {
				return true, s
			}
			return true, with(s, func(n state) { delete(n, o.Key) })
		case CAS:
			v, ok := s[o.Key]
			match := !ok && o.OldAbsent || ok && !o.OldAbsent && v == o.Old
			if !got.Unknown && got.OK != match {
				return false, s
			}
			if !match {
				return true, s
			}
			return true, with(s, func(n state) { n[o.Key] = o.Value })
		case Merge:
			v, ok := s[o.Key]
			nv, applies := mergeInto(v, ok, o.Fields)
			if !got.Unknown && got.OK != applies {
				return false, s
			}
			if !applies {
				return true, s
			}
			return true, with(s, func(n state) { n[o.Key] = nv })
		case Batch:
			return true, with(s, func(n state) {
				for _, b := range o.Batch {
					if b.Delete {
						delete(n, b.Key)
					} else {
						n[b.Key] = b.Value
					}
				}
			})
		}
		return false, s
	},
	Equal: func(a, b any) bool { return maps.Equal(a.(state), b.(state)) },
	Hash: func(st any) uint64 {
		var h uint64
		for k, v := range st.(state) {
			x := maphash.String(hashSeed, k)
			h += (x ^ maphash.String(hashSeed, v)) * (x | 1)
		}
		return h
	},
	DescribeOperation: func(in, out any) string {
		i := in.(input)
		return fmt.Sprintf("op %d: %s", i.pos, i.op)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		var b strings.Builder
		b.WriteString("{")
		for i, k := range slices.Sorted(maps.Keys(s)) {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%q: %q", k, s[k])
		}
		b.WriteString("}")
		return b.String()
	},
}

// scanOf is what a scan o returns in state s: the keys of its range in
// order (descending for a reverse scan), at most its limit.
func scanOf(s state, o *Op) []KV {
	var out []KV
	keys := slices.Sorted(maps.Keys(s))
	if o.Reverse {
		slices.Reverse(keys)
	}
	for _, k := range keys {
		if k < o.Key || o.End != "" && k >= o.End {
			continue
		}
		if o.Limit > 0 && len(out) == o.Limit {
			break
		}
		out = append(out, KV{k, s[k]})
	}
	return out
}

// with returns a copy of s changed by f.
func with(s state, f func(state)) state {
	n := maps.Clone(s)
	if n == nil {
		n = state{}
	}
	f(n)
	return n
}
