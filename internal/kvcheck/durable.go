package kvcheck

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Durability is the durability mode a history is checked against
// (cluster config `durability`).
type Durability uint8

// Durability modes.
const (
	// DurableSync: an acknowledged write is on the disks of a majority;
	// a whole-group outage loses nothing acknowledged.
	DurableSync Durability = iota + 1
	// DurableAsync: a whole-group outage may lose the writes of the last
	// interval before it (the window), never an older acknowledged one.
	DurableAsync
)

func (d Durability) String() string { return enumString(d, "durability", "", "sync", "async") }

// Outage is a whole-group outage: every replica of Group stopped (kill -9,
// power loss) and later restarted from its data dir. Start and End are
// on the history's clock (Recorder.Now): Start just before the first
// replica was killed, End once every replica was dead (before any
// restarted). In async mode the window counts back from Start, so a
// caller whose replica crashed earlier and was not synced again since
// (restarted but not yet brought up to date by a leader and that on its
// disk) passes that earlier crash as Start: its disk lacks what it had
// not synced then (docs/broadcast.md, "What it can lose"). A write may have taken effect before the outage as late as
// End, and ops that return by End were served by the dying replicas; an
// operation called after End is served by the restarted group.
type Outage struct {
	Group      int
	Start, End int64
}

// DurableProperty is a promise CheckDurable checks.
type DurableProperty uint8

// The promises of CheckDurable.
const (
	// NotLinearizable: the history is not linearizable even if every
	// write taken before an outage of its group were lost at it: a
	// failure that no durability mode explains.
	NotLinearizable DurableProperty = iota + 1
	// AcknowledgedLost (sync): the history is linearizable only if an
	// outage lost acknowledged writes.
	AcknowledgedLost
	// AsyncLossBound (async): the history is linearizable only if an
	// outage lost a write acknowledged before the window that precedes
	// it.
	AsyncLossBound
	// CheckTimedOut: porcupine did not decide in time (not a pass).
	CheckTimedOut
	// NotAPrefix (async): a write lost at an outage was followed in real
	// time (so in its group's log) by a write of the group that the
	// history shows kept: the recovery did not keep a prefix of the log.
	NotAPrefix
)

func (p DurableProperty) String() string {
	return enumString(p, "durable property", "", "not linearizable", "acknowledged lost", "async loss bound", "check timed out", "not a prefix")
}

// DurableError is a history that broke a promise of its durability mode.
type DurableError struct {
	Property DurableProperty
	// Partitions: the partitions that broke it.
	Partitions []Partition
	Msg        string
	// Visualization: the file the visualization was written to, if any.
	Visualization string
}

func (e *DurableError) Error() string {
	return failureString(fmt.Sprintf("kvcheck: %v: %s", e.Property, e.Msg), "; ", e.Partitions, e.Visualization)
}

// CheckDurable checks h, a history across the whole-group outages
// outages, against the promise of durability mode mode:
//
//   - DurableSync: h is linearizable as it is (CheckLinearizable's
//     model, outages or not): nothing acknowledged is lost. lost is 0.
//   - DurableAsync: h is linearizable against the sequential map in which,
//     at each outage of a group, the group's keys go back to their state
//     at some earlier point of the linearization (the recovered log is a
//     prefix of the committed one), a point after every write that was
//     acknowledged more than window before the outage's Start. The
//     rollback happens at the outage's End (until then the dying replicas
//     serve what they hold); the writes between that point and the
//     rollback are lost. lost counts the acknowledged writes that every
//     explanation of h loses: a write acknowledged after Start − window
//     whose loss a later read shows (the key absent or holding an older
//     value), or is implied by the real-time order of the key's writes (a
//     write that followed a lost one is lost too). Where the history
//     shows that something was lost but not what, one write is counted.
//     And across keys: a write of the group called after a lost write
//     returned (so after it in the group's log) must not be one that the
//     history shows kept.
//
// A failure is a *DurableError whose Property names what failed:
// AcknowledgedLost (sync: the history is linearizable only if an outage
// lost writes), AsyncLossBound (async: only if an outage lost a write
// acknowledged before its window), NotAPrefix (async: a lost write and a
// later kept one), NotLinearizable (not even if everything before an
// outage were lost), CheckTimedOut. The error is another error if h or
// outages cannot be checked.
//
// Keys belong to the group their acknowledged gets and single-key writes
// report (Output.Group); a key with no such op is never rolled back (a
// stricter check), and a key reported in two groups is an error. A write
// of unknown outcome may take effect at any time after its call, or never,
// and may be lost if it took effect before an outage.
//
// Limits. Porcupine checks each partition (keys linked by batches and
// scans) alone, and each partition chooses its own rollback point; the
// prefix across partitions is checked only between writes the history
// shows lost and writes it shows kept that are ordered in real time (two
// overlapping writes may be in the log either way). A lost write is seen
// only if a later read (a final read of every key after the load is the
// way to see them all) observes its key; lost counts only those, so it
// is a lower bound on the writes lost. The window is on the history's
// clock: a write acknowledged by a replica before the window but whose
// reply the client saw inside it counts as inside. Counting runs one
// porcupine check per write of the window in each partition that lost
// something: cheap when losses are few, as they are.
//
// opts.Timeout bounds the whole check; opts.VisualizeTo, if set, gets
// porcupine's visualization of the first failed partition (under the
// model of the mode's promise, with the outages as operations).
func CheckDurable(h []Op, mode Durability, outages []Outage, window time.Duration, opts Options) (lost int, err error) {
	if err := validate(h); err != nil {
		return 0, err
	}
	if mode != DurableSync && mode != DurableAsync {
		return 0, fmt.Errorf("kvcheck: unknown durability mode %d", uint8(mode))
	}
	if window < 0 {
		return 0, fmt.Errorf("kvcheck: negative window %v", window)
	}
	outs := slices.Clone(outages)
	slices.SortStableFunc(outs, func(a, b Outage) int { return cmp.Compare(a.Start, b.Start) })
	for i, o := range outs {
		if o.End < o.Start {
			return 0, fmt.Errorf("kvcheck: outage of group %d ends at %d before its start at %d", o.Group, o.End, o.Start)
		}
		for _, p := range outs[:i] {
			if p.Group == o.Group && o.Start <= p.End {
				return 0, fmt.Errorf("kvcheck: outages of group %d overlap: [%d, %d] and [%d, %d]", o.Group, p.Start, p.End, o.Start, o.End)
			}
		}
	}
	groups, err := keyGroups(h)
	if err != nil {
		return 0, err
	}
	c := &durableCheck{h: h, groups: groups, outages: outs, window: int64(window)}
	if opts.Timeout > 0 {
		c.deadline = time.Now().Add(opts.Timeout)
	}
	parts := partition(h)
	dparts := make([]*dpart, len(parts))
	for i := range parts {
		dparts[i] = c.newPart(parts[i])
		if len(dparts[i].outs) > 64 {
			return 0, fmt.Errorf("kvcheck: partition %q has %d outages (at most 64)", parts[i].keys, len(dparts[i].outs))
		}
	}

	// The promise: sync, linearizable as is; async, with the rollbacks
	// the window allows.
	keep := noLoss
	if mode == DurableAsync {
		keep = keepBeforeWindow
	}
	jobs := make([]job, len(dparts))
	for i, p := range dparts {
		jobs[i] = c.job(p, keep, dcand{pos: -1})
	}
	outcomes := c.run(jobs)
	var illegal, timedOut []int
	for i, o := range outcomes {
		switch o {
		case Illegal:
			illegal = append(illegal, i)
		case Unknown:
			timedOut = append(timedOut, i)
		}
	}
	if len(illegal) > 0 {
		return 0, c.diagnose(mode, dparts, illegal, opts)
	}
	if len(timedOut) > 0 {
		return 0, c.timedOut(dparts, timedOut)
	}
	if mode == DurableSync {
		return 0, nil
	}

	// Count the writes every explanation loses: per partition, first
	// with every candidate kept (usually it passes: nothing lost there),
	// else one candidate kept at a time.
	var joint []job
	var jointPart []int
	for i, p := range dparts {
		if len(p.candidates) > 0 {
			joint = append(joint, c.job(p, keepCandidates, dcand{pos: -1}))
			jointPart = append(jointPart, i)
		}
	}
	var single []job
	var singleOf []int // the partition of each single job
	var singleCand []dcand
	failedJoint := map[int]bool{}
	for j, o := range c.run(joint) {
		p := dparts[jointPart[j]]
		switch o {
		case Unknown:
			return 0, c.timedOut(dparts, []int{jointPart[j]})
		case Illegal:
			failedJoint[jointPart[j]] = true
			for _, cd := range p.candidates {
				single = append(single, c.job(p, keepOne, cd))
				singleOf, singleCand = append(singleOf, jointPart[j]), append(singleCand, cd)
			}
		}
	}
	perPart := map[int]int{}
	var lostWrites []dcand // the writes every explanation loses
	for k, o := range c.run(single) {
		switch o {
		case Unknown:
			return 0, c.timedOut(dparts, []int{singleOf[k]})
		case Illegal:
			perPart[singleOf[k]]++
			lostWrites = append(lostWrites, singleCand[k])
		}
	}
	for p := range failedJoint {
		lost += max(perPart[p], 1)
	}
	if err := c.checkPrefix(dparts, lostWrites); err != nil {
		return lost, err
	}
	return lost, nil
}

// checkPrefix checks that no write lost at an outage was followed (in
// real time, so in its group's log) by a write of the group that the
// history shows kept: the recovered log is a prefix. Within a partition
// the model already ensures it (one mark); across partitions, each write
// acknowledged before the outage's End and called after a lost write
// returned is checked with it forced lost: if that fails, it was kept.
func (c *durableCheck) checkPrefix(parts []*dpart, lostWrites []dcand) error {
	if len(lostWrites) == 0 {
		return nil
	}
	isLost := map[int]bool{}
	for _, l := range lostWrites {
		isLost[l.pos] = true
	}
	type pair struct {
		part  int
		later dcand
	}
	var jobs []job
	var pairs []pair
	for oi, out := range c.outages {
		earliest := int64(math.MaxInt64)
		for _, l := range lostWrites {
			if l.out == oi {
				earliest = min(earliest, c.h[l.pos].Return)
			}
		}
		if earliest == math.MaxInt64 {
			continue
		}
		for pi, p := range parts {
			for _, cd := range p.candidates {
				o := &c.h[cd.pos]
				if cd.out != oi || isLost[cd.pos] || o.Call <= earliest || o.Return > out.End {
					continue
				}
				jobs = append(jobs, c.job(p, loseOne, cd))
				pairs = append(pairs, pair{pi, cd})
			}
		}
	}
	for k, res := range c.run(jobs) {
		if res != Illegal { // Ok: it may have been lost too; Unknown: undecided, not a verdict
			continue
		}
		b := pairs[k].later
		ob := &c.h[b.pos]
		for _, l := range lostWrites {
			oa := &c.h[l.pos]
			if l.out != b.out || oa.Return >= ob.Call {
				continue
			}
			pa := -1
			for pi, p := range parts {
				if slices.ContainsFunc(p.candidates, func(x dcand) bool { return x.pos == l.pos }) {
					pa = pi
				}
			}
			e := &DurableError{Property: NotAPrefix,
				Msg: fmt.Sprintf("%s was lost at the outage of group %d but %s, called after it returned, was kept: the recovered log is not a prefix of the group's",
					describe(l.pos, oa), c.outages[b.out].Group, describe(b.pos, ob))}
			for _, pi := range []int{pa, pairs[k].part} {
				if pi >= 0 {
					e.Partitions = append(e.Partitions, Partition{Keys: parts[pi].keys, Ops: len(parts[pi].ops), Outcome: Illegal})
				}
			}
			return e
		}
	}
	return nil
}

// keepRule says which writes a check forbids an outage to lose.
type keepRule uint8

const (
	noLoss           keepRule = iota // no outage: plain linearizability (sync's promise)
	keepNone                         // every write taken before an outage may be lost
	keepBeforeWindow                 // writes acknowledged before the window must stay (async's promise)
	keepCandidates                   // and the window's writes too (nothing lost)
	keepOne                          // async's promise and one candidate of the window
	loseOne                          // async's promise, and one candidate must be lost
)

// durableCheck is one CheckDurable run.
type durableCheck struct {
	h        []Op
	groups   map[string]int
	outages  []Outage // sorted by Start
	window   int64
	deadline time.Time
}

// dpart is a partition and the outages of its keys' groups.
type dpart struct {
	part
	outs    []int      // indexes into durableCheck.outages, by Start
	outKeys [][]string // per outs[i]: the partition's keys of its group
	prev    []int      // per outs[i]: the previous outage of its group (index into outs), or -1
	// opOuts: per op of part.ops, the bit set of outs whose group the op
	// touches.
	opOuts []uint64
	// candidates: the acknowledged writes that changed the store and may
	// be lost under async's promise: acknowledged at or after Start −
	// window of an outage of their group, called before its End.
	candidates []dcand
}

// dcand is a write an outage may lose.
type dcand struct {
	pos int // in h
	out int // the outage: index into durableCheck.outages
}

// keyGroups maps each key to the group its acknowledged single-key ops
// report.
func keyGroups(h []Op) (map[string]int, error) {
	g := map[string]int{}
	for i := range h {
		o := &h[i]
		if o.Out.Unknown || o.Kind == Batch || o.Kind == Scan {
			continue
		}
		if old, ok := g[o.Key]; ok && old != o.Out.Group {
			return nil, fmt.Errorf("kvcheck: key %q reported in groups %d and %d (%s)", o.Key, old, o.Out.Group, describe(i, o))
		}
		g[o.Key] = o.Out.Group
	}
	return g, nil
}

// writes reports whether o, acknowledged, changed the store (a CAS or a
// merge that failed did not).
func (o *Op) changed() bool {
	switch o.Kind {
	case Put, Delete, Batch:
		return true
	case CAS, Merge:
		return o.Out.OK
	}
	return false
}

func (c *durableCheck) newPart(p part) *dpart {
	d := &dpart{part: p}
	inPart := map[int]bool{}
	for _, k := range p.keys {
		if g, ok := c.groups[k]; ok {
			inPart[g] = true
		}
	}
	slot := map[int]int{} // group -> its latest outage's index in d.outs
	for i, o := range c.outages {
		if !inPart[o.Group] {
			continue
		}
		prev, ok := slot[o.Group]
		if !ok {
			prev = -1
		}
		slot[o.Group] = len(d.outs)
		d.outs = append(d.outs, i)
		d.prev = append(d.prev, prev)
		var keys []string
		for _, k := range p.keys {
			if g, ok := c.groups[k]; ok && g == o.Group {
				keys = append(keys, k)
			}
		}
		d.outKeys = append(d.outKeys, keys)
	}
	if len(d.outs) == 0 {
		return d
	}
	d.opOuts = make([]uint64, len(p.ops))
	for j, po := range p.ops {
		in := po.Input.(input)
		var touched []int
		opKeys(in.op, in.pos, nil, func(k string) {
			if g, ok := c.groups[k]; ok {
				touched = append(touched, g)
			}
		})
		if in.op.Kind == Scan {
			touched = touched[:0]
			for _, k := range p.keys {
				if g, ok := c.groups[k]; ok && scanCovers(in.op, k) {
					touched = append(touched, g)
				}
			}
		}
		var bits uint64
		for i, oi := range d.outs {
			if slices.Contains(touched, c.outages[oi].Group) {
				bits |= 1 << i
			}
		}
		d.opOuts[j] = bits
		o := in.op
		if !o.isWrite() || o.Out.Unknown || !o.changed() {
			continue
		}
		for i, oi := range d.outs {
			out := c.outages[oi]
			if bits&(1<<i) != 0 && o.Return >= out.Start-c.window && o.Call <= out.End {
				d.candidates = append(d.candidates, dcand{pos: in.pos, out: oi})
				break
			}
		}
	}
	return d
}

// scanCovers reports whether key k is in scan o's range.
func scanCovers(o *Op, k string) bool { return k >= o.Key && (o.End == "" || k < o.End) }

// job builds the check of p under rule (keepOne, loseOne: with the
// candidate one kept, or lost, at its outage).
func (c *durableCheck) job(p *dpart, rule keepRule, one dcand) job {
	if rule == noLoss || len(p.outs) == 0 {
		return job{model: model, ops: p.ops}
	}
	ops := make([]porcupine.Operation, 0, len(p.ops)+2*len(p.outs))
	minCall := int64(math.MaxInt64)
	for j, po := range p.ops {
		minCall = min(minCall, po.Call)
		in := po.Input.(input)
		o := in.op
		var keep, lose uint64
		if o.isWrite() && !o.Out.Unknown && o.changed() && rule != keepNone {
			for i, oi := range p.outs {
				if p.opOuts[j]&(1<<i) == 0 {
					continue
				}
				out := c.outages[oi]
				candidate := o.Return >= out.Start-c.window && o.Call <= out.End
				switch {
				case rule == loseOne && in.pos == one.pos && oi == one.out:
					lose |= 1 << i
				case !candidate || rule == keepCandidates || rule == keepOne && in.pos == one.pos && oi == one.out:
					keep |= 1 << i
				}
			}
		}
		po.Input = dinput{input: in, keep: keep, lose: lose}
		ops = append(ops, po)
	}
	for i, oi := range p.outs {
		out := c.outages[oi]
		markCall := min(minCall, out.Start) // the mark may precede every op: back to the initial state
		if p.prev[i] >= 0 {
			markCall = c.outages[p.outs[p.prev[i]]].Start
		}
		ops = append(ops,
			porcupine.Operation{ClientId: -1, Input: dinput{mark: true, outage: i, group: out.Group}, Call: markCall, Return: out.End},
			porcupine.Operation{ClientId: -1, Input: dinput{rollback: true, outage: i, group: out.Group}, Call: out.End, Return: out.End})
	}
	return job{model: durableModel(p), ops: ops}
}

// run runs jobs within the check's deadline.
func (c *durableCheck) run(jobs []job) []Outcome { return runJobs(jobs, c.deadline) }

// diagnose names the property the Illegal partitions broke: loss at an
// outage if they pass once every write before an outage may be lost,
// else linearizability.
func (c *durableCheck) diagnose(mode Durability, parts []*dpart, illegal []int, opts Options) error {
	var jobs []job
	var which []int
	for _, i := range illegal {
		if len(parts[i].outs) > 0 {
			jobs = append(jobs, c.job(parts[i], keepNone, dcand{pos: -1}))
			which = append(which, i)
		}
	}
	explained := map[int]Outcome{}
	for k, o := range c.run(jobs) {
		explained[which[k]] = o
	}
	var loss, lin []Partition
	var lossIdx, linIdx, undecided []int
	for _, i := range illegal {
		p := Partition{Keys: parts[i].keys, Ops: len(parts[i].ops), Outcome: Illegal}
		o, ok := explained[i]
		switch {
		case ok && o == Ok:
			loss, lossIdx = append(loss, p), append(lossIdx, i)
		case ok && o == Unknown:
			undecided = append(undecided, i)
		default: // Illegal, or no outage to explain it
			lin, linIdx = append(lin, p), append(linIdx, i)
		}
	}
	if len(lin) == 0 && len(undecided) > 0 {
		// Illegal under the promise, but whether a loss explains it was
		// not decided in time: a failure either way.
		e := c.timedOut(parts, undecided).(*DurableError)
		e.Msg = fmt.Sprintf("%d partitions break the %v promise and porcupine did not decide in time whether a loss at an outage explains them", len(undecided), mode)
		return e
	}
	e := &DurableError{}
	rule := noLoss
	if mode == DurableAsync {
		rule = keepBeforeWindow
	}
	show := lossIdx
	switch {
	case len(lin) > 0:
		e.Property, e.Partitions, show = NotLinearizable, lin, linIdx
		e.Msg = "the history is not linearizable even if every write taken before an outage of its group were lost at it"
		if len(loss) > 0 {
			e.Msg += fmt.Sprintf(" (and %d more partitions linearizable only with writes lost at an outage)", len(loss))
		}
	case mode == DurableSync:
		e.Property, e.Partitions = AcknowledgedLost, loss
		e.Msg = "linearizable only if an outage lost acknowledged writes (sync mode loses none)" + c.outagesString()
	default:
		e.Property, e.Partitions = AsyncLossBound, loss
		e.Msg = fmt.Sprintf("linearizable only if an outage lost a write acknowledged more than the window (%v) before it", time.Duration(c.window)) + c.outagesString()
	}
	if opts.VisualizeTo != "" {
		// The first failed partition only: the rollback model is per
		// partition.
		j := c.job(parts[show[0]], rule, dcand{pos: -1})
		if err := visualizeModel(j.model, [][]porcupine.Operation{j.ops}, opts.VisualizeTo, opts.Timeout); err != nil {
			return fmt.Errorf("%w (and the visualization failed: %v)", e, err)
		}
		e.Visualization = opts.VisualizeTo
	}
	return e
}

func (c *durableCheck) outagesString() string {
	var b strings.Builder
	b.WriteString(" (outages:")
	for _, o := range c.outages {
		fmt.Fprintf(&b, " group %d [%d, %d]", o.Group, o.Start, o.End)
	}
	b.WriteString(")")
	return b.String()
}

func (c *durableCheck) timedOut(parts []*dpart, which []int) error {
	e := &DurableError{Property: CheckTimedOut, Msg: "porcupine did not decide in time"}
	for _, i := range which {
		e.Partitions = append(e.Partitions, Partition{Keys: parts[i].keys, Ops: len(parts[i].ops), Outcome: Unknown})
	}
	return e
}

// dinput is an operation of the durable model: a history op (with the
// outages it must survive), or an outage's mark or rollback.
type dinput struct {
	input
	keep     uint64 // a write: the outages (bits of dpart.outs) that must not lose it
	lose     uint64 // a write: the outages that must lose it (it took effect between mark and rollback)
	mark     bool   // outage's mark: the state its rollback returns to
	rollback bool   // outage's rollback: its group's keys go back to the mark
	outage   int    // mark, rollback: index into dpart.outs
	group    int
}

// dstate is the durable model's state: the map, each outage's phase
// ('0' before its mark, '1' marked, '2' rolled back) and the state at the
// marks of the outages in phase '1'. It is never modified once made.
type dstate struct {
	cur   state
	phase string
	saved []state
}

// durableModel is the sequential map with p's outages: an outage's mark
// may be linearized anywhere (after its group's previous rollback) and
// saves the state; its rollback, linearized within the outage, restores
// the group's keys to it. A write that must survive an outage may not be
// linearized between its mark and its rollback.
func durableModel(p *dpart) porcupine.Model {
	return porcupine.Model{
		Init: func() any {
			return dstate{cur: state{}, phase: strings.Repeat("0", len(p.outs)), saved: make([]state, len(p.outs))}
		},
		Step: func(st, in, out any) (bool, any) {
			s, d := st.(dstate), in.(dinput)
			switch {
			case d.mark:
				i := d.outage
				if s.phase[i] != '0' || p.prev[i] >= 0 && s.phase[p.prev[i]] != '2' {
					return false, s
				}
				saved := slices.Clone(s.saved)
				saved[i] = s.cur
				return true, dstate{cur: s.cur, phase: setPhase(s.phase, i, '1'), saved: saved}
			case d.rollback:
				i := d.outage
				if s.phase[i] != '1' {
					return false, s
				}
				back := s.saved[i]
				cur := with(s.cur, func(n state) {
					for _, k := range p.outKeys[i] {
						if v, ok := back[k]; ok {
							n[k] = v
						} else {
							delete(n, k)
						}
					}
				})
				saved := slices.Clone(s.saved)
				saved[i] = nil
				return true, dstate{cur: cur, phase: setPhase(s.phase, i, '2'), saved: saved}
			}
			for i := range p.outs {
				if d.keep&(1<<i) != 0 && s.phase[i] == '1' || d.lose&(1<<i) != 0 && s.phase[i] != '1' {
					return false, s
				}
			}
			ok, cur := model.Step(s.cur, d.input, out)
			if !ok {
				return false, s
			}
			return true, dstate{cur: cur.(state), phase: s.phase, saved: s.saved}
		},
		Equal: func(a, b any) bool {
			x, y := a.(dstate), b.(dstate)
			return x.phase == y.phase && maps.Equal(x.cur, y.cur) && slices.EqualFunc(x.saved, y.saved, func(u, v state) bool {
				return (u == nil) == (v == nil) && maps.Equal(u, v)
			})
		},
		Hash: func(st any) uint64 {
			s := st.(dstate)
			h := model.Hash(s.cur) ^ maphash.String(hashSeed, s.phase)
			for i, sv := range s.saved {
				if sv != nil {
					h += (model.Hash(sv) + 1) * uint64(2*i+3)
				}
			}
			return h
		},
		DescribeOperation: func(in, out any) string {
			d := in.(dinput)
			switch {
			case d.mark:
				return fmt.Sprintf("outage %d of group %d: the point it may roll back to", d.outage, d.group)
			case d.rollback:
				return fmt.Sprintf("outage %d of group %d: roll back", d.outage, d.group)
			}
			return model.DescribeOperation(d.input, out)
		},
		DescribeState: func(st any) string {
			s := st.(dstate)
			return fmt.Sprintf("%s phases %s", model.DescribeState(s.cur), s.phase)
		},
	}
}

func setPhase(phase string, i int, c byte) string {
	b := []byte(phase)
	b[i] = c
	return string(b)
}
