package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrent: writers and a reader at once (run with -race) lose no
// byte and never see a torn write.
func TestConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				b.Write([]byte("abcd\n"))
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100; i++ {
			for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
				if l != "" && l != "abcd" {
					t.Errorf("torn line %q", l)
					return
				}
			}
		}
	}()
	wg.Wait()
	<-done
	if got := strings.Count(b.String(), "abcd\n"); got != 4000 {
		t.Fatalf("%d lines, want 4000", got)
	}
}
