package sim

import "time"

// itemKind is what a scheduled item does when its time comes.
type itemKind uint8

const (
	itLand     itemKind = iota + 1 // land the head op of c
	itComplete                     // return the head completion of c
	itWake                         // step n: something happened that it may want to see
	itTimer                        // step n: a time it asked for (Env.WakeAt)
	itTick                         // step n: its periodic tick
	itAction                       // run fn (Sim.At, fault schedule)
)

// item is one scheduled happening. Items at the same time run in the order
// they were scheduled (seq), so the order is a function of the seed alone.
// Items hold no pointers (the heap moves them a lot): ref indexes
// Sim.nodes, Sim.connTab or Sim.actions, by kind.
type item struct {
	at   time.Duration
	seq  uint64
	gen  uint64 // node or conn generation the item was scheduled for; stale items are skipped
	ref  int32
	kind itemKind
}

// agenda is a binary min-heap of items ordered by (at, seq).
type agenda struct {
	items []item
	seq   uint64
}

func (a *agenda) len() int { return len(a.items) }

func (a *agenda) less(i, j int) bool {
	x, y := &a.items[i], &a.items[j]
	return x.at < y.at || x.at == y.at && x.seq < y.seq
}

func (a *agenda) push(it item) {
	a.seq++
	it.seq = a.seq
	a.items = append(a.items, it)
	i := len(a.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !a.less(i, p) {
			break
		}
		a.items[i], a.items[p] = a.items[p], a.items[i]
		i = p
	}
}

func (a *agenda) peek() *item { return &a.items[0] }

func (a *agenda) pop() item {
	top := a.items[0]
	last := len(a.items) - 1
	a.items[0] = a.items[last]
	a.items[last] = item{}
	a.items = a.items[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && a.less(l, m) {
			m = l
		}
		if r < last && a.less(r, m) {
			m = r
		}
		if m == i {
			return top
		}
		a.items[i], a.items[m] = a.items[m], a.items[i]
		i = m
	}
}

// times is a FIFO of due times over a growing circular buffer.
type times struct {
	buf  []time.Duration // len is 0 or a power of two
	head int
	n    int
}

func (r *times) len() int { return r.n }

func (r *times) front() time.Duration { return r.buf[r.head] }

func (r *times) push(t time.Duration) {
	if r.n == len(r.buf) {
		nb := make([]time.Duration, max(8, 2*len(r.buf)))
		for i := range r.n {
			nb[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = t
	r.n++
}

func (r *times) pop() time.Duration {
	t := r.buf[r.head]
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return t
}

// truncate keeps the first keep times.
func (r *times) truncate(keep int) { r.n = min(r.n, max(keep, 0)) }
