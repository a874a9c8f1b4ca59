package server

import (
	"testing"
	"time"
)

// TestWatchEvery: a Process's Watch looks a third of an election timeout
// apart, never less than 20 ms (Watch's own tick) nor more than 50 ms.
func TestWatchEvery(t *testing.T) {
	for _, c := range []struct{ et, want time.Duration }{
		{30 * time.Millisecond, 20 * time.Millisecond},
		{90 * time.Millisecond, 30 * time.Millisecond},
		{150 * time.Millisecond, 50 * time.Millisecond},
		{time.Second, 50 * time.Millisecond},
	} {
		if got := watchEvery(c.et); got != c.want {
			t.Errorf("watchEvery(%v) = %v, want %v", c.et, got, c.want)
		}
	}
}
