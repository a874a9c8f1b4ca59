package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// ls lists dir's entries (names only).
func ls(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestXSweepStale: processes holding shm files are killed with SIGKILL
// (one reaped, one left a zombie); the next SweepStale of the directory
// removes their node and region files and the directory one of them made
// with MkdirOwned, and nothing else: the files and owned directory of live
// processes, an owned directory of a dead process in which a live process
// has a node, an unmarked directory, a corrupt rdmakv file and an
// unrelated file all survive.
func TestXSweepStale(t *testing.T) {
	o := newTestOptions(t)
	other := o
	other.Cluster = "other"

	deadTop := startChild(t, o, "hold", "id=5", "peer=1")
	deadTop.expect("ready")
	deadOwned := startChild(t, other, "owned", "id=2", "peer=1")
	deadDir := strings.TrimPrefix(deadOwned.expect("ready "), "ready ")
	liveTop := startChild(t, o, "hold", "id=6", "peer=1")
	liveTop.expect("ready")
	liveOwned := startChild(t, other, "owned", "id=3", "peer=1")
	liveDir := strings.TrimPrefix(liveOwned.expect("ready "), "ready ")

	// An unmarked directory with a dead process's files: not ours to judge.
	plain := o
	plain.Dir = filepath.Join(o.Dir, "plain")
	if err := os.Mkdir(plain.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	deadPlain := startChild(t, plain, "hold", "id=7", "peer=1")
	deadPlain.expect("ready")

	// Unrelated and foreign files.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(o.Dir, "notes.txt"), []byte("keep me"), 0o600))
	must(os.WriteFile(filepath.Join(o.Dir, "rdmakv.test.9.node"), []byte("not a node file"), 0o600))

	h, _, err := readNodeFile(filepath.Join(o.Dir, nodeFileName(o.Cluster, 5)))
	must(err)
	deadIdent := h.owner
	deadTop.kill()
	deadTop.reap()
	deadOwned.kill() // a zombie: dead all the same
	deadOwned.awaitZombie()
	deadPlain.kill()
	deadPlain.reap()

	// An owned directory whose owner is dead but where a live process (this
	// one) has a node: kept while the node is open.
	mixed := filepath.Join(o.Dir, "mixed")
	must(os.Mkdir(mixed, 0o700))
	b, err := createFile(mixed, ownerFileName, ownerFileSize, false, func(b []byte) { encodeOwnerFile(b, deadIdent) })
	must(err)
	unix.Munmap(b)
	mo := o
	mo.Dir, mo.Cluster = mixed, "mix"
	live, err := Open(1, mo)
	must(err)
	defer live.Close()

	// Temporary names of createFile's fallback: a dead pid's and ours.
	deadTmp := fmt.Sprintf(".%s.%d.%d.tmp", nodeFileName("test", 8), deadTop.cmd.Process.Pid, time.Now().UnixNano())
	liveTmp := fmt.Sprintf(".%s.%d.%d.tmp", nodeFileName("test", 8), os.Getpid(), time.Now().UnixNano())
	must(os.WriteFile(filepath.Join(o.Dir, deadTmp), nil, 0o600))
	must(os.WriteFile(filepath.Join(o.Dir, liveTmp), nil, 0o600))

	before := ls(t, o.Dir)
	removed, err := SweepStale(o.Dir)
	if err != nil {
		t.Fatalf("SweepStale: %v", err)
	}
	want := []string{
		filepath.Join(o.Dir, nodeFileName("test", 5)),
		filepath.Join(o.Dir, regionFileName("test", 5, 1)),
		filepath.Join(o.Dir, deadTmp),
		deadDir,
	}
	slices.Sort(want)
	slices.Sort(removed)
	if !slices.Equal(removed, want) {
		t.Fatalf("SweepStale removed %v, want %v (directory before: %v)", removed, want, before)
	}
	after := ls(t, o.Dir)
	for _, keep := range []string{nodeFileName("test", 6), regionFileName("test", 6, 1), filepath.Base(liveDir),
		"plain", "mixed", "notes.txt", "rdmakv.test.9.node", liveTmp} {
		if !slices.Contains(after, keep) {
			t.Errorf("SweepStale removed %s; left %v", keep, after)
		}
	}
	if got := ls(t, liveDir); len(got) != 3 { // owner file, node file, region file
		t.Errorf("live owned directory now holds %v, want its owner, node and region files", got)
	}
	if got := ls(t, plain.Dir); len(got) != 2 {
		t.Errorf("unmarked directory now holds %v, want the dead node's two files untouched", got)
	}

	// Once the live node in the dead owner's directory is gone, the
	// directory goes too; a second sweep finds nothing else.
	must(live.Close())
	removed, err = SweepStale(o.Dir)
	if err != nil || !slices.Equal(removed, []string{mixed}) {
		t.Fatalf("second SweepStale = %v, %v; want [%s]", removed, err, mixed)
	}
	deadOwned.reap()
	// The live processes still work, and their files survive a third sweep.
	n1 := mustOpen(t, 1, o)
	if err := rdma.Write(mustConnect(t, n1, 6), 1, 0, make([]byte, 8)); err != nil {
		t.Fatalf("write to the live node after the sweeps: %v", err)
	}
	if removed, err := SweepStale(o.Dir); len(removed) != 0 || err != nil {
		t.Fatalf("third SweepStale = %v, %v; want nothing", removed, err)
	}
}

// TestSweepStaleMissingDir: a directory that does not exist is an error
// wrapping fs.ErrNotExist, so that callers can ignore it.
func TestSweepStaleMissingDir(t *testing.T) {
	_, err := SweepStale(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("SweepStale of a missing directory = %v, want ErrNotExist", err)
	}
}

// TestOwnerFile: MkdirOwned's marker names this process; corrupt markers
// are refused.
func TestOwnerFile(t *testing.T) {
	o := newTestOptions(t)
	d, err := MkdirOwned(o.Dir, "own-")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(d, ownerFileName))
	if err != nil {
		t.Fatal(err)
	}
	self, _ := selfIdent()
	if got, err := decodeOwnerFile(b); err != nil || got != self {
		t.Fatalf("owner file decodes as %v, %v; want %v", got, err, self)
	}
	for _, bad := range [][]byte{b[:8], append(bytes.Clone(b), 0), append([]byte{1}, b[1:]...)} {
		if _, err := decodeOwnerFile(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeOwnerFile(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
	// Our own directory is never swept.
	if removed, err := SweepStale(o.Dir); len(removed) != 0 || err != nil {
		t.Fatalf("SweepStale with only a live owner's directory = %v, %v", removed, err)
	}
}
