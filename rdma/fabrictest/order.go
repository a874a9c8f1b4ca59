package fabrictest

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// FIFO layout of the region the writer fills:
//
//	offset 0          8          fifoSlots
//	       +----------+-- ... ---+------------------+------------------+--
//	       | counter  |  unused  | slot 1: a | b    | slot 2: a | b    | ...
//	       +----------+-- ... ---+------------------+------------------+--
//
// The writer writes slot i (16 bytes, one write), then counter = i (8 bytes).
// FIFO per Conn means: whoever sees counter = c sees slots 1..c.
const (
	fifoCounter = 0
	fifoSlots   = 64
	fifoSlot    = 16
)

func fifoSlotOff(i uint64) uint64 { return fifoSlots + (i-1)*fifoSlot }

// fifoSlotBytes encodes slot i; fifoSlotOK decodes and checks it.
func fifoSlotBytes(i uint64) []byte {
	b := make([]byte, fifoSlot)
	put64(b, i^0x5a5a_0000_0000_0000)
	put64(b[8:], i*0x9e37_79b9_7f4a_7c15)
	return b
}

func fifoSlotOK(b []byte, i uint64) bool {
	return le64(b) == i^0x5a5a_0000_0000_0000 && le64(b[8:]) == i*0x9e37_79b9_7f4a_7c15
}

func fifoSlotWordsOK(mem []byte, i uint64) bool {
	off := int(fifoSlotOff(i))
	return rdma.Load64(mem, off) == i^0x5a5a_0000_0000_0000 && rdma.Load64(mem, off+8) == i*0x9e37_79b9_7f4a_7c15
}

func fifoRegionSize(n int) int { return fifoSlots + n*fifoSlot }

// fifoWriter writes slots 1..n and the counter after each, unsignaled but
// for every 16th op, and finally waits for the last op.
func fifoWriter(c rdma.Conn, region rdma.RegionID, n int) (*pipe, error) {
	p := newPipe(c, 16)
	for i := uint64(1); i <= uint64(n); i++ {
		if _, err := p.write(region, fifoSlotOff(i), fifoSlotBytes(i), 0); err != nil {
			return p, fmt.Errorf("slot %d: %w", i, err)
		}
		if _, err := p.write64(region, fifoCounter, i, 0); err != nil {
			return p, fmt.Errorf("counter %d: %w", i, err)
		}
	}
	if err := p.sync(region, fifoCounter, uint64(n)); err != nil {
		return p, fmt.Errorf("final sync: %w", err)
	}
	return p, p.order
}

// fifoLocalReader polls the counter in the owner's memory until it reaches
// n (or stop closes) and checks each slot as soon as the counter covers it.
func fifoLocalReader(mem []byte, n uint64, stop <-chan struct{}) error {
	var checked uint64
	for i := 0; checked < n; i++ {
		c := rdma.Load64(mem, fifoCounter)
		if c > n {
			return fmt.Errorf("counter = %d, more than the %d written", c, n)
		}
		for j := checked + 1; j <= c; j++ {
			if !fifoSlotWordsOK(mem, j) {
				return fmt.Errorf("counter = %d visible but slot %d is not (words %#x %#x): writes on one Conn became visible out of order",
					c, j, rdma.Load64(mem, int(fifoSlotOff(j))), rdma.Load64(mem, int(fifoSlotOff(j))+8))
			}
		}
		checked = c
		if i%64 == 63 {
			select {
			case <-stop:
				return nil
			default:
			}
		}
		runtime.Gosched()
	}
	return nil
}

// fifoRemoteReader does the same with one-sided reads on its own Conn:
// read the counter, then read the slots it covers.
func fifoRemoteReader(c rdma.Conn, region rdma.RegionID, n uint64, stop <-chan struct{}) error {
	var checked uint64
	buf := make([]byte, fifoSlot*int(n))
	for checked < n {
		select {
		case <-stop:
			return nil
		default:
		}
		cnt, err := read64(c, region, fifoCounter)
		if err != nil {
			return fmt.Errorf("remote read of counter: %w", err)
		}
		if cnt > n {
			return fmt.Errorf("remote read: counter = %d, more than the %d written", cnt, n)
		}
		if cnt <= checked {
			runtime.Gosched()
			continue
		}
		b := buf[:fifoSlot*int(cnt-checked)]
		if err := read(c, region, fifoSlotOff(checked+1), b); err != nil {
			return fmt.Errorf("remote read of slots %d..%d: %w", checked+1, cnt, err)
		}
		for j := checked + 1; j <= cnt; j++ {
			if s := b[(j-checked-1)*fifoSlot:][:fifoSlot]; !fifoSlotOK(s, j) {
				return fmt.Errorf("remote reader: counter = %d read, then slot %d read as %x: writes on one Conn became visible out of order", cnt, j, s)
			}
		}
		checked = cnt
	}
	return nil
}

func testFIFOVisibility(t *testing.T, h Harness) {
	const n = 3000
	cl := newCluster(t, h, 3)
	owner, wn, rn := cl.open(1), cl.open(2), cl.open(3)
	r := register(t, owner, 1, fifoRegionSize(n))
	grant(t, r, 2, rdma.PermWrite)
	grant(t, r, 3, rdma.PermRead)
	wc, rc := connect(t, wn, 1), connect(t, rn, 1)

	stop := make(chan struct{})
	errs := make(chan error, 2)
	go func() { errs <- fifoLocalReader(r.Bytes(), n, stop) }()
	go func() { errs <- fifoRemoteReader(rc, 1, n, stop) }()

	p, err := fifoWriter(wc, 1, n)
	if err != nil {
		close(stop)
		<-errs
		<-errs
		t.Fatalf("writer: %v", err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if p.signaled == 0 {
		t.Errorf("writer polled no signaled completion of %d posted ops", p.posted)
	}
	mem := r.Bytes()
	for i := uint64(1); i <= n; i++ {
		if !fifoSlotWordsOK(mem, i) {
			t.Fatalf("after the writer's last completion slot %d is not written", i)
		}
	}
}

// testSelectiveSignalling: after N unsignaled writes and one signaled one,
// polling the signaled completion means every earlier write is visible.
func testSelectiveSignalling(t *testing.T, h Harness) {
	const rounds, perRound = 30, 64
	cl := newCluster(t, h, 2)
	owner, wn := cl.open(1), cl.open(2)
	r := register(t, owner, 1, 8*(perRound+1))
	grant(t, r, 2, rdma.PermWrite)
	c := connect(t, wn, 1)
	p := newPipe(c, 0)
	mem := r.Bytes()
	val := func(round, j int) uint64 { return uint64(round)<<32 | uint64(j) | 1<<63 }
	for round := range rounds {
		for j := range perRound {
			if _, err := p.write64(1, uint64(8*j), val(round, j), 0); err != nil {
				t.Fatalf("round %d write %d: %v", round, j, err)
			}
		}
		id, err := p.write64(1, 8*perRound, uint64(round), rdma.Signaled)
		if err != nil {
			t.Fatalf("round %d signaled write: %v", round, err)
		}
		if err := p.waitDone(id, opTimeout); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for j := range perRound {
			if got := rdma.Load64(mem, 8*j); got != val(round, j) {
				t.Fatalf("round %d: signaled completion polled but unsignaled write %d not visible: word = %#x, want %#x", round, j, got, val(round, j))
			}
		}
		if n := c.Outstanding(); n != 0 {
			t.Fatalf("round %d: Outstanding() = %d after the last op's completion, want 0", round, n)
		}
	}
	if p.order != nil {
		t.Error(p.order)
	}
	if p.signaled != rounds {
		t.Errorf("polled %d signaled completions, want %d: unsignaled ops must complete silently", p.signaled, rounds)
	}
}
