// Package kvcheck records the histories of concurrent kv clients and checks
// them against what the kv package promises:
//
//   - CheckLinearizable: the writes and the linearizable gets are
//     linearizable against a sequential map (porcupine, partitioned by key,
//     or by the connected components of keys that batches link).
//   - CheckStale: a stale-ok get returns the key's state after exactly the
//     writes whose entry index is at most the applied index it reports, so
//     in particular only values that some write wrote.
//   - CheckDurable: CheckLinearizable across whole-group outages (kill -9
//     of every replica of a group, restart from the data dirs), against a
//     durability mode's promise: sync loses nothing acknowledged; async
//     may lose only the writes acknowledged within a window before the
//     outage, and it counts the ones the history shows lost.
//
// A Recorder timestamps each operation's call and return from one
// monotonic clock; an operation whose outcome the client does not know (a
// write that timed out, or failed with an ambiguous error) is ended with
// Output.Unknown: such a write may have taken effect at any time after its
// call, and such a get says nothing and is dropped.
package kvcheck

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/kv/fielded"
)

// Kind is an operation's kind.
type Kind uint8

// Kinds of operations.
const (
	Get Kind = iota + 1
	Put
	Delete
	CAS   // put Value if the key holds Old (or is absent, with OldAbsent)
	Batch // Batch's puts and deletes, atomically
	// Merge sets Fields in the key's value, a fielded value (package
	// kv/fielded; an absent key takes Fields), leaving its other fields;
	// it fails (Out.OK false), changing nothing, if the key holds a value
	// that is not a fielded value (kv.OpMerge).
	Merge
	// Scan reads the keys in [Key, End) (End "": no end) in order, at
	// most Limit of them (0: no limit); Out.Pairs is what it returned.
	// It is checked against the model's range at its linearization
	// point (an ordered keyspace's scan through the log, or one-sided
	// inside one group).
	Scan
)

func (k Kind) String() string {
	return enumString(k, "kind", "", "get", "put", "delete", "cas", "batch", "merge", "scan")
}

// enumString is the name of v: names[v], or kind(v) if it has none (v
// out of names, or its name ""). Every enum of the package names its
// values through it.
func enumString[T ~uint8](v T, kind string, names ...string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", kind, uint8(v))
}

// Op is one operation of a history: what a client asked (Kind, Key, Value,
// Old, OldAbsent, Batch, Stale), when (Call and Return, nanoseconds from
// one monotonic clock) and what it saw (Out).
type Op struct {
	Client    int
	Kind      Kind
	Key       string // Get, Put, Delete, CAS
	Value     string // Put, CAS: the value written
	Old       string // CAS: the value expected
	OldAbsent bool   // CAS: expect the key absent (Old is ignored)
	Batch     []BatchOp
	Fields    map[string]string // Merge: the fields set
	Stale     bool              // a stale-ok get (CheckStale checks it; CheckLinearizable skips it)
	End       string            // Scan: the end of the range (exclusive; "": none)
	Limit     int               // Scan: the most pairs (0: no limit)
	Reverse   bool              // Scan: in descending key order (the last Limit pairs of the range)
	Call      int64
	Return    int64
	Out       Output
}

// BatchOp is one put or delete of a Batch. A batch may hold several ops
// on one key: they apply in order.
type BatchOp struct {
	Key, Value string
	Delete     bool
}

// Output is what a client saw.
type Output struct {
	Found bool   // Get
	Value string // Get, when Found
	OK    bool   // CAS: the condition held and the value was written; Merge: it applied
	// Unknown: the client does not know the outcome. A write may or may
	// not have taken effect (its return time counts as infinity); a get
	// is dropped.
	Unknown bool
	// Applied: for a stale-ok get, the applied entry index the replica
	// reported (kv.GetResult.Applied).
	Applied uint64
	// Index: for an acknowledged write, the entry index its group applied
	// it at (the reply's version >> 16; see VersionIndex). 0: not
	// recorded (CheckStale then only knows that the write happened).
	Index uint64
	// Version: optionally, for an acknowledged write, the version of its
	// first write (kv.Result.Version); it orders writes that share an
	// entry. If Index is 0, VersionIndex(Version) is used.
	Version uint64
	// Group: the group that applied the write, or that the get read.
	// Entry indexes are compared only within one group.
	Group int
	// Pairs: what a Scan returned, in order.
	Pairs []KV
}

// KV is one pair a Scan returned.
type KV struct{ Key, Value string }

// VersionIndex is the entry index of a kv version (index<<16 | op number).
func VersionIndex(version uint64) uint64 { return version >> 16 }

// index is the write's entry index (0: unknown).
func (o *Op) index() uint64 {
	if o.Out.Unknown {
		return 0
	}
	if o.Out.Index != 0 {
		return o.Out.Index
	}
	return VersionIndex(o.Out.Version)
}

// isWrite reports whether o may change the store.
func (o *Op) isWrite() bool { return o.Kind != Get && o.Kind != Scan }

// isRead reports whether o only reads (a get or a scan).
func (o *Op) isRead() bool { return !o.isWrite() }

// String describes o for error messages and visualizations.
func (o *Op) String() string {
	var b strings.Builder
	if o.Stale {
		b.WriteString("stale ")
	}
	b.WriteString(o.Kind.String())
	switch o.Kind {
	case Get:
		fmt.Fprintf(&b, "(%q)", o.Key)
		if o.Out.Unknown {
			b.WriteString(" -> ?")
		} else if o.Out.Found {
			fmt.Fprintf(&b, " -> %q", o.Out.Value)
		} else {
			b.WriteString(" -> absent")
		}
		if o.Stale {
			fmt.Fprintf(&b, " applied %d", o.Out.Applied)
		}
	case Put:
		fmt.Fprintf(&b, "(%q, %q)", o.Key, o.Value)
	case Delete:
		fmt.Fprintf(&b, "(%q)", o.Key)
	case CAS:
		if o.OldAbsent {
			fmt.Fprintf(&b, "(%q, absent -> %q)", o.Key, o.Value)
		} else {
			fmt.Fprintf(&b, "(%q, %q -> %q)", o.Key, o.Old, o.Value)
		}
		switch {
		case o.Out.Unknown:
		case o.Out.OK:
			b.WriteString(" -> ok")
		default:
			b.WriteString(" -> failed")
		}
	case Merge:
		fmt.Fprintf(&b, "(%q, %s)", o.Key, fieldsString(o.Fields))
		switch {
		case o.Out.Unknown:
		case o.Out.OK:
			b.WriteString(" -> ok")
		default:
			b.WriteString(" -> failed")
		}
	case Scan:
		fmt.Fprintf(&b, "[%q, %q) limit %d", o.Key, o.End, o.Limit)
		if o.Reverse {
			b.WriteString(" reverse")
		}
		if o.Out.Unknown {
			b.WriteString(" -> ?")
		} else {
			b.WriteString(" -> {")
			for i, p := range o.Out.Pairs {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%q: %q", p.Key, p.Value)
			}
			b.WriteString("}")
		}
	case Batch:
		b.WriteString("(")
		for i, bo := range o.Batch {
			if i > 0 {
				b.WriteString(", ")
			}
			if bo.Delete {
				fmt.Fprintf(&b, "delete %q", bo.Key)
			} else {
				fmt.Fprintf(&b, "put %q=%q", bo.Key, bo.Value)
			}
		}
		b.WriteString(")")
	}
	if o.Out.Unknown && o.isWrite() {
		b.WriteString(" (outcome unknown)")
	} else if o.isWrite() && o.index() != 0 {
		fmt.Fprintf(&b, " at index %d", o.index())
	}
	return b.String()
}

// describe names the op at position pos of a history.
func describe(pos int, o *Op) string {
	return fmt.Sprintf("op %d (client %d, %s, [%d, %d])", pos, o.Client, o, o.Call, o.Return)
}

// validate checks that h can be checked.
func validate(h []Op) error {
	for i := range h {
		o := &h[i]
		switch o.Kind {
		case Get, Put, Delete, CAS, Merge:
			if len(o.Batch) != 0 {
				return fmt.Errorf("kvcheck: op %d: a %s with batch ops", i, o.Kind)
			}
			if o.Kind != Merge && o.Fields != nil {
				return fmt.Errorf("kvcheck: op %d: a %s with fields", i, o.Kind)
			}
		case Batch:
			if len(o.Batch) == 0 {
				return fmt.Errorf("kvcheck: op %d: an empty batch", i)
			}
		case Scan:
			if len(o.Batch) != 0 || o.Fields != nil || o.Limit < 0 || o.End != "" && o.End <= o.Key {
				return fmt.Errorf("kvcheck: op %d: a scan with batch ops, fields, a negative limit or an empty range", i)
			}
		default:
			return fmt.Errorf("kvcheck: op %d: unknown kind %d", i, uint8(o.Kind))
		}
		if o.Stale && o.Kind != Get {
			return fmt.Errorf("kvcheck: op %d: a stale-ok %s (only gets may be stale)", i, o.Kind)
		}
		if !o.Out.Unknown && o.Return < o.Call {
			return fmt.Errorf("kvcheck: op %d: returned at %d before its call at %d", i, o.Return, o.Call)
		}
	}
	return nil
}

// Recorder records a history; it is safe for concurrent use. The zero
// value is ready and uses the default clock.
type Recorder struct {
	mu    sync.Mutex
	clock func() int64
	ops   []Op
	ended []bool
}

// NewRecorder returns a Recorder timing with clock, which must be
// monotonic (nanoseconds); nil means the default, the monotonic time since
// the Recorder was made. The clock is called with the Recorder's lock
// held.
func NewRecorder(clock func() int64) *Recorder {
	r := &Recorder{clock: clock}
	r.init()
	return r
}

func (r *Recorder) init() {
	if r.clock == nil {
		start := time.Now()
		r.clock = func() int64 { return int64(time.Since(start)) }
	}
}

// Begin records op, called now by client, and returns its id for End.
// Call it just before the operation is issued. op.Client, op.Call and
// op.Out are set here (Out by End); op.Batch is copied.
func (r *Recorder) Begin(client int, op Op) (id int) {
	op.Client = client
	op.Batch = append([]BatchOp(nil), op.Batch...)
	if op.Fields != nil {
		op.Fields = maps.Clone(op.Fields)
	}
	op.Out = Output{}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	op.Call = r.clock()
	r.ops = append(r.ops, op)
	r.ended = append(r.ended, false)
	return len(r.ops) - 1
}

// End records that the operation id returned now with out. Call it just
// after the reply (or the error) arrived; ending an op twice panics.
func (r *Recorder) End(id int, out Output) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id < 0 || id >= len(r.ops) || r.ended[id] {
		panic(fmt.Sprintf("kvcheck: End(%d) of an op not begun or already ended", id))
	}
	r.ops[id].Return = r.clock()
	r.ops[id].Out = out
	r.ended[id] = true
}

// Now is the Recorder's clock now: the time of an event that is not an
// operation (an outage's start and end, for CheckDurable).
func (r *Recorder) Now() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	return r.clock()
}

// History returns a copy of the operations recorded so far, in the order
// they began. An operation not ended yet has Out.Unknown set (and Return
// 0): it may still take effect.
func (r *Recorder) History() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := make([]Op, len(r.ops))
	copy(h, r.ops)
	for i := range h {
		if !r.ended[i] {
			h[i].Out = Output{Unknown: true}
		}
	}
	return h
}

// fieldsString describes a field map, in name order.
func fieldsString(m map[string]string) string {
	var b strings.Builder
	b.WriteString("{")
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q: %q", k, m[k])
	}
	b.WriteString("}")
	return b.String()
}

// EncodeFields is the fielded value (kv/fielded) of fields: what a Merge
// into an absent key stores, and what a Get of it returns.
func EncodeFields(fields map[string]string) string {
	m := make(map[string][]byte, len(fields))
	for k, v := range fields {
		m[k] = []byte(v)
	}
	return string(fielded.Encode(m))
}

// mergeInto is the value a Merge of fields leaves in a key holding v
// (present) and whether it applies.
func mergeInto(v string, present bool, fields map[string]string) (string, bool) {
	if !present {
		return EncodeFields(fields), true
	}
	out, err := fielded.Merge(nil, []byte(v), []byte(EncodeFields(fields)))
	if err != nil {
		return v, false
	}
	return string(out), true
}
