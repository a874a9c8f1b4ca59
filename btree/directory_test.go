package btree

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	tbtree "github.com/tidwall/btree"
)

// splitAt cuts the key order at points into tablets placed round-robin
// over groups (what cluster.Map.OrderedStore does).
func splitAt(groups int, points ...string) map[uint32][]Tablet {
	out := map[uint32][]Tablet{}
	low := []byte(nil)
	for i := 0; i <= len(points); i++ {
		tb := Tablet{Low: low, HighInf: i == len(points)}
		if i < len(points) {
			tb.High = []byte(points[i])
			low = tb.High
		}
		g := uint32(i % groups)
		out[g] = append(out[g], tb)
	}
	return out
}

func mustDir(t *testing.T, groups map[uint32][]Tablet) *Directory {
	t.Helper()
	d, err := NewDirectory(groups, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDirEncoding: a group's tablets round-trip through the directory
// area; any flipped byte in its used part is refused (torn), never
// decoded into other tablets; tablets past MaxTablets or out of order
// are refused by the Store's config.
func TestDirEncoding(t *testing.T) {
	for _, tablets := range [][]Tablet{
		{},
		{All},
		splitAt(1, "b", "k", "x")[0],
		splitAt(3, "b", "k", "x")[1],
	} {
		b := make([]byte, DirBytes)
		encodeDir(b, 7, tablets)
		v, got, err := DecodeDir(b)
		if err != nil || v != 7 || len(got) != len(tablets) {
			t.Fatalf("decode %v: %d %v %v", tablets, v, got, err)
		}
		for i := range got {
			if !bytes.Equal(got[i].Low, tablets[i].Low) || !bytes.Equal(got[i].High, tablets[i].High) || got[i].HighInf != tablets[i].HighInf {
				t.Fatalf("tablet %d: %+v want %+v", i, got[i], tablets[i])
			}
		}
		used := dirSize(tablets)
		for i := range used {
			c := slices.Clone(b)
			c[i] ^= 0x40
			if _, _, err := DecodeDir(c); err == nil {
				t.Fatalf("%d tablets: a flip of byte %d decodes", len(tablets), i)
			}
		}
	}
	many := make([]Tablet, MaxTablets+1)
	for i := range many {
		many[i] = Tablet{Low: []byte{byte(i)}, High: []byte{byte(i + 1)}}
	}
	if _, err := NewStore(StoreConfig{Tablets: many}, nil); err == nil {
		t.Fatal("a store of MaxTablets+1 tablets")
	}
	if _, err := NewStore(StoreConfig{Tablets: []Tablet{{Low: []byte("k"), High: []byte("z")}, {Low: []byte("a"), High: []byte("m")}}}, nil); err == nil {
		t.Fatal("a store of overlapping tablets")
	}
	if _, err := NewStore(StoreConfig{Tablets: many[:MaxTablets]}, nil); err != nil {
		t.Fatalf("a store of MaxTablets tablets: %v", err)
	}
}

// FuzzDir: DecodeDir never panics, and what it accepts encodes back to
// the same bytes.
func FuzzDir(f *testing.F) {
	for _, tbs := range [][]Tablet{{}, {All}, splitAt(2, "b", "k")[0]} {
		b := make([]byte, dirSize(tbs))
		encodeDir(append(b, make([]byte, DirBytes)...), 3, tbs)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, tbs, err := DecodeDir(b)
		if err != nil {
			return
		}
		c := make([]byte, DirBytes)
		encodeDir(c, v, tbs)
		n := dirSize(tbs)
		if !bytes.Equal(c[:n], b[:n]) {
			t.Fatalf("re-encoded differs")
		}
	})
}

// TestStoreTablets: a Store owning several tablets applies writes to
// their keys, refuses the others (StatusMoved), answers scans inside one
// tablet, and publishes its tablets in the directory area of its header
// region (read back as a client reads it).
func TestStoreTablets(t *testing.T) {
	n := memNode(t)
	tablets := splitAt(2, "c", "f", "m", "t")[1] // [c, f), [m, t)
	s, err := NewStore(StoreConfig{Group: 2, Tree: Config{NodeSize: 512, MaxKey: 16}, Tablets: tablets}, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	index := uint64(1)
	put := func(k string) Result {
		index++
		r, err := DecodeResult(s.Apply(index, AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte(k), Value: []byte("v" + k)}})))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, k := range []string{"c", "d", "ezz", "m", "s"} {
		if r := put(k); r.Status != StatusOK {
			t.Fatalf("put %q: %+v", k, r)
		}
	}
	for _, k := range []string{"a", "bz", "f", "l", "t", "z"} {
		if r := put(k); r.Status != StatusMoved {
			t.Fatalf("put %q outside the tablets: %+v", k, r)
		}
	}
	s.Publish(index)
	b := s.Regions().hdr.Bytes()
	h, err := DecodeHeader(b[:HeaderSize])
	if err != nil || h.DirVersion != s.DirVersion() || h.Applied != index {
		t.Fatalf("header %+v %v (dir version %d)", h, err, s.DirVersion())
	}
	v, got, err := DecodeDir(b[HeaderSize:RegionSize])
	if err != nil || v != s.DirVersion() || len(got) != 2 || string(got[0].Low) != "c" || string(got[1].High) != "t" {
		t.Fatalf("published directory %d %+v %v", v, got, err)
	}
	if s.Tree().Len() != 5 {
		t.Fatalf("the tree holds %d keys, want 5", s.Tree().Len())
	}
}

// scanVia scans [lo, hi) as a client does: piece by piece through the
// directory, each piece answered by its group's state (a tidwall map per
// group), continuing at the piece's fence.
func scanVia(d *Directory, state map[uint32]*tbtree.Map[string, string], lo, hi []byte, limit int, reverse bool) ([]string, error) {
	var out []string
	for {
		g, plo, phi, last, err := d.Piece(lo, hi, reverse)
		if err != nil {
			return out, err
		}
		var keys []string
		state[g].Scan(func(k, _ string) bool {
			if k >= string(plo) && (phi == nil || k < string(phi)) {
				keys = append(keys, k)
			}
			return true
		})
		if reverse {
			slices.Reverse(keys)
		}
		for _, k := range keys {
			if limit > 0 && len(out) >= limit {
				break
			}
			out = append(out, k)
		}
		if last || limit > 0 && len(out) >= limit {
			return out, nil
		}
		if reverse {
			hi = plo
		} else {
			lo = phi
		}
	}
}

// TestDirectoryScans: scans across tablets over 3 groups, piece by piece
// through the directory, agree with one tidwall map of every key (both
// ways, limits, bounds, runs of one group's adjacent tablets merged into
// one piece). With a group's tablets missing from the directory (a gap),
// a scan over the gap fails with ErrDirGap; the planted skipDirGap skips
// the gap and is caught: its answer misses keys the model has.
func TestDirectoryScans(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 18))
	groups := splitAt(3, "d", "h", "h5", "p", "u")
	// Group 1 also takes group 2's tablets: its [d, h) and [h, h5)
	// merge into one piece, as do [p, u) and [u, +inf).
	groups[1] = append(groups[1], groups[2]...)
	delete(groups, 2)
	slices.SortFunc(groups[1], func(a, b Tablet) int { return strings.Compare(string(a.Low), string(b.Low)) })
	d := mustDir(t, groups)
	var all tbtree.Map[string, string]
	state := map[uint32]*tbtree.Map[string, string]{}
	for i := range 400 {
		k := fmt.Sprintf("%c%02d", 'a'+rng.IntN(26), rng.IntN(100))
		g, err := d.Route([]byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if state[g] == nil {
			state[g] = &tbtree.Map[string, string]{}
		}
		state[g].Set(k, fmt.Sprint(i))
		all.Set(k, fmt.Sprint(i))
	}
	model := func(lo, hi []byte, limit int, reverse bool) []string {
		var out []string
		f := func(k, _ string) bool {
			if k < string(lo) || hi != nil && k >= string(hi) {
				return true
			}
			out = append(out, k)
			return limit == 0 || len(out) < limit
		}
		if reverse {
			all.Reverse(f)
		} else {
			all.Scan(f)
		}
		return out
	}
	pieces := 0
	for i := range 300 {
		var lo, hi []byte
		if rng.IntN(4) > 0 {
			lo = []byte{byte('a' + rng.IntN(26))}
		}
		if rng.IntN(4) > 0 {
			hi = []byte{byte('a' + rng.IntN(26)), byte('0' + rng.IntN(10))}
		}
		if hi != nil && string(lo) >= string(hi) {
			continue
		}
		limit := rng.IntN(3) * rng.IntN(60)
		rev := rng.IntN(2) == 0
		got, err := scanVia(d, state, lo, hi, limit, rev)
		want := model(lo, hi, limit, rev)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("scan %d [%q, %q) limit %d reverse %v: %v\n got %v\nwant %v", i, lo, hi, limit, rev, err, got, want)
		}
		pieces++
	}
	// [d, h5) is one piece of group 1.
	if g, _, phi, _, _ := d.Piece([]byte("e"), nil, false); g != 1 || string(phi) != "h5" {
		t.Fatalf("the piece at e: group %d to %q, want group 1 to h5", g, phi)
	}

	// A gap: group 1's tablets missing.
	gap := map[uint32][]Tablet{0: groups[0]}
	if len(groups[0]) != 2 {
		t.Fatalf("group 0 has %d tablets", len(groups[0]))
	}
	for _, bad := range []bool{false, true} {
		dg := mustDir(t, gap)
		if bad {
			PlantSkipDirGap(dg)
		}
		missed, failed := 0, 0
		for _, rev := range []bool{false, true} {
			got, err := scanVia(dg, state, nil, nil, 0, rev)
			switch {
			case errors.Is(err, ErrDirGap):
				failed++
			case err != nil:
				t.Fatal(err)
			case len(got) < all.Len():
				missed++
			}
		}
		if !bad && failed != 2 {
			t.Fatalf("scans over a gap: %d of 2 failed with ErrDirGap", failed)
		}
		if bad && missed != 2 {
			t.Fatalf("planted skipDirGap: %d of 2 scans over the gap missed keys (the property caught: a scan returns every key of its range)", missed)
		}
	}
	if _, err := d.Route([]byte("zzz")); err != nil {
		t.Fatal(err)
	}
	if _, err := mustDir(t, gap).Route([]byte("e")); !errors.Is(err, ErrDirGap) {
		t.Fatalf("route into a gap: %v", err)
	}
	if _, err := NewDirectory(map[uint32][]Tablet{0: {All}, 1: {{Low: []byte("k"), High: []byte("m")}}}, nil); !errors.Is(err, ErrDirOverlap) {
		t.Fatalf("overlapping groups: %v", err)
	}
}

// tabletInvariant says what is wrong with s's tablets, if anything: they
// must cover exactly [low, +inf) without gaps (a split never changes what
// the group owns), each count must be the keys its tablet holds, and no
// tablet may hold more than max keys while the group has fewer than
// MaxTablets.
func tabletInvariant(s *Store, low []byte, max int) string {
	tbs := s.Tablets()
	if len(tbs) == 0 || string(tbs[0].Low) != string(low) || !tbs[len(tbs)-1].HighInf {
		return fmt.Sprintf("cover: tablets %d, first low %q", len(tbs), tbs[0].Low)
	}
	for i := 1; i < len(tbs); i++ {
		if string(tbs[i-1].High) != string(tbs[i].Low) {
			return fmt.Sprintf("cover: a gap between [.., %q) and [%q, ..)", tbs[i-1].High, tbs[i].Low)
		}
	}
	counts := make([]int, len(tbs))
	s.Tree().Ascend(nil, func(k, _ []byte) bool {
		if i := s.owner(k); i >= 0 {
			counts[i]++
		}
		return true
	})
	for i := range tbs {
		if counts[i] != s.Counts()[i] {
			return fmt.Sprintf("count: tablet %d holds %d keys, counted %d", i, counts[i], s.Counts()[i])
		}
		if len(tbs) < MaxTablets && counts[i] > max {
			return fmt.Sprintf("size: tablet %d holds %d keys, more than %d", i, counts[i], max)
		}
	}
	return ""
}

// TestStoreTabletSplit: a tablet that passes TabletMax keys splits at its
// median in the same apply; two stores applying the same requests split
// at the same keys; the tablets keep covering what the group owned (no
// gap), their counts stay exact through deletes and a snapshot restore,
// and the split halves are published. The planted splitGap (the upper
// half starts just past the median) is caught by the cover property.
func TestStoreTabletSplit(t *testing.T) {
	singleNoRace(t)
	for _, plant := range []bool{false, true} {
		low := []byte("b")
		cfg := StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, TabletMax: 40, Tablets: []Tablet{{Low: low, HighInf: true}}}
		s1, err := NewStore(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		s2, _ := NewStore(cfg, nil)
		if plant {
			s1.knobs.splitGap = true
		}
		rng := rand.New(rand.NewPCG(7, 18))
		caught := ""
		for i := range 1500 {
			k := fmt.Sprintf("b%04d", rng.IntN(2000))
			op := Op{Kind: OpPut, Key: []byte(k), Value: []byte("v")}
			if rng.IntN(5) == 0 {
				op = Op{Kind: OpDelete, Key: []byte(k)}
			}
			req := AppendRequest(nil, []Op{op})
			r1, r2 := s1.Apply(uint64(i+1), req), s2.Apply(uint64(i+1), req)
			if msg := tabletInvariant(s1, low, 40); msg != "" {
				caught = msg
				break
			}
			if !bytes.Equal(r1, r2) || fmt.Sprint(s1.Tablets()) != fmt.Sprint(s2.Tablets()) {
				t.Fatalf("op %d: the stores differ: %x %x, tablets %v %v", i, r1, r2, s1.Tablets(), s2.Tablets())
			}
		}
		if plant {
			if !strings.HasPrefix(caught, "cover:") {
				t.Fatalf("planted splitGap: caught %q, want the cover property", caught)
			}
			continue
		}
		if caught != "" {
			t.Fatal(caught)
		}
		if n := len(s1.Tablets()); n < 10 {
			t.Fatalf("%d tablets after %d keys at 40 a tablet", n, s1.Tree().Len())
		}
		// Restore keeps the tablets and their counts.
		s3, _ := NewStore(cfg, nil)
		commit, err := s3.Restore(s1.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		commit(2000)
		// (Not their write counts, a hint a restore starts again from
		// 0: TestStoreTabletWrites.)
		if fmt.Sprint(noWrites(s3.Tablets())) != fmt.Sprint(noWrites(s1.Tablets())) || fmt.Sprint(s3.Counts()) != fmt.Sprint(s1.Counts()) {
			t.Fatalf("restored tablets %v counts %v, want %v %v", s3.Tablets(), s3.Counts(), s1.Tablets(), s1.Counts())
		}
		if msg := tabletInvariant(s3, low, 40); msg != "" {
			t.Fatal(msg)
		}
	}
}

// TestStoreSplitPublished: the halves of a split are in the directory
// area the next Publish writes, with a new version.
func TestStoreSplitPublished(t *testing.T) {
	n := memNode(t)
	s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, TabletMax: 10, Tablets: []Tablet{All}}, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v0 := s.DirVersion()
	for i := range 11 {
		s.Apply(uint64(i+1), AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte(fmt.Sprintf("k%02d", i)), Value: []byte("v")}}))
	}
	s.Publish(11)
	v, tbs, err := DecodeDir(s.Regions().hdr.Bytes()[HeaderSize:RegionSize])
	if err != nil || v == v0 || len(tbs) != 2 || string(tbs[0].High) != "k05" || string(tbs[1].Low) != "k05" || !tbs[1].HighInf {
		t.Fatalf("published %d (was %d) %v %v", v, v0, tbs, err)
	}
	// A scan through the log across the split answers (the two tablets
	// are one range of the group's).
	rr, err := DecodeReadResult(s.Apply(12, AppendRequest(nil, []Op{{Kind: OpScan, Key: []byte("k")}})))
	if err != nil || rr.Status != StatusOK || len(rr.Pairs) != 11 {
		t.Fatalf("a scan across the split: status %d, %d pairs, %v", rr.Status, len(rr.Pairs), err)
	}
}
