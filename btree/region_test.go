package btree

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// history records every write of a test's writer: for each key, the
// stamps of its puts and deletes in order (value "" is a delete).
type history struct {
	mu   sync.Mutex
	keys map[string][]change
}

type change struct {
	stamp uint64
	val   string
}

func (h *history) add(k string, stamp uint64, val string) {
	h.mu.Lock()
	h.keys[k] = append(h.keys[k], change{stamp, val})
	h.mu.Unlock()
}

// at is the key's value after entry applied ("" absent).
func (h *history) at(k string, applied uint64) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := ""
	for _, c := range h.keys[k] {
		if c.stamp > applied {
			break
		}
		v = c.val
	}
	return v
}

// TestRemoteReadsRacingWriter: a writer applies puts and deletes to a
// tree in registered memory on one node of the mem fabric and publishes
// the header after each; readers on another node look keys up and scan
// one-sided, concurrently, through their caches. Every lookup answers a
// value the key held at some moment between the header read before it
// and the end of the lookup (linearizable per key); every scan equals the
// state at its applied index. Torn node reads are possible here (the
// writer copies images while the fabric copies them out) and must only
// ever cause retries.
func TestRemoteReadsRacingWriter(t *testing.T) {
	f := mem.New(mem.Options{})
	wn, err := f.NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	defer wn.Close()
	const g = 3
	cfg := Config{NodeSize: 512, MaxKey: 16}
	rg, err := NewRegions(wn, g, cfg.NodeSize, 16, []rdma.NodeID{2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	tr, err := New(cfg, rg.Arena, 1)
	if err != nil {
		t.Fatal(err)
	}
	rg.Publish(tr, 1, 0, 0, nil)
	h := &history{keys: map[string][]change{}}
	// applied is the last entry published; writing the entry whose node
	// writes may be under way (a lookup may see them before the header).
	var applied, writing atomic.Uint64
	applied.Store(1)
	writing.Store(1)
	stop := make(chan struct{})
	var writer, readers sync.WaitGroup
	writer.Add(1)
	go func() { // the writer: one op per entry, header after each
		defer writer.Done()
		r := rand.New(rand.NewPCG(1, 2))
		for s := uint64(2); ; s++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("k%04d", r.IntN(2000))
			writing.Store(s)
			if r.IntN(10) < 8 {
				v := fmt.Sprintf("%s@%d", k, s)
				h.add(k, s, v) // before the nodes change: readers may see them at once
				if _, err := tr.Put([]byte(k), []byte(v), s, s); err != nil {
					panic(err)
				}
			} else if _, ok := tr.Get([]byte(k)); ok {
				h.add(k, s, "")
				tr.Delete([]byte(k), s)
			}
			rg.Publish(tr, s, 0, 0, nil)
			applied.Store(s)
		}
	}()
	var torn, gaveUp, answered atomic.Int64
	errs := make(chan error, 2)
	for reader := 0; reader < 2; reader++ {
		readers.Add(1)
		go func(reader int) {
			defer readers.Done()
			rn, err := f.NewNode(rdma.NodeID(2 + reader))
			if err != nil {
				errs <- err
				return
			}
			defer rn.Close()
			conn, err := rn.Connect(1)
			if err != nil {
				errs <- err
				return
			}
			rem := NewRemote(conn, g)
			c := NewCache(8 << 10)
			read := func(slot uint32) ([]byte, error) {
				b, err := rem.Read(slot)
				if err == nil {
					if _, derr := Decode(b, 0); errors.Is(derr, ErrTorn) {
						torn.Add(1)
					}
				}
				return b, err
			}
			r := rand.New(rand.NewPCG(uint64(reader), 9))
			for i := 0; i < 20000; i++ {
				hd, err := rem.Header()
				if errors.Is(err, ErrTorn) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				if i%10 == 0 {
					start := []byte(fmt.Sprintf("k%04d", r.IntN(2000)))
					got, _, err := c.Scan(read, hd.Root, hd.Applied, start, nil, 20, nil)
					if errors.Is(err, ErrChanged) || errors.Is(err, ErrTorn) || errors.Is(err, ErrNotNode) {
						continue
					}
					if err != nil {
						errs <- fmt.Errorf("scan from %q: %v", start, err)
						return
					}
					for _, kv := range got {
						if want := h.at(string(kv.Key), hd.Applied); string(kv.Value) != want {
							errs <- fmt.Errorf("scan at %d: %q=%q, the history says %q", hd.Applied, kv.Key, kv.Value, want)
							return
						}
					}
					continue
				}
				k := fmt.Sprintf("k%04d", r.IntN(2000))
				ent, found, _, err := c.Lookup(read, hd.Root, []byte(k))
				v := ent.Value
				end := writing.Load()
				if errors.Is(err, ErrRetry) {
					// 32 torn reads in a row: the writer was
					// descheduled in the middle of its copy into
					// the slot (a loaded machine). A retry, never
					// an answer; the caller reads again later.
					gaveUp.Add(1)
					continue
				}
				answered.Add(1)
				if err != nil {
					errs <- fmt.Errorf("lookup %q: %v", k, err)
					return
				}
				// Some moment in [hd.Applied, end] had this answer.
				ok := false
				for s := hd.Applied; s <= end && !ok; s++ {
					ok = h.at(k, s) == string(v) && found == (len(v) > 0)
				}
				if !ok {
					errs <- fmt.Errorf("lookup %q = %q, %v: no state in [%d, %d] had it", k, v, found, hd.Applied, end)
					return
				}
			}
		}(reader)
	}
	readers.Wait()
	close(stop)
	writer.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := tr.Check(); err != nil {
		t.Fatal(err)
	}
	if answered.Load() == 0 {
		t.Fatalf("no lookup answered (%d gave up after retries)", gaveUp.Load())
	}
	t.Logf("writer reached entry %d; %d torn node reads retried; %d lookups answered, %d gave up after 32 torn reads in a row", applied.Load(), torn.Load(), answered.Load(), gaveUp.Load())
}
