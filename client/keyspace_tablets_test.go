package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
)

// tabletMap is orderedMap with "users" cut at splits into tablets placed
// round-robin over the groups.
func tabletMap(name string, groups int, splits ...string) *cluster.Map {
	m := orderedMap(name, groups)
	m.Keyspaces[0].Splits = splits
	return m
}

// TestKeyspaceModelTablets: TestKeyspaceModel's random operations agree
// with tidwall/btree op by op when "users" is cut into 4 tablets over 3
// groups (scans cross tablets and groups both ways, pages span tablet
// boundaries); the client's directory, read from the groups' headers,
// has the 4 tablets where the map placed them.
func TestKeyspaceModelTablets(t *testing.T) {
	m := tabletMap("kstablets", 3, "key0150", "key0300", "key0450")
	keyspaceModel(t, m)
	lc := startLocal(t, tabletMap("kstablets2", 3, "key0150", "key0300", "key0450"))
	c := open(t, lc, 0)
	d, err := client.KeyspaceDirectory(c.Keyspace("users"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range d.Tablets() {
		got = append(got, fmt.Sprintf("%d:%q", p.Group, p.Low))
	}
	want := `[0:"" 1:"\x01key0150" 2:"\x01key0300" 0:"\x01key0450"]`
	if fmt.Sprint(got) != want {
		t.Fatalf("directory %v, want %s", got, want)
	}
	// Writes land in the group of their tablet: each group's replicas
	// hold the keys of their tablets only.
	ctx := context.Background()
	ks := c.Keyspace("users")
	for _, k := range []string{"key0001", "key0200", "key0333", "key0599"} {
		if _, err := ks.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for g, want := range []int{2, 1, 1} {
		for i := range 3 {
			n := -1
			if err := lc.Do(g, i, func(r *kv.Replica) { n = r.Table().OrderedPart().(*btree.Store).Tree().Len() }); err != nil {
				t.Fatal(err)
			}
			if n != want && i == lc.Leader(g) {
				t.Errorf("group %d's leader holds %d keys, want %d", g, n, want)
			}
		}
	}
}

// TestKeyspaceLinearizableTablets: TestKeyspaceLinearizable's history
// with "users" split at "c" over 2 groups, checked by porcupine with each
// scan as its two parts.
func TestKeyspaceLinearizableTablets(t *testing.T) {
	keyspaceLinearizable(t, tabletMap("kslintab", 2, "c"), "c")
}

// TestKeyspaceScanGap: a directory missing a group's tablets (a gap)
// makes a scan over the gap fail with ErrDirGap after reading the
// directory again, never return the other tablets' keys alone; the
// planted skipDirGap (the scan goes on at the next tablet) is caught:
// the scan misses the keys of the gap.
func TestKeyspaceScanGap(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			lc := startLocal(t, tabletMap(fmt.Sprint("ksgap", plant), 2, "f", "p"))
			ctx := context.Background()
			keys := []string{"a", "c", "g", "k", "q", "z"} // groups 0, 0, 1, 1, 0, 0
			w := open(t, lc, 0)
			for _, k := range keys {
				if _, err := w.Keyspace("users").Put(ctx, []byte(k), []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			c := open(t, lc, 1)
			client.SetPlantDir(c, func(d *btree.Directory) *btree.Directory {
				groups := map[uint32][]btree.Tablet{}
				for _, p := range d.Tablets() {
					if p.Group != 1 {
						groups[p.Group] = append(groups[p.Group], p.Tablet)
					}
				}
				nd, err := btree.NewDirectory(groups, nil)
				if err != nil {
					t.Error(err)
					return d
				}
				if plant {
					btree.PlantSkipDirGap(nd)
				}
				return nd
			})
			ks := c.Keyspace("users")
			for _, rev := range []bool{false, true} {
				var opts []client.ScanOption
				if rev {
					opts = append(opts, client.Reverse())
				}
				var got []string
				var err error
				for kv, e := range ks.Scan(ctx, nil, nil, opts...) {
					if e != nil {
						err = e
						break
					}
					got = append(got, string(kv.Key))
				}
				switch {
				case !plant && !errors.Is(err, btree.ErrDirGap):
					t.Fatalf("reverse %v: a scan over a gap: %v %v, want ErrDirGap", rev, got, err)
				case plant && err == nil && len(got) == len(keys):
					t.Fatalf("reverse %v: the planted skipDirGap was not caught: %v", rev, got)
				case plant && (err != nil || len(got) != 4):
					t.Fatalf("reverse %v: planted skipDirGap: %v %v, want the 4 keys outside the gap", rev, got, err)
				}
			}
		})
	}
}

// TestKeyspaceMovedResend: a client whose first directory is stale (it
// routes every key to group 1) sends a write of a key group 0 owns to
// group 1, which refuses it (StatusMoved, nothing applied); the client
// reads the directory again and resends the write to group 0, which
// applies it once. A batch likewise.
func TestKeyspaceMovedResend(t *testing.T) {
	lc := startLocal(t, tabletMap("ksresend", 2, "m"))
	c := open(t, lc, 0)
	builds := 0
	client.SetPlantDir(c, func(d *btree.Directory) *btree.Directory {
		if builds++; builds > 1 {
			return d
		}
		stale, err := btree.NewDirectory(map[uint32][]btree.Tablet{1: {btree.All}}, nil)
		if err != nil {
			t.Error(err)
			return d
		}
		return stale
	})
	ctx := context.Background()
	ks := c.Keyspace("users")
	w, err := ks.Put(ctx, []byte("apple"), []byte("v1"))
	if err != nil || w.Version == 0 {
		t.Fatalf("put through a stale directory: %+v %v", w, err)
	}
	if builds != 2 {
		t.Fatalf("the directory was built %d times, want 2 (the stale one, then after StatusMoved)", builds)
	}
	v, err := ks.Get(ctx, []byte("apple"))
	if err != nil || string(v) != "v1" {
		t.Fatalf("get: %q %v", v, err)
	}
	var b client.Batch
	b.Put([]byte("banana"), []byte("v2")).Put([]byte("cherry"), []byte("v3"))
	if _, err := ks.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	var spans client.Batch
	spans.Put([]byte("date"), []byte("x")).Put([]byte("zebra"), []byte("y"))
	if _, err := ks.Commit(ctx, &spans); !errors.Is(err, client.ErrBatchSpansGroups) {
		t.Fatalf("a batch over two groups' tablets: %v", err)
	}
	got := scanAll(t, ks, nil, nil)
	if len(got) != 3 || string(got[0].Key) != "apple" || string(got[2].Key) != "cherry" {
		t.Fatalf("scan: %v", got)
	}
}

// TestKeyspaceGroupDownAtFirstCall: when a group is down at the client's
// first ordered call, the directory takes that group's tablets from the
// map, so calls on the other groups' keys work and only calls on the
// down group's keys fail (unavailable).
func TestKeyspaceGroupDownAtFirstCall(t *testing.T) {
	lc := startLocal(t, tabletMap("ksdown", 2, "m"))
	c := open(t, lc, 0, client.WithTimeout(3*time.Second))
	for i := range 3 {
		lc.Stop(1, i)
	}
	ctx := context.Background()
	ks := c.Keyspace("users")
	if _, err := ks.Put(ctx, []byte("apple"), []byte("v")); err != nil {
		t.Fatalf("put of a key of the group that is up: %v", err)
	}
	if v, err := ks.Get(ctx, []byte("apple")); err != nil || string(v) != "v" {
		t.Fatalf("get of a key of the group that is up: %q %v", v, err)
	}
	var ue *client.UnavailableError
	if _, err := ks.Get(ctx, []byte("zebra")); !errors.As(err, &ue) || ue.Group != 1 {
		t.Fatalf("get of a key of the group that is down: %v", err)
	}
}
