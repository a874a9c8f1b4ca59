package wal

// Share splits one Device into two that keep its single, ordered queue:
// the log's Writer and broadcast's snapshot store submit to the same disk
// (the simulator schedules both like one device), and each reaps only its
// own completions. Tags of the second device have the top bit set on the
// shared device; the first device's tags must not (a Writer's never do).
func Share(dev Device) (first, second Device) {
	s := &shared{dev: dev}
	return &shareEnd{s: s, side: 0}, &shareEnd{s: s, side: 1}
}

const shareBit = 1 << 63

type shared struct {
	dev  Device
	buf  []Done
	done [2][]Done
}

func (s *shared) reap() {
	s.buf = s.dev.Reap(s.buf[:0])
	for _, d := range s.buf {
		if d.Tag&shareBit != 0 {
			d.Tag &^= shareBit
			s.done[1] = append(s.done[1], d)
		} else {
			s.done[0] = append(s.done[0], d)
		}
	}
}

type shareEnd struct {
	s    *shared
	side int
}

func (e *shareEnd) Submit(op IO) bool {
	if e.side == 1 {
		op.Tag |= shareBit
	}
	return e.s.dev.Submit(op)
}

func (e *shareEnd) Reap(dst []Done) []Done {
	e.s.reap()
	dst = append(dst, e.s.done[e.side]...)
	e.s.done[e.side] = e.s.done[e.side][:0]
	return dst
}
