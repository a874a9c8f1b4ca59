package rdma

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestBackoffBounds: each retry comes after a delay in [b/2, b), where the
// step b starts at Min, doubles, and stays at Max.
func TestBackoffBounds(t *testing.T) {
	for _, c := range []struct{ min, max time.Duration }{
		{time.Millisecond, 100 * time.Millisecond},
		{3 * time.Microsecond, 50 * time.Microsecond}, // Max not a power-of-two multiple of Min
		{time.Millisecond, time.Millisecond},
		{5 * time.Millisecond, time.Millisecond}, // Max below Min: Min wins
	} {
		b := Backoff{Min: c.min, Max: c.max}
		rng := rand.New(rand.NewPCG(1, 2))
		top := max(c.max, c.min)
		want := c.min
		now := 7 * time.Second
		for i := range 40 {
			at := b.Next(now, rng)
			if b.Step() != want {
				t.Fatalf("%v..%v: retry %d: step %v, want %v", c.min, c.max, i, b.Step(), want)
			}
			d := at - now
			if d < (want+1)/2 || d >= want {
				t.Fatalf("%v..%v: retry %d: delay %v outside [%v, %v)", c.min, c.max, i, d, want/2, want)
			}
			want = min(2*want, top)
			now = at
		}
		if b.Step() != top {
			t.Fatalf("%v..%v: step %v after 40 failures, want Max %v", c.min, c.max, b.Step(), top)
		}
	}
}

// TestBackoffReset: after Reset the next step is Min again.
func TestBackoffReset(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: time.Second}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 5 {
		b.Next(0, rng)
	}
	if b.Step() != 16*time.Millisecond {
		t.Fatalf("step after 5 failures: %v, want 16ms", b.Step())
	}
	b.Reset()
	if b.Step() != 0 {
		t.Fatalf("step after Reset: %v, want 0", b.Step())
	}
	if d := b.Next(0, rng); b.Step() != time.Millisecond || d >= time.Millisecond || d < time.Millisecond/2 {
		t.Fatalf("after Reset: step %v delay %v, want step 1ms and delay in [0.5ms, 1ms)", b.Step(), d)
	}
}

// TestBackoffDeterministic: the same seed gives the same retry times, the
// jitter comes only from the rng given (two seeds differ), and a nil rng
// means no jitter.
func TestBackoffDeterministic(t *testing.T) {
	run := func(rng *rand.Rand) []time.Duration {
		b := Backoff{Min: time.Millisecond, Max: 64 * time.Millisecond}
		var out []time.Duration
		now := time.Duration(0)
		for i := range 20 {
			now = b.Next(now, rng)
			out = append(out, now)
			if i == 9 {
				b.Reset()
			}
		}
		return out
	}
	a, b := run(rand.New(rand.NewPCG(9, 9))), run(rand.New(rand.NewPCG(9, 9)))
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 9, retry %d: %v then %v", i, a[i], b[i])
		}
	}
	c := run(rand.New(rand.NewPCG(10, 10)))
	same := true
	for i := range a {
		same = same && a[i] == c[i]
	}
	if same {
		t.Fatalf("seeds 9 and 10 gave the same 20 retry times: no jitter drawn")
	}
	var bo Backoff
	now := time.Duration(0)
	for i, want := range []time.Duration{DefaultBackoffMin, 2 * DefaultBackoffMin, 4 * DefaultBackoffMin} {
		at := bo.Next(now, nil)
		if at-now != want {
			t.Fatalf("zero Backoff, nil rng, retry %d: delay %v, want %v", i, at-now, want)
		}
		now = at
	}
}
