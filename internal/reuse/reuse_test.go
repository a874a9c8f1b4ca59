package reuse

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/rdmakv/rdmakv/internal/planted"
)

// TestPoolLends: a buffer put back is the next Get's that it holds (the
// smallest that does), two Gets never share one, and a closed pool keeps
// nothing. Planted doublePut (a buffer put twice kept twice) is caught as
// 'two Gets share'.
func TestPoolLends(t *testing.T) {
	planted.Run(t, func(t *testing.T, knob string) string {
		p := New(4)
		p.doublePut = knob == "doublePut"
		big, small := p.Get(3<<20), p.Get(2<<20)
		p.Put(big)
		p.Put(small)
		if g := p.Get(1 << 20); unsafe.SliceData(g) != unsafe.SliceData(small) || len(g) != 1<<20 {
			return "a Get of 1 MiB did not take the smallest free buffer that holds it"
		}
		if g := p.Get(3 << 20); unsafe.SliceData(g) != unsafe.SliceData(big) {
			return "a Get of 3 MiB did not take the 3 MiB buffer put back"
		} else {
			p.Put(g)
			p.Put(g) // twice: a caller's bug the pool absorbs
		}
		a, b := p.Get(3<<20), p.Get(3<<20)
		if unsafe.SliceData(a) == unsafe.SliceData(b) {
			return "two Gets share one buffer"
		}
		if r, f := p.Stats(); r != 3 || f != 3 {
			return fmt.Sprintf("stats: %d reused %d fresh, want 3 and 3", r, f)
		}
		p.Put(a)
		p.Close()
		if g := p.Get(1 << 20); unsafe.SliceData(g) == unsafe.SliceData(a) {
			return "a closed pool lent a buffer"
		}
		p.Put(b)
		if g := p.Get(1 << 20); unsafe.SliceData(g) == unsafe.SliceData(b) {
			return "a closed pool kept a buffer put back"
		}
		var nilPool *Pool
		nilPool.Put(nilPool.Get(10))
		return ""
	}, []planted.Case{{Name: "none"}, {Name: "doublePut", Want: "two Gets share"}})
}

// TestSliceView: Slice views a buffer as records in place.
func TestSliceView(t *testing.T) {
	type rec struct{ a, b uint64 }
	buf := make([]byte, 64)
	s := Slice[rec](buf, 4)
	s[3].b = 7
	if buf[56] != 7 || len(s) != 4 {
		t.Fatalf("the view does not write the buffer: %v", buf)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a view larger than its buffer did not panic")
		}
	}()
	Slice[rec](buf, 5)
}

// TestPutPoisons: in test binaries a buffer put back is overwritten at
// once, whether the pool keeps it or not (closed), so that a user that
// kept an alias past its Put reads garbage in the restart tests.
func TestPutPoisons(t *testing.T) {
	for _, closed := range []bool{false, true} {
		p := New(2)
		if closed {
			p.Close()
		}
		b := p.Get(64)
		for i := range b {
			b[i] = byte(i)
		}
		alias := b[8:16]
		p.Put(b)
		for i, c := range alias {
			if c != 0xa5 {
				t.Fatalf("closed %v: byte %d of an alias after Put is %#x, want the poison 0xa5", closed, i, c)
			}
		}
	}
}
