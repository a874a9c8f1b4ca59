package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKVServerHasFlagCached: kvserverHasFlag finds a flag in a binary's
// --help listing and not a flag that is only a prefix of one; it runs a
// binary's --help once however often it is asked, and again once the
// binary was rebuilt in place (another size).
func TestKVServerHasFlagCached(t *testing.T) {
	dir := t.TempDir()
	bin, count := filepath.Join(dir, "kvserver"), filepath.Join(dir, "count")
	write := func(flags string) {
		t.Helper()
		script := "#!/bin/sh\necho x >> " + count + "\nprintf '" + flags + "' >&2\n"
		if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	runs := func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "x")
	}
	write(`Usage of kvserver:\n  -save-poll-detail\n    \tlog it\n  -groups int\n`)
	for range 3 {
		if !kvserverHasFlag(bin, "save-poll-detail") || !kvserverHasFlag(bin, "groups") || kvserverHasFlag(bin, "save-poll") {
			t.Fatal("kvserverHasFlag: want save-poll-detail and groups, not save-poll")
		}
	}
	if n := runs(); n != 1 {
		t.Errorf("--help ran %d times for 9 questions about one binary, want 1", n)
	}
	write(`Usage of kvserver:\n  -groups int\n`)
	if kvserverHasFlag(bin, "save-poll-detail") || !kvserverHasFlag(bin, "groups") {
		t.Error("after a rebuild without -save-poll-detail: want only groups")
	}
	if n := runs(); n != 2 {
		t.Errorf("--help ran %d times in all after a rebuild, want 2", n)
	}
}
