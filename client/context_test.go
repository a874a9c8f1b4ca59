package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestDoneContext: every call given a context that is already cancelled
// or past its deadline fails at once with the context's error (not
// ErrOutcomeUnknown) and sends nothing: no write is applied (gets after
// show the keys as they were) and the client sent no write message.
func TestDoneContext(t *testing.T) {
	lc := startLocal(t, testMap("donectx", "mem", 2, 1))
	c := open(t, lc, 0)
	bg := context.Background()
	k := []byte("k")
	w0, err := c.Put(bg, k, []byte("v0"))
	if err != nil {
		t.Fatal(err)
	}
	others := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")} // absent keys
	// A key of each group.
	var fences [][]byte
	for g := range c.Map().Groups {
		for i := 0; ; i++ {
			if f := fmt.Appendf(nil, "fence%d", i); c.Map().GroupOf(f) == uint32(g) {
				fences = append(fences, f)
				break
			}
		}
	}
	large := bytes.Repeat([]byte("x"), 3*c.Map().Limits.SlotSize) // sent in parts

	cancelled, cancel := context.WithCancel(bg)
	cancel()
	expired, cancel2 := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error
	}{{"cancelled", cancelled, context.Canceled}, {"expired", expired, context.DeadlineExceeded}} {
		before := c.Stats()
		calls := []struct {
			name string
			f    func(ctx context.Context) error
		}{
			{"Put", func(ctx context.Context) error { _, err := c.Put(ctx, k, []byte("x")); return err }},
			{"Put (large)", func(ctx context.Context) error { _, err := c.Put(ctx, k, large); return err }},
			{"Put (absent key)", func(ctx context.Context) error { _, err := c.Put(ctx, others[0], []byte("x")); return err }},
			{"Delete", func(ctx context.Context) error { _, err := c.Delete(ctx, k); return err }},
			{"CompareAndSwap", func(ctx context.Context) error {
				_, err := c.CompareAndSwap(ctx, k, []byte("v0"), []byte("x"))
				return err
			}},
			{"CompareAndSwap (absent)", func(ctx context.Context) error {
				_, err := c.CompareAndSwap(ctx, others[1], nil, []byte("x"))
				return err
			}},
			{"CompareVersionAndSwap", func(ctx context.Context) error {
				_, err := c.CompareVersionAndSwap(ctx, k, w0.Version, []byte("x"))
				return err
			}},
			{"CompareAndDelete", func(ctx context.Context) error { _, err := c.CompareAndDelete(ctx, k, w0.Version); return err }},
			{"Commit", func(ctx context.Context) error {
				b := new(client.Batch)
				b.Put(k, []byte("x"))
				for _, o := range others {
					b.Put(o, []byte("x"))
				}
				_, err := c.Commit(ctx, b)
				return err
			}},
			{"Commit (large)", func(ctx context.Context) error {
				b := new(client.Batch)
				b.Put(k, large).Put(others[2], large)
				_, err := c.Commit(ctx, b)
				return err
			}},
			{"Get", func(ctx context.Context) error { _, err := c.Get(ctx, k); return err }},
			{"GetItem linearizable", func(ctx context.Context) error {
				_, err := c.GetItem(ctx, k, client.Linearizable)
				return err
			}},
			{"GetItem stale-ok", func(ctx context.Context) error { _, err := c.GetItem(ctx, k, client.StaleOK); return err }},
			{"Status", func(ctx context.Context) error { _, err := c.Status(ctx); return err }},
		}
		for _, call := range calls {
			err := call.f(tc.ctx)
			if !errors.Is(err, tc.want) || errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("%s with a %s context: %v, want %v (and not ErrOutcomeUnknown)", call.name, tc.name, err, tc.want)
			}
		}
		if after := c.Stats(); after != before {
			t.Errorf("calls with a %s context sent write messages: stats %+v, then %+v", tc.name, before, after)
		}
		// Nothing was applied. (Without the checks, the runner sent those
		// writes anyway and keeps them going: a write of this client in
		// each group, awaited, comes after them.)
		for _, f := range fences {
			if _, err := c.Put(bg, f, []byte("fence")); err != nil {
				t.Fatal(err)
			}
		}
		it, err := c.GetItem(bg, k, client.Linearizable)
		if err != nil || string(it.Value) != "v0" || it.Version != w0.Version {
			t.Errorf("after the calls with a %s context, %q is %q version %d (%v), want \"v0\" version %d", tc.name, k, it.Value, it.Version, err, w0.Version)
		}
		for _, o := range others {
			if v, err := c.Get(bg, o); !errors.Is(err, client.ErrNotFound) {
				t.Errorf("after the calls with a %s context, %q is %q (%v), want not found", tc.name, o, v, err)
			}
		}
	}
	// The client still works.
	if _, err := c.Put(bg, k, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(bg, k); err != nil || string(v) != "v1" {
		t.Fatalf("get after: %q %v", v, err)
	}
}
