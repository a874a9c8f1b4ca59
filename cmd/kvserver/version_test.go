package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A kvserver or kvcli built in a git checkout names the commit it was
// built from in its --version line.
func TestVersionNamesCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands")
	}
	git := exec.Command("git", "rev-parse", "HEAD")
	git.Dir = "../.."
	head, err := git.Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for _, name := range []string{"kvserver", "kvcli"} {
		bin := build(t, "./cmd/"+name) // with -buildvcs=true
		out, err := exec.Command(bin, "--version").Output()
		if strings.Contains(string(out), "no commit recorded") {
			// Seen in a git worktree (git worktree add): the go
			// command (1.26) stamps nothing there.
			t.Skipf("the go command recorded no commit: %s", out)
		}
		// The module version is (devel) or, since Go 1.24, a
		// pseudo-version made from the commit.
		want := ", commit " + strings.TrimSpace(string(head))
		if err != nil || !strings.HasPrefix(string(out), name+" github.com/rdmakv/rdmakv ") || !strings.Contains(string(out), want) {
			t.Errorf("%s --version: %v, %q; want %q in it", name, err, out, want)
		}
	}
}
