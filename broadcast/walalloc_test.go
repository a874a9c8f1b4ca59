package broadcast

import (
	"bytes"
	"testing"

	"github.com/rdmakv/rdmakv/wal"
)

// countingWAL is a WAL whose AppendFlags records what it was given and
// keeps nothing (the other methods are the nil interface's: walEntry
// must not call them).
type countingWAL struct {
	WAL
	n    uint64
	last []byte // the last record's payload, copied (its parts joined)
}

func (c *countingWAL) AppendFlags(typ wal.RecType, flags uint8, parts ...[]byte) (uint64, bool) {
	c.last = c.last[:0]
	for _, p := range parts {
		c.last = append(c.last, p...)
	}
	c.n++
	return c.n, true
}

// TestWALEntryAllocs: logging an entry (walEntry, run for every entry at
// the leader and at each follower in Sync and Async) allocates nothing,
// writes the entry's header and data, and keeps no reference to the
// entry's data once appended (branch asy5: its parts escaped through the
// WAL interface and allocated a slice per entry on every replica).
func TestWALEntryAllocs(t *testing.T) {
	c := &countingWAL{last: make([]byte, 0, 4096)}
	r := &Replica{dur: &durable{w: c}}
	e := &entry{hdr: MsgHdr{E: 7, Cnt: 9}, id: proposalID{origin: 3, oinc: 1, pseq: 5}, data: bytes.Repeat([]byte{0xab}, 300)}
	if seq := r.walEntry(e, 0); seq != 1 {
		t.Fatalf("walEntry: seq %d, want 1", seq)
	}
	if len(c.last) != 32+len(e.data) || !bytes.Equal(c.last[32:], e.data) {
		t.Fatalf("walEntry wrote %d bytes, want its 32-byte header and the entry's %d", len(c.last), len(e.data))
	}
	if r.dur.parts[0] != nil || r.dur.parts[1] != nil {
		t.Fatal("walEntry kept the entry's parts after the append")
	}
	if raceEnabled {
		return // the race detector allocates on its own (make noalloc runs this)
	}
	if allocs := testing.AllocsPerRun(1000, func() { r.walEntry(e, 0) }); allocs > 0 {
		t.Fatalf("walEntry allocates %.2f per entry", allocs)
	}
}
