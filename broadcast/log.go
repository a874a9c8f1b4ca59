package broadcast

// entry is one message of the Log (Acuerdo Fig. 1 l.33).
type entry struct {
	hdr  MsgHdr
	id   proposalID
	data []byte
	slab *slab // holds data, with a reference for this entry (nil: data is not in a slab)
}

// entryLog is the Log (Acuerdo Fig. 1 l.33): accepted entries in header
// order, held by value in a ring buffer. Entries arrive in order at the
// back (Fig. 4 l.40, Fig. 5 l.49), leave from the front when pruned, and a
// diff replaces the back (Fig. 5 l.62-63), so every common operation is
// O(1); a lookup by header is O(1) within the last epoch (counts are
// consecutive there) and a binary search otherwise.
//
// A *entry it returns is valid until the next Set, Pop or Clear.
type entryLog struct {
	buf  []entry // len is zero or a power of two
	head int     // buf index of the first entry
	n    int
}

// Len is the number of entries.
func (l *entryLog) Len() int { return l.n }

// at returns the i-th entry in header order, 0 <= i < Len.
func (l *entryLog) at(i int) *entry { return &l.buf[(l.head+i)&(len(l.buf)-1)] }

// Min returns the first entry.
func (l *entryLog) Min() (*entry, bool) {
	if l.n == 0 {
		return nil, false
	}
	return l.at(0), true
}

// Max returns the last entry.
func (l *entryLog) Max() (*entry, bool) {
	if l.n == 0 {
		return nil, false
	}
	return l.at(l.n - 1), true
}

// PopMin removes the first entry.
func (l *entryLog) PopMin() {
	if l.n == 0 {
		return
	}
	l.at(0).slab.unref()
	*l.at(0) = entry{} // drop the data reference
	l.head = (l.head + 1) & (len(l.buf) - 1)
	l.n--
}

// PopMax removes the last entry.
func (l *entryLog) PopMax() {
	if l.n == 0 {
		return
	}
	l.at(l.n - 1).slab.unref()
	*l.at(l.n - 1) = entry{}
	l.n--
}

// Clear removes every entry.
func (l *entryLog) Clear() {
	for i := range l.n {
		l.at(i).slab.unref()
	}
	clear(l.buf)
	l.head, l.n = 0, 0
}

// search returns the position of the first entry whose header is not
// below h (Len if there is none).
func (l *entryLog) search(h MsgHdr) int {
	if l.n == 0 {
		return 0
	}
	last := l.at(l.n - 1).hdr
	if last.Less(h) {
		return l.n
	}
	if last.E == h.E && last.Cnt-h.Cnt < uint64(l.n) {
		// Counts are consecutive within an epoch: the guess is exact
		// unless the epoch has gaps, which the check catches.
		if i := l.n - 1 - int(last.Cnt-h.Cnt); l.at(i).hdr == h {
			return i
		}
	}
	lo, hi := 0, l.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.at(m).hdr.Less(h) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// above returns the position of the first entry whose header is above h.
func (l *entryLog) above(h MsgHdr) int {
	i := l.search(h)
	if i < l.n && l.at(i).hdr == h {
		i++
	}
	return i
}

// Get returns the entry with header h.
func (l *entryLog) Get(h MsgHdr) (*entry, bool) {
	if i := l.search(h); i < l.n && l.at(i).hdr == h {
		return l.at(i), true
	}
	return nil, false
}

// Set adds e, replacing an entry with the same header; the Log takes over
// e's slab reference.
func (l *entryLog) Set(e entry) {
	i := l.search(e.hdr)
	if i < l.n && l.at(i).hdr == e.hdr {
		l.at(i).slab.unref()
		*l.at(i) = e
		return
	}
	if l.n == len(l.buf) {
		l.grow()
	}
	l.n++
	for k := l.n - 1; k > i; k-- { // only when inserting before the back
		*l.at(k) = *l.at(k - 1)
	}
	*l.at(i) = e
}

func (l *entryLog) grow() {
	nb := make([]entry, max(256, 2*len(l.buf)))
	for i := 0; i < l.n; i++ {
		nb[i] = *l.at(i)
	}
	l.buf, l.head = nb, 0
}

// Ascend calls fn on the entries from the first one above h, in order,
// while fn returns true.
func (l *entryLog) Ascend(h MsgHdr, fn func(e *entry) bool) {
	for i := l.above(h); i < l.n; i++ {
		if !fn(l.at(i)) {
			return
		}
	}
}
