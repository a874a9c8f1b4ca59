package broadcast

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// TestSnapImageReuse: the file image of a disk snapshot that became
// durable is the one the next capture's Persist writes into (a fresh
// image of a large state faults every page in beside the pollers: issue
// 19), and a file written from a handed-on image loads and holds zeros
// wherever the new state and its seal write nothing (the paddings of the
// header, the meta and the state: decodeSnapFile refuses a file with
// bytes in them), whatever the image held before: the test fills each
// handed-on image with 0xab first (knobs.poisonSpareImg). A group of one
// takes a disk snapshot after every log write while a proposal every
// fourth Poll grows its log and state (images of several sizes are
// handed on). Planted snapImgKept (no image handed on) is caught by
// "reuse:", snapImgNoClear by "load:" (the file is refused as corrupt).
func TestSnapImageReuse(t *testing.T) {
	if err := snapImageRun(t, false, false); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		bug           string
		kept, noClear bool
		want          string
	}{{"snapImgKept", true, false, "reuse:"}, {"snapImgNoClear", false, true, "load:"}} {
		err := snapImageRun(t, c.kept, c.noClear)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Fatalf("planted %s: %v, want %s", c.bug, err, c.want)
		}
		t.Logf("planted %s caught: %v", c.bug, err)
	}
}

func snapImageRun(t *testing.T, kept, noClear bool) error {
	const saves = 6
	r, m := diskReplica(t, &logFSM{})
	defer r.Close()
	r.knobs.snapImgKept, r.knobs.snapImgNoClear, r.knobs.poisonSpareImg = kept, noClear, true
	// Every file every time: a later save at the same index (a commit
	// record and no new entry between) rewrites a file of the same name,
	// possibly from a handed-on image, so a name seen before says nothing.
	check := func() error {
		for _, n := range snapNames(t, m) {
			if !strings.HasSuffix(n, ".snap") {
				continue
			}
			if err := snapPads(m, "snap/"+n); err != nil {
				return err
			}
		}
		return nil
	}
	now := r.now
	// A planted noClear run goes on until a capture wrote into a handed-on
	// image and a save after it became durable (under -race the first
	// saves may all find no image to reuse: nothing to catch then).
	reusedAt := int64(-1)
	for i := 0; r.cfg.Snapshots.Saves() < saves || noClear && (reusedAt < 0 || int64(r.cfg.Snapshots.Saves()) <= reusedAt); i++ {
		if i == 200000 {
			t.Fatalf("%d of %d disk snapshots durable after %d polls", r.cfg.Snapshots.Saves(), saves, i)
		}
		now += 100 * time.Microsecond
		r.Poll(now)
		if e, _ := r.Leading(); e != 0 && i%4 == 0 {
			r.Propose(fmt.Appendf(nil, "entry %d", i))
		}
		if reusedAt < 0 && r.dur.imgReuses > 0 {
			reusedAt = int64(r.cfg.Snapshots.Saves())
		}
		if err := check(); err != nil {
			return err
		}
	}
	// The last save may have become durable after the loop's last look.
	if err := check(); err != nil {
		return err
	}
	if r.dur.imgReuses < saves-1 {
		return fmt.Errorf("reuse: %d of the %d captures after the first wrote into the last durable save's image", r.dur.imgReuses, saves-1)
	}
	return nil
}

// snapPads checks that a snapshot file loads ("load:") and that its
// paddings (after the header's version, after its checksum, after the
// meta and after the state) are zeros ("pad:").
func snapPads(m *vfs.Mem, path string) error {
	b, err := vfs.ReadFile(m, path)
	if err != nil {
		return err
	}
	if _, err := decodeSnapFile(b); err != nil {
		return fmt.Errorf("load: %s: %v", path, err)
	}
	le := binary.LittleEndian
	ml, sl := int(le.Uint64(b[32:])), int(le.Uint64(b[40:]))
	st := snapHdrSize + pad8(ml)
	for _, p := range [][2]int{{6, 8}, {68, snapHdrSize}, {snapHdrSize + ml, st}, {st + sl, st + pad8(sl)}} {
		for i := p[0]; i < p[1]; i++ {
			if b[i] != 0 {
				return fmt.Errorf("pad: %s holds %#x at byte %d (padding [%d, %d))", path, b[i], i, p[0], p[1])
			}
		}
	}
	return nil
}
