package server

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestDirLocks: a second lock of a replica's or an embedded cluster's data
// directory is refused naming the process that holds it; after unlock it
// is taken again.
func TestDirLocks(t *testing.T) {
	dir := t.TempDir()
	pid := fmt.Sprint(os.Getpid())
	for _, c := range []struct {
		name string
		lock func() (func(), error)
		want string
	}{
		{"replica", func() (func(), error) { return lockDir(dir, 7) }, "replica 7 already runs (process " + pid + " holds"},
		{"cluster", func() (func(), error) { return lockClusterDir(dir) }, "is in use by process " + pid},
	} {
		unlock, err := c.lock()
		if err != nil {
			t.Fatalf("%s: first lock: %v", c.name, err)
		}
		if _, err := c.lock(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: second lock: %v, want an error containing %q", c.name, err, c.want)
		}
		unlock()
		again, err := c.lock()
		if err != nil {
			t.Fatalf("%s: lock after unlock: %v", c.name, err)
		}
		again()
	}
}
