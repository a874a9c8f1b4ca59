package kvproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/kv/fielded"
)

// TestMergeRealProc: field merges (client.UpdateFields, a kv.OpMerge the
// replicas apply) on replica processes. A merge creates an absent record
// and sets fields of a present one, keeping the others; one into a value
// that is not a fielded value changes nothing and gives ErrNotFielded;
// UpdateExistingFields of a missing key gives ErrNotFound and creates
// nothing; a merge whose result exceeds the replicas' max_value is
// refused with a *LimitError. Then 2 clients x 4 goroutines merge distinct
// fields into one key at once (each goroutine also rewrites its own first
// field, so merges of a field race with merges of others): every field
// survives with its last value. That is the property the YCSB binding's
// get and compare-and-swap loop gave, which its one blind merge must keep.
func TestMergeRealProc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := newCluster(t, ctx, 2, 2, testTuning)
	var cls []*client.Client
	defer func() {
		for _, cl := range cls {
			cl.Close()
		}
		c.closeAll()
		c.checkNoFiles()
	}()
	for i := range 2 {
		cl, err := c.openClient(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		cls = append(cls, cl)
	}
	cl := cls[0]
	fields := func(k []byte) map[string][]byte {
		t.Helper()
		v, err := cls[1].Get(ctx, k)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		m, err := fielded.Decode(v)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		return m
	}

	w1, err := cl.UpdateFields(ctx, []byte("rec"), map[string][]byte{"a": []byte("1"), "b": []byte("2")})
	if err != nil || w1.Prev != 0 || w1.Version == 0 {
		t.Fatalf("merge into an absent key: %+v %v", w1, err)
	}
	w2, err := cl.UpdateFields(ctx, []byte("rec"), map[string][]byte{"b": []byte("B"), "c": []byte("3")})
	if err != nil || w2.Prev != w1.Version || w2.Version <= w1.Version {
		t.Fatalf("merge: %+v (first %+v) %v", w2, w1, err)
	}
	if got := fields([]byte("rec")); len(got) != 3 || string(got["a"]) != "1" || string(got["b"]) != "B" || string(got["c"]) != "3" {
		t.Fatalf("after two merges: %q", got)
	}

	wr, err := cl.Put(ctx, []byte("plain"), []byte("not a record"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := cl.UpdateFields(ctx, []byte("plain"), map[string][]byte{"a": nil})
	if !errors.Is(err, client.ErrNotFielded) || w.Prev != wr.Version {
		t.Fatalf("merge into a plain value: %+v %v, want ErrNotFielded with Prev %#x", w, err, wr.Version)
	}
	if v, err := cl.Get(ctx, []byte("plain")); err != nil || string(v) != "not a record" {
		t.Fatalf("the plain value after the refused merge: %q %v", v, err)
	}
	if _, err := cl.UpdateExistingFields(ctx, []byte("nobody"), map[string][]byte{"a": nil}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("UpdateExistingFields of a missing key: %v, want ErrNotFound", err)
	}
	if _, err := cl.Get(ctx, []byte("nobody")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("UpdateExistingFields created the key: %v", err)
	}
	// Each merge alone fits max_value (1024); merged, the record does not.
	half := bytes.Repeat([]byte("x"), 600)
	if _, err := cl.UpdateFields(ctx, []byte("big"), map[string][]byte{"x": half}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.UpdateFields(ctx, []byte("big"), map[string][]byte{"y": half})
	var le *client.LimitError
	if !errors.As(err, &le) || le.Limit != "max_value" || le.Max != 1024 || le.Size <= 1024 || !errors.Is(err, client.ErrValueTooLarge) {
		t.Fatalf("merge over max_value: %v, want a max_value *LimitError", err)
	}
	if got := fields([]byte("big")); len(got) != 1 {
		t.Fatalf("after the refused merge: fields %d, want 1", len(got))
	}

	// Concurrent merges of distinct fields into one key.
	const perClient, rounds = 4, 12
	key := []byte("hot")
	var wg sync.WaitGroup
	errc := make(chan error, 2*perClient)
	for ci, cl := range cls {
		for g := range perClient {
			wg.Go(func() {
				for r := range rounds {
					upd := map[string][]byte{
						fmt.Sprintf("w%d.%d-%d", ci, g, r): []byte{byte(r)},
						fmt.Sprintf("w%d.%d", ci, g):       fmt.Appendf(nil, "round %d", r),
					}
					if _, err := cl.UpdateFields(ctx, key, upd); err != nil {
						errc <- fmt.Errorf("client %d goroutine %d round %d: %w", ci, g, r, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	got := fields(key)
	if want := 2 * perClient * (rounds + 1); len(got) != want {
		t.Errorf("after the concurrent merges: %d fields, want %d", len(got), want)
	}
	for ci := range cls {
		for g := range perClient {
			if v := string(got[fmt.Sprintf("w%d.%d", ci, g)]); v != fmt.Sprintf("round %d", rounds-1) {
				t.Errorf("field w%d.%d = %q, want its last round's %q", ci, g, v, fmt.Sprintf("round %d", rounds-1))
			}
			for r := range rounds {
				if v, ok := got[fmt.Sprintf("w%d.%d-%d", ci, g, r)]; !ok || !bytes.Equal(v, []byte{byte(r)}) {
					t.Errorf("field w%d.%d-%d lost (%q, %v)", ci, g, r, v, ok)
				}
			}
		}
	}
}
