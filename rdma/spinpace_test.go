package rdma

import (
	"testing"
	"time"
)

// TestSpinPace: a paced spin yields its processor (so that it cannot
// starve the goroutine it waits for), but at most once per SpinYield of
// the clock, the first time after SpinYield (issue 17: spin loops that
// yielded every 16 tries made a spin a stream of thread hand-offs); it
// ends once the clock passed End.
func TestSpinPace(t *testing.T) {
	for _, every := range []int{0, 1, 8} {
		start := Mono()
		sp := SpinPace{End: start + 2*time.Millisecond, Every: every}
		tries := 0
		for !sp.Over() {
			tries++
		}
		elapsed := Mono() - start
		if elapsed < 2*time.Millisecond {
			t.Fatalf("every %d: the spin ended after %v, before its End", every, elapsed)
		}
		if bound := int(elapsed / SpinYield); sp.Yields > bound {
			t.Fatalf("every %d: %d yields in a spin of %v (%d tries): more than one per %v", every, sp.Yields, elapsed, tries, SpinYield)
		}
		t.Logf("every %d: %d tries, %d yields in %v", every, tries, sp.Yields, elapsed)
	}
	// A long spin yields: three yields take at least two SpinYields (and
	// come at all: the loop would not end otherwise).
	start := Mono()
	sp := SpinPace{End: start + time.Hour}
	for sp.Yields < 3 {
		if sp.Over() {
			t.Fatal("a spin of an hour ended")
		}
	}
	if elapsed := Mono() - start; elapsed < 3*SpinYield {
		t.Fatalf("3 yields in %v: less than SpinYield (%v) apart", elapsed, SpinYield)
	}
}

// TestSpinUntilYields: a spinner on a single processor still lets the
// goroutine that makes its condition true run (it yields), and returns
// true.
func TestSpinUntilYields(t *testing.T) {
	defer setProcs(1)()
	var flag atomicBool
	go flag.set()
	if !SpinUntil(flag.get, time.Hour) {
		t.Fatal("SpinUntil returned false before its budget")
	}
}
