package btree

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rdmakv/rdmakv/internal/planted"
	"github.com/rdmakv/rdmakv/internal/prefault"
)

// TestArenaPrefault: with PrefaultNodes, the pages of the new slots past
// each one a split takes, up to PrefaultNodes bytes on (clipped to the
// slot's chunk), are mapped by the arena's faulter before the writer
// takes them, as the slots move across chunks; and the faulter's touches
// never change a node the writer wrote. The store's regions are mapped
// memory (the in-process fabric); mappedness is read from
// /proc/self/pagemap. Each check runs once the requests made so far are
// done: the property is what the faulter was asked to do, not how fast.
// Planted prefaultOnce (only the slots past the first new one are asked
// for) is caught by "not mapped"; without PrefaultNodes (off: the
// writer's own populate windows, 64 KiB, shorter than the lookahead) by
// "not mapped" too; prefaultTouchZero (a plain store of zero as the touch)
// by "changed", once the faulter is asked to touch the slots in use.
func TestArenaPrefault(t *testing.T) {
	planted.Run(t, arenaPrefault, []planted.Case{
		{Name: "none", Want: ""},
		{Name: "off", Want: "not mapped"},
		{Name: "prefaultOnce", Want: "not mapped"},
		{Name: "prefaultTouchZero", Want: "changed"},
	})
}

func arenaPrefault(t *testing.T, knob string) string {
	const (
		chunkSlots = 32 // 128 KiB chunks of 4 KiB nodes
		lookahead  = 96 << 10
		keys       = 5000 // ~170 leaves: 5 chunks
	)
	cfg := StoreConfig{Tablets: []Tablet{All}, ChunkSlots: chunkSlots}
	if knob != "off" {
		cfg.PrefaultNodes = lookahead
	}
	s, err := NewStore(cfg, memNode(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	a := s.a
	a.knobs.prefaultOnce = knob == "prefaultOnce"
	a.knobs.prefaultTouchZero = knob == "prefaultTouchZero"
	// The root's slot started the faulter in NewStore, before the knobs:
	// the next new slot starts it again with them.
	a.closeFaulter()
	ahead := uint32(lookahead / a.size)

	checkAhead := func(after int) string {
		if a.faulter != nil {
			a.faulter.Wait()
		}
		last := a.n - 1 // the newest slot handed out
		ce := (last/uint32(a.per) + 1) * uint32(a.per)
		for sl := last + 1; sl < min(last+1+ahead, ce); sl++ {
			c, o := int(sl)/a.per, int(sl)%a.per*a.size
			ok, err := prefault.Mapped(a.chunks[c][o:])
			if err != nil {
				t.Skipf("pagemap: %v", err)
			}
			if !ok {
				return fmt.Sprintf("after %d puts: slot %d (newest slot %d, lookahead %d slots, chunk end %d) is not mapped",
					after, sl, last, ahead, ce)
			}
		}
		return ""
	}
	r := rand.New(rand.NewPCG(5, 5))
	val := make([]byte, 100)
	slots := a.n
	for k := 1; k <= keys; k++ {
		key := fmt.Appendf(nil, "k%012d", r.Uint64()%1e12)
		if res := s.Apply(uint64(k+1), AppendRequest(nil, []Op{{Kind: OpPut, Key: key, Value: val}})); res[0] != StatusOK {
			t.Fatalf("put %d: %v", k, res[0])
		}
		if a.n != slots {
			slots = a.n
			if err := checkAhead(k); err != "" {
				return err
			}
		}
	}
	if len(a.chunks) < 4 {
		t.Fatalf("%d arena chunks, want the slots to span 4", len(a.chunks))
	}
	if knob == "off" {
		return "the check found every slot mapped without the faulter"
	}
	// The faulter may touch slots the writer wrote (it fell behind): have
	// it touch every chunk, all the nodes in use, to see that a touch
	// changes nothing whenever it lands.
	before := make([][]byte, len(a.chunks))
	for c := range a.chunks {
		before[c] = bytes.Clone(a.chunks[c])
		if !a.faulter.Ask(a.chunks[c]) {
			t.Fatal("the faulter's queue is full")
		}
	}
	a.faulter.Wait()
	for c := range a.chunks {
		for o := 0; o < len(before[c]); o += a.size {
			if !bytes.Equal(a.chunks[c][o:o+a.size], before[c][o:o+a.size]) {
				return fmt.Sprintf("slot %d changed by the faulter's touch", c*a.per+o/a.size)
			}
		}
	}
	if err := s.Tree().Check(); err != nil {
		return fmt.Sprintf("tree check after the touches: %v", err)
	}
	if st := s.Stats(); st.PrefaultPages == 0 {
		return "no page pre-faulted"
	}
	return ""
}
