package btree

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// Tablets: the key ranges a group owns, published after the group's
// header in its header region, and the client's directory, the union of
// every group's tablets (docs/btree.md, "Tablets and the directory").
//
// All of a group's tablets live in the group's one tree: a tablet is the
// range of keys the group answers for, not a tree of its own. The tree's
// fences and links run across the group's tablets; a group's tree never
// holds a key outside its tablets (apply refuses it, StatusMoved).
//
// Directory area, at byte hdrRegionSize of the header region (DirBytes
// bytes; written before the header that counts it, sealed by its own
// check word):
//
//	0         8         12       16
//	[version ][count   ][used   ] then count tablets, sorted by low fence:
//	  [state u8][flags u8][low len u16][high len u16][0 u16][gen u64]
//	  [to u32][0 u32][low][high]
//	[check u64]   (ends at used; xxhash of [0, used-8))
//
//	version  bumped at every change of the group's tablets (also in the
//	         header's word 3)
//	state    TabletServing, TabletFrozen, TabletInstalling (move.go)
//	flags    bit 0: the high fence is +inf
//	gen, to  Tablet.Gen and Tablet.To
//
// The load area (LoadBytes: each tablet's write and key counts, load.go)
// follows it.
const (
	// MaxTablets bounds the tablets a group owns: the directory area
	// holds at most this many. A tablet that would split past it does
	// not split (it keeps growing), and a config whose split points give
	// a group more is refused.
	MaxTablets = 64
	// DirBytes is the size of the directory area: MaxTablets tablets of
	// fences of up to 248 bytes each. A split whose fences would not fit
	// is not made.
	DirBytes  = 32 << 10
	dirHdr    = 16
	dirEnt    = 24
	hDirVer   = 24 // the header's word 3: the directory's version
	regionLen = hdrRegionSize + DirBytes + LoadBytes
)

// Tablet states.
const (
	// TabletServing: the group applies writes to the tablet's keys.
	TabletServing = 0
)

// ErrDirGap: the directory has no tablet for a key (a group's tablets
// were not read, or changed between the reads of two groups' headers).
// The client reads the headers again; a gap that stays is this error,
// never a scan that skips the range.
var ErrDirGap = errors.New("btree: no tablet holds the key (a gap in the directory)")

// ErrDirOverlap: two groups' published tablets overlap.
var ErrDirOverlap = errors.New("btree: tablets of two groups overlap")

// dirSize is the bytes of the directory area that tablets take.
func dirSize(tablets []Tablet) int {
	n := dirHdr + checkSize
	for _, tb := range tablets {
		n += dirEnt + len(tb.Low) + len(tb.High)
	}
	return n
}

// appendDir encodes tablets (sorted, disjoint) at version into b's
// directory area (b at least DirBytes long).
func encodeDir(b []byte, version uint64, tablets []Tablet) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], version)
	le.PutUint32(b[8:], uint32(len(tablets)))
	p := dirHdr
	for _, tb := range tablets {
		clear(b[p : p+dirEnt])
		b[p] = tb.State
		if tb.HighInf {
			b[p+1] = 1
		}
		le.PutUint16(b[p+2:], uint16(len(tb.Low)))
		le.PutUint16(b[p+4:], uint16(len(tb.High)))
		le.PutUint64(b[p+8:], tb.Gen)
		le.PutUint32(b[p+16:], tb.To)
		p += dirEnt
		p += copy(b[p:], tb.Low)
		p += copy(b[p:], tb.High)
	}
	used := p + checkSize
	le.PutUint32(b[12:], uint32(used))
	le.PutUint64(b[p:], xxhash.Sum64(b[:p]))
}

// DecodeDir validates and decodes a group's directory area (the bytes
// from HeaderSize of its header region): its version and its tablets,
// sorted and disjoint, aliasing b. If b goes on to the load area (b
// holds RegionSize-HeaderSize bytes) and that area is whole and of the
// same version, the tablets carry their load (Writes, Keys, HasLoad:
// load.go); a torn or older load area fails nothing, the tablets then
// have none.
func DecodeDir(b []byte) (uint64, []Tablet, error) {
	v, out, err := decodeDir(b)
	if err == nil && len(b) >= DirBytes+LoadBytes {
		attachLoad(b[DirBytes:DirBytes+LoadBytes], v, out)
	}
	return v, out, err
}

func decodeDir(b []byte) (uint64, []Tablet, error) {
	le := binary.LittleEndian
	if len(b) < dirHdr+checkSize {
		return 0, nil, ErrTorn
	}
	used := int(le.Uint32(b[12:]))
	if used < dirHdr+checkSize || used > len(b) || used > DirBytes {
		return 0, nil, ErrTorn
	}
	if xxhash.Sum64(b[:used-checkSize]) != le.Uint64(b[used-checkSize:]) {
		return 0, nil, ErrTorn
	}
	version, count := le.Uint64(b), int(le.Uint32(b[8:]))
	if count > MaxTablets {
		return 0, nil, fmt.Errorf("%w: %d tablets", ErrMalformed, count)
	}
	out := make([]Tablet, 0, count)
	p, end := dirHdr, used-checkSize
	for range count {
		if end-p < dirEnt {
			return 0, nil, fmt.Errorf("%w: truncated tablet", ErrMalformed)
		}
		st, fl := b[p], b[p+1]
		ll, hl := int(le.Uint16(b[p+2:])), int(le.Uint16(b[p+4:]))
		gen, to := le.Uint64(b[p+8:]), le.Uint32(b[p+16:])
		zero := le.Uint16(b[p+6:]) == 0 && le.Uint32(b[p+20:]) == 0
		p += dirEnt
		if st > TabletInstalling || fl > 1 || fl == 1 && hl != 0 || ll+hl > end-p || !zero {
			return 0, nil, fmt.Errorf("%w: tablet entry", ErrMalformed)
		}
		tb := Tablet{Low: b[p : p+ll : p+ll], HighInf: fl == 1, State: st, Gen: gen, To: to}
		p += ll
		if !tb.HighInf {
			tb.High = b[p : p+hl : p+hl]
			if string(tb.High) <= string(tb.Low) {
				return 0, nil, fmt.Errorf("%w: tablet [%q, %q)", ErrMalformed, tb.Low, tb.High)
			}
		}
		p += hl
		if n := len(out); n > 0 && (out[n-1].HighInf || string(out[n-1].High) > string(tb.Low)) {
			return 0, nil, fmt.Errorf("%w: tablets out of order", ErrMalformed)
		}
		out = append(out, tb)
	}
	if p != end {
		return 0, nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, end-p)
	}
	return version, out, nil
}

// checkTablets validates a group's tablets: sorted, disjoint, at most
// MaxTablets, fences of at most maxKey bytes, fitting the directory area.
func checkTablets(tablets []Tablet, maxKey int) error {
	if len(tablets) > MaxTablets {
		return fmt.Errorf("btree: %d tablets: a group owns at most %d", len(tablets), MaxTablets)
	}
	for i, tb := range tablets {
		switch {
		case len(tb.Low) > maxKey || len(tb.High) > maxKey:
			return fmt.Errorf("btree: tablet %d: a fence longer than the longest key (%d bytes)", i, maxKey)
		case tb.HighInf && len(tb.High) != 0:
			return fmt.Errorf("btree: tablet %d: a high fence and +inf", i)
		case !tb.HighInf && string(tb.High) <= string(tb.Low):
			return fmt.Errorf("btree: tablet %d: [%q, %q) is empty", i, tb.Low, tb.High)
		case i > 0 && (tablets[i-1].HighInf || string(tablets[i-1].High) > string(tb.Low)):
			return fmt.Errorf("btree: tablets %d and %d overlap or are out of order", i-1, i)
		}
	}
	if n := dirSize(tablets); n > DirBytes {
		return fmt.Errorf("btree: %d tablets take %d directory bytes, at most %d", len(tablets), n, DirBytes)
	}
	return nil
}

// Placed is a tablet and the group that owns it.
type Placed struct {
	Tablet
	Group uint32
}

// Directory is a client's map from keys to groups: the union of every
// group's published tablets, sorted by low fence. It is immutable once
// built (a refresh builds another).
//
// During a move two groups may publish the same range (the directory
// read the source before its drop and the target after its activation):
// the tablet of the higher Gen is the newer and wins. A tablet being
// installed is not routed to; a key that only such a tablet holds is
// moving (ErrTabletMoving: the caller waits and reads the directory
// again).
type Directory struct {
	tablets  []Placed
	moving   []Placed // installing tablets not covered by a served one
	versions map[uint32]uint64
	owns     map[uint32]uint64
	knobs    testingKnobs
}

// ErrTabletMoving: the key's tablet is being moved between groups, and
// no group serves it at the moment the directory was read. The caller
// waits a little and reads the directory again.
var ErrTabletMoving = errors.New("btree: the key's tablet is moving between groups")

// NewDirectory is the union of the groups' tablets (groups[g] read from
// group g's header region, at version versions[g]). Overlapping tablets
// of one Gen are an error; gaps are not (a lookup there says so:
// ErrDirGap).
func NewDirectory(groups map[uint32][]Tablet, versions map[uint32]uint64) (*Directory, error) {
	return NewDirectoryOwned(groups, versions, nil)
}

// NewDirectoryOwned is NewDirectory with the ownership version each
// group's header had when its tablets were read (OwnVersion).
func NewDirectoryOwned(groups map[uint32][]Tablet, versions, owns map[uint32]uint64) (*Directory, error) {
	d := &Directory{versions: map[uint32]uint64{}, owns: map[uint32]uint64{}}
	gs := make([]uint32, 0, len(groups))
	for g := range groups {
		gs = append(gs, g)
	}
	slices.Sort(gs)
	var all, inst []Placed
	for _, g := range gs {
		for _, tb := range groups[g] {
			p := Placed{Tablet: Tablet{Low: slices.Clone(tb.Low), High: slices.Clone(tb.High), HighInf: tb.HighInf, State: tb.State, To: tb.To, Gen: tb.Gen,
				Writes: tb.Writes, Keys: tb.Keys, HasLoad: tb.HasLoad}, Group: g}
			if tb.State == TabletInstalling {
				inst = append(inst, p)
			} else {
				all = append(all, p)
			}
		}
		d.versions[g] = versions[g]
		d.owns[g] = owns[g]
	}
	// Newest first: a tablet overlapping one of a higher Gen is an older
	// owner's, left out.
	slices.SortStableFunc(all, func(a, b Placed) int {
		switch {
		case a.Gen > b.Gen:
			return -1
		case a.Gen < b.Gen:
			return 1
		}
		return 0
	})
	for _, p := range all {
		keep := true
		for _, q := range d.tablets {
			if overlaps(p.Tablet, q.Tablet) {
				if q.Gen == p.Gen {
					return nil, fmt.Errorf("%w: group %d's [%q, %s) and group %d's [%q, %s)", ErrDirOverlap, q.Group, q.Low, fmtHigh(q.Tablet), p.Group, p.Low, fmtHigh(p.Tablet))
				}
				keep = false
				break
			}
		}
		if keep {
			d.tablets = append(d.tablets, p)
		}
	}
	byLow := func(a, b Placed) int {
		switch {
		case string(a.Low) < string(b.Low):
			return -1
		case string(a.Low) > string(b.Low):
			return 1
		}
		return 0
	}
	slices.SortFunc(d.tablets, byLow)
	for _, p := range inst {
		covered := false
		for _, q := range d.tablets {
			if q.Gen >= p.Gen && overlaps(p.Tablet, q.Tablet) {
				covered = true // activated there already (an older read of this group)
			}
		}
		if !covered {
			d.moving = append(d.moving, p)
		}
	}
	slices.SortFunc(d.moving, byLow)
	return d, nil
}

// OwnVersion is the ownership version group g's header had when its
// tablets were read (0: unknown). A read of g's tree checks that g's
// header still says it, around its node reads.
func (d *Directory) OwnVersion(g uint32) uint64 { return d.owns[g] }

// Moving are the tablets being installed that no served tablet of the
// directory covers (a move between its drop and its activation, or one
// whose source was read after its drop).
func (d *Directory) Moving() []Placed { return d.moving }

// movingAt reports whether key lies in a tablet being installed.
func (d *Directory) movingAt(key []byte) bool {
	for _, p := range d.moving {
		if p.Contains(key) {
			return true
		}
	}
	return false
}

func fmtHigh(tb Tablet) string {
	if tb.HighInf {
		return "+inf"
	}
	return fmt.Sprintf("%q", tb.High)
}

// Tablets are the directory's tablets in key order (the caller must not
// change them).
func (d *Directory) Tablets() []Placed { return d.tablets }

// Version is the directory version of group g's tablets it was built
// from.
func (d *Directory) Version(g uint32) uint64 { return d.versions[g] }

// find is the index of the tablet holding key, or -1.
func (d *Directory) find(key []byte) int {
	i := sort.Search(len(d.tablets), func(i int) bool { return string(d.tablets[i].Low) > string(key) }) - 1
	if i >= 0 && d.tablets[i].Contains(key) {
		return i
	}
	return -1
}

// Route is the group owning key, or ErrDirGap.
func (d *Directory) Route(key []byte) (uint32, error) {
	if i := d.find(key); i >= 0 {
		return d.tablets[i].Group, nil
	}
	// A copy for the message: key itself stays the caller's (a put routes
	// a key it built on its stack).
	if d.movingAt(key) {
		return 0, fmt.Errorf("%w: key %q", ErrTabletMoving, bytes.Clone(key))
	}
	return 0, fmt.Errorf("%w: key %q", ErrDirGap, bytes.Clone(key))
}

// Piece is the part of a scan of [lo, hi) (hi nil: no bound) that one
// group answers next: the run of consecutive tablets of one group that
// holds lo (reverse: the keys just below hi), clipped to [lo, hi). last
// says the piece reaches the end of the scan's range (lo, with reverse);
// otherwise the scan continues at the piece's high fence (low fence with
// reverse), which is where the next tablet must begin: a scan never skips
// a range no tablet holds, it stops with ErrDirGap there.
func (d *Directory) Piece(lo, hi []byte, reverse bool) (g uint32, plo, phi []byte, last bool, err error) {
	var i int
	if !reverse {
		i = d.find(lo)
		if i < 0 && d.knobs.skipDirGap {
			// Planted: take the next tablet past the gap.
			i = sort.Search(len(d.tablets), func(i int) bool { return string(d.tablets[i].Low) > string(lo) })
			if i == len(d.tablets) {
				return 0, nil, nil, true, nil
			}
			lo = d.tablets[i].Low
		}
		if i < 0 {
			if d.movingAt(lo) {
				return 0, nil, nil, false, fmt.Errorf("%w: a scan at %q", ErrTabletMoving, lo)
			}
			return 0, nil, nil, false, fmt.Errorf("%w: a scan at %q", ErrDirGap, lo)
		}
		j := i
		for j+1 < len(d.tablets) && d.tablets[j+1].Group == d.tablets[i].Group && !d.tablets[j].HighInf && string(d.tablets[j+1].Low) == string(d.tablets[j].High) {
			j++
		}
		t := d.tablets[j]
		if t.HighInf || hi != nil && string(t.High) >= string(hi) {
			return t.Group, lo, hi, true, nil
		}
		return t.Group, lo, t.High, false, nil
	}
	// Reverse: the tablet holding the greatest key below hi.
	if hi == nil {
		i = len(d.tablets) - 1
		if i < 0 || !d.tablets[i].HighInf {
			i = -1
		}
	} else {
		i = sort.Search(len(d.tablets), func(i int) bool { return string(d.tablets[i].Low) >= string(hi) }) - 1
		if i >= 0 && !d.tablets[i].HighInf && string(d.tablets[i].High) < string(hi) {
			i = -1 // hi lies past tablet i's end: a gap below hi
		}
	}
	if i < 0 && d.knobs.skipDirGap {
		i = sort.Search(len(d.tablets), func(i int) bool { return hi != nil && string(d.tablets[i].Low) >= string(hi) }) - 1
		if i < 0 {
			return 0, nil, nil, true, nil
		}
		hi = d.tablets[i].High
	}
	if i < 0 {
		for _, p := range d.moving {
			if hi == nil && p.HighInf || hi != nil && string(p.Low) < string(hi) && (p.HighInf || string(p.High) >= string(hi)) {
				return 0, nil, nil, false, fmt.Errorf("%w: a reverse scan below %q", ErrTabletMoving, hi)
			}
		}
		return 0, nil, nil, false, fmt.Errorf("%w: a reverse scan below %q", ErrDirGap, hi)
	}
	j := i
	for j > 0 && d.tablets[j-1].Group == d.tablets[i].Group && !d.tablets[j-1].HighInf && string(d.tablets[j-1].High) == string(d.tablets[j].Low) {
		j--
	}
	t := d.tablets[j]
	if string(t.Low) <= string(lo) {
		return t.Group, lo, hi, true, nil
	}
	return t.Group, t.Low, hi, false, nil
}

// PlantSkipDirGap plants a bug in d: a scan that meets a range no tablet
// holds skips to the next tablet instead of failing (tests of other
// packages: the client's scans across tablets).
func PlantSkipDirGap(d *Directory) { d.knobs.skipDirGap = true }
