package btree

import (
	"bytes"
	"fmt"
	"testing"
)

func ctlReq(cmd uint8, to uint32, gen uint64, tb Tablet, es ...KVV) []byte {
	return AppendCtl(nil, &Ctl{Cmd: cmd, To: to, Gen: gen, Tablet: tb, Entries: es})
}

func putReq(key, val string) []byte {
	return AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte(key), Value: []byte(val)}})
}

func status(t *testing.T, res []byte) uint8 {
	t.Helper()
	r, err := DecodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	return r.Status
}

// applier applies requests to stores at increasing log indexes, one
// counter for every store it is given (the stores of a move's groups),
// and returns their status.
type applier struct {
	t   *testing.T
	idx uint64
}

func (a *applier) apply(s *Store, req []byte) uint8 {
	a.t.Helper()
	a.idx++
	return status(a.t, s.Apply(a.idx, req))
}

// must applies req to s and fails the test, naming the step what,
// unless its status is want.
func (a *applier) must(s *Store, what string, want uint8, req []byte) {
	a.t.Helper()
	if st := a.apply(s, req); st != want {
		a.t.Fatalf("%s: status %d, want %d", what, st, want)
	}
}

// TestStoreMoveSteps: a tablet's move from g to t at the Stores: a frozen
// tablet refuses writes (StatusMoving) and serves log reads; the target
// takes the entries with their versions as an installing tablet that it
// neither reads nor writes; the drop deletes the keys at g and bumps its
// ownership version; the activation serves them at t. Every step sent
// twice changes nothing more, stale steps are refused (StatusCondFailed),
// and snapshots taken between the steps carry the states and versions.
// The planted writeDuringMove applies a write to the frozen tablet.
func TestStoreMoveSteps(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			cfg := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, FreeAfter: 4}
			cg, ct := cfg, cfg
			cg.Group, cg.Tablets = 0, []Tablet{{Low: []byte("a"), High: []byte("m")}}
			ct.Group, ct.Tablets = 1, []Tablet{{Low: []byte("m"), HighInf: true}}
			g, err := NewStore(cg, nil)
			if err != nil {
				t.Fatal(err)
			}
			tg, err := NewStore(ct, nil)
			if err != nil {
				t.Fatal(err)
			}
			if plant {
				PlantWriteDuringMove(g)
			}
			idx := uint64(0)
			apply := func(s *Store, b []byte) []byte { idx++; return s.Apply(idx, b) }
			for i := range 40 {
				if st := status(t, apply(g, putReq(fmt.Sprintf("b%02d", i), "v"))); st != StatusOK {
					t.Fatal(st)
				}
			}
			tb := cg.Tablets[0]
			// Stale proposals: wrong gen, wrong fences, to itself.
			for _, b := range [][]byte{ctlReq(CtlFreeze, 1, 2, tb), ctlReq(CtlFreeze, 1, 1, Tablet{Low: []byte("a"), High: []byte("n")}), ctlReq(CtlFreeze, 0, 1, tb)} {
				if st := status(t, apply(g, b)); st != StatusCondFailed {
					t.Fatalf("stale freeze: status %d", st)
				}
			}
			own0 := g.OwnVersion()
			for range 2 {
				if st := status(t, apply(g, ctlReq(CtlFreeze, 1, 1, tb))); st != StatusOK {
					t.Fatalf("freeze: %d", st)
				}
			}
			st := status(t, apply(g, putReq("b05", "w")))
			switch {
			case !plant && st != StatusMoving:
				t.Fatalf("a write to a frozen tablet: status %d, want StatusMoving", st)
			case plant && st != StatusOK:
				t.Fatalf("planted writeDuringMove: status %d", st)
			}
			if rr, _ := DecodeReadResult(apply(g, AppendRequest(nil, []Op{{Kind: OpGet, Key: []byte("b05")}}))); rr.Status != StatusOK || len(rr.Pairs) != 1 {
				t.Fatalf("a read of a frozen tablet: %+v", rr)
			}
			// Snapshot of the frozen state, restored into another store.
			g2, _ := NewStore(cg, nil)
			commit, err := g2.Restore(capturedSection(t, g))
			if err != nil {
				t.Fatal(err)
			}
			commit(idx)
			if g2.Tablets()[0].State != TabletFrozen || g2.Tablets()[0].To != 1 || g2.DirVersion() != g.DirVersion() || g2.OwnVersion() != g.OwnVersion() {
				t.Fatalf("restored: %+v dir %d own %d, want %+v %d %d", g2.Tablets(), g2.DirVersion(), g2.OwnVersion(), g.Tablets(), g.DirVersion(), g.OwnVersion())
			}
			// Ingest in two parts (the second twice).
			var es []KVV
			g.Tree().ascend(tb.Low, func(e Entry) bool { es = append(es, KVV{Key: e.Key, Value: e.Value, Version: e.Version}); return true })
			for _, part := range [][]KVV{es[:20], es[20:], es[20:]} {
				if st := status(t, apply(tg, ctlReq(CtlIngest, 1, 1, tb, part...))); st != StatusOK {
					t.Fatalf("ingest: %d", st)
				}
			}
			if tg.Counts()[0] != 40 || tg.Tablets()[0].State != TabletInstalling {
				t.Fatalf("installing: %+v %v", tg.Tablets(), tg.Counts())
			}
			for _, b := range [][]byte{putReq("b01", "x"), AppendRequest(nil, []Op{{Kind: OpGet, Key: []byte("b01")}})} {
				if res := apply(tg, b); res[0] != StatusMoved {
					t.Fatalf("an op on an installing tablet: status %d, want StatusMoved", res[0])
				}
			}
			t2, _ := NewStore(ct, nil)
			commit, err = t2.Restore(capturedSection(t, tg))
			if err != nil {
				t.Fatal(err)
			}
			commit(idx)
			if t2.Tree().Len() != 40 || t2.Tablets()[0].State != TabletInstalling || t2.Tablets()[0].Gen != 1 {
				t.Fatalf("restored target: %d keys %+v", t2.Tree().Len(), t2.Tablets())
			}
			// Activation before the drop is the mover's rule, not the
			// store's; here: drop, then activate.
			for range 2 {
				if st := status(t, apply(g, ctlReq(CtlDrop, 1, 1, tb))); st != StatusOK {
					t.Fatalf("drop: %d", st)
				}
			}
			if g.Tree().Len() != 0 || len(g.Tablets()) != 0 || g.OwnVersion() != own0+1 {
				t.Fatalf("after the drop: %d keys, tablets %+v, own %d", g.Tree().Len(), g.Tablets(), g.OwnVersion())
			}
			if res := apply(g, putReq("b01", "x")); res[0] != StatusMoved {
				t.Fatalf("a write after the drop: %d", res[0])
			}
			ownT := tg.OwnVersion()
			for range 2 {
				if st := status(t, apply(tg, ctlReq(CtlActivate, 1, 1, tb))); st != StatusOK {
					t.Fatalf("activate: %d", st)
				}
			}
			if tg.OwnVersion() != ownT+1 || tg.Tablets()[0].State != TabletServing {
				t.Fatalf("after activation: %+v own %d", tg.Tablets(), tg.OwnVersion())
			}
			rr, _ := DecodeReadResult(apply(tg, AppendRequest(nil, []Op{{Kind: OpGet, Key: []byte("b05")}})))
			if rr.Status != StatusOK || len(rr.Pairs) != 1 || string(rr.Pairs[0].Value) != "v" && !plant {
				t.Fatalf("moved key at the target: %+v", rr)
			}
			if st := status(t, apply(tg, putReq("b05", "y"))); st != StatusOK {
				t.Fatalf("a write at the target: %d", st)
			}
			if err := tg.Tree().Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStoreMoveAbort: an abort removes the target's installing tablet
// and unfreezes the source's; the source then takes writes again.
func TestStoreMoveAbort(t *testing.T) {
	tb := Tablet{Low: []byte("a"), High: []byte("m")}
	g, _ := NewStore(StoreConfig{Group: 0, Tablets: []Tablet{tb}}, nil)
	tg, _ := NewStore(StoreConfig{Group: 1}, nil)
	g.Apply(1, putReq("b", "v"))
	if st := status(t, g.Apply(2, ctlReq(CtlFreeze, 1, 1, tb))); st != StatusOK {
		t.Fatal(st)
	}
	frozenOwn := g.OwnVersion()
	tg.Apply(3, ctlReq(CtlIngest, 1, 1, tb, KVV{Key: []byte("b"), Value: []byte("v"), Version: 1 << 16}))
	for _, s := range []*Store{tg, g} {
		if st := status(t, s.Apply(4, ctlReq(CtlAbort, 1, 1, tb))); st != StatusOK {
			t.Fatal(st)
		}
	}
	// A mover resuming from a directory read while the tablet was frozen
	// reads the source checked at that ownership version: the abort must
	// change it, or the read takes a tablet that takes writes again.
	if g.OwnVersion() == frozenOwn {
		t.Fatalf("the source's ownership version is %d after the abort, as while frozen", frozenOwn)
	}
	if tg.Tree().Len() != 0 || len(tg.Tablets()) != 0 {
		t.Fatalf("target after abort: %d keys %+v", tg.Tree().Len(), tg.Tablets())
	}
	if g.Tablets()[0].State != TabletServing || status(t, g.Apply(5, putReq("c", "v"))) != StatusOK {
		t.Fatalf("source after abort: %+v", g.Tablets())
	}
}

// TestStoreMoveLeftover: a move aborted at its source but not at its
// target (an undo interrupted between its steps) leaves an installing
// copy at the target. The next move of the range to that target must not
// take its pairs over that copy: a key deleted at the source between the
// two moves would come back at the target once it serves the tablet.
// The abort uses the move's generation up (a freeze of the aborted move
// sent again is refused, the next move has the next generation and the
// directory hides the leftover behind the source's tablet), and the
// next move's ingest removes the older leftover first. The planted
// ingestOverLeftover (the old rules) brings the deleted key back.
func TestStoreMoveLeftover(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			tb := Tablet{Low: []byte("a"), High: []byte("m")}
			g, _ := NewStore(StoreConfig{Group: 0, Tablets: []Tablet{tb}}, nil)
			tg, _ := NewStore(StoreConfig{Group: 1}, nil)
			if plant {
				PlantIngestOverLeftover(g)
				PlantIngestOverLeftover(tg)
			}
			a := &applier{t: t}
			entries := func() []KVV {
				var es []KVV
				g.Tree().ascend(tb.Low, func(e Entry) bool {
					es = append(es, KVV{Key: bytes.Clone(e.Key), Value: bytes.Clone(e.Value), Version: e.Version})
					return true
				})
				return es
			}
			a.apply(g, putReq("b", "v"))
			a.apply(g, putReq("c", "v"))
			// Move 1: frozen, ingested, aborted at the source only.
			gen1 := g.Tablets()[0].Gen + 1
			a.must(g, "freeze", StatusOK, ctlReq(CtlFreeze, 1, gen1, tb))
			a.must(tg, "ingest", StatusOK, ctlReq(CtlIngest, 1, gen1, tb, entries()...))
			a.must(g, "abort at the source", StatusOK, ctlReq(CtlAbort, 1, gen1, tb))
			if !plant {
				a.must(g, "a freeze of the aborted move sent again", StatusCondFailed, ctlReq(CtlFreeze, 1, gen1, tb))
				d, err := NewDirectory(map[uint32][]Tablet{0: g.Tablets(), 1: tg.Tablets()}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(d.Moving()) != 0 || len(d.Tablets()) != 1 || d.Tablets()[0].Group != 0 {
					t.Fatalf("directory after the abort at the source: tablets %+v, moving %+v", d.Tablets(), d.Moving())
				}
			}
			// The source serves again: c is deleted there.
			a.must(g, "delete", StatusOK, AppendRequest(nil, []Op{{Kind: OpDelete, Key: []byte("c")}}))
			// Move 2, to the same target, at the generation a mover
			// reads from the source's tablet.
			gen2 := g.Tablets()[0].Gen + 1
			a.must(g, "second freeze", StatusOK, ctlReq(CtlFreeze, 1, gen2, tb))
			a.must(tg, "second ingest", StatusOK, ctlReq(CtlIngest, 1, gen2, tb, entries()...))
			a.must(g, "drop", StatusOK, ctlReq(CtlDrop, 1, gen2, tb))
			a.must(tg, "activate", StatusOK, ctlReq(CtlActivate, 1, gen2, tb))
			var keys []string
			tg.Tree().ascend(nil, func(e Entry) bool { keys = append(keys, string(e.Key)); return true })
			back := len(keys) != 1 || keys[0] != "b" || tg.Counts()[0] != 1
			if back != plant {
				t.Fatalf("plant %v: the target serves keys %q (counted %v) after the second move; only %q was left at the source", plant, keys, tg.Counts(), "b")
			}
			if err := tg.Tree().Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// FuzzCtl: DecodeCtl never panics, and takes back what AppendCtl wrote.
func FuzzCtl(f *testing.F) {
	f.Add(ctlReq(CtlIngest, 3, 2, Tablet{Low: []byte("a"), High: []byte("z")}, KVV{Key: []byte("b"), Value: []byte("v"), Version: 7}))
	f.Add(ctlReq(CtlFreeze, 1, 1, All))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCtl(b, 16, 64)
		if err != nil {
			return
		}
		if got := AppendCtl(nil, &c); string(got) != string(b) {
			t.Fatalf("re-encoded %x, decoded from %x", got, b)
		}
	})
}

// TestMoveVersionsNeverRepeat: versions are log indexes (index<<16 | op)
// of the group that wrote them, and groups' logs are not aligned, so a
// key moved from a group far ahead into one far behind keeps versions the
// target would issue again later. A compare-and-swap holding the key's
// version from before the move must fail once the target wrote the key,
// whatever its index: after an ingest, every version the target issues
// exceeds the moved keys' (Store.verOff, carried in snapshots). The
// planted noVersionFloor lets the target reissue the moved version.
func TestMoveVersionsNeverRepeat(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			cfg := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, FreeAfter: 4}
			cg, ct := cfg, cfg
			cg.Group, cg.Tablets = 0, []Tablet{{Low: []byte("a"), High: []byte("m")}}
			ct.Group, ct.Tablets = 1, []Tablet{{Low: []byte("m"), HighInf: true}}
			g, _ := NewStore(cg, nil)
			tg, _ := NewStore(ct, nil)
			tg.knobs.noVersionFloor = plant
			gi, ti := uint64(1000), uint64(0) // g's log is far ahead
			ag := func(b []byte) []byte { gi++; return g.Apply(gi, b) }
			at := func(b []byte) []byte { ti++; return tg.Apply(ti, b) }
			get := func(s *Store, idx *uint64, key string) Pair {
				*idx++
				rr, _ := DecodeReadResult(s.Apply(*idx, AppendRequest(nil, []Op{{Kind: OpGet, Key: []byte(key)}})))
				if rr.Status != StatusOK || len(rr.Pairs) != 1 {
					t.Fatalf("get %s: %+v", key, rr)
				}
				return rr.Pairs[0]
			}
			if st := status(t, ag(putReq("b", "v1"))); st != StatusOK {
				t.Fatal(st)
			}
			old := get(g, &gi, "b").Version
			tb := cg.Tablets[0]
			ag(ctlReq(CtlFreeze, 1, 1, tb))
			var es []KVV
			g.Tree().ascend(tb.Low, func(e Entry) bool { es = append(es, KVV{Key: e.Key, Value: e.Value, Version: e.Version}); return true })
			at(ctlReq(CtlIngest, 1, 1, tb, es...))
			ag(ctlReq(CtlDrop, 1, 1, tb))
			at(ctlReq(CtlActivate, 1, 1, tb))
			// A restarted target replica restores from a snapshot.
			t2, _ := NewStore(ct, nil)
			t2.knobs.noVersionFloor = plant
			commit, err := t2.Restore(capturedSection(t, tg))
			if err != nil {
				t.Fatal(err)
			}
			commit(ti)
			// The target writes b (and others) until its index passes the
			// moved version's, then b again with the old value.
			reissued := false
			for _, s := range []*Store{tg, t2} {
				idx := ti
				for idx < gi+2 {
					idx++
					s.Apply(idx, putReq("b", "v1"))
					if v := get(s, &idx, "b").Version; v <= old {
						reissued = reissued || v == old
						if !plant {
							t.Fatalf("a version issued after the move, %#x, is not above the moved key's %#x", v, old)
						}
					}
				}
				idx++
				cas := AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("b"), Value: []byte("v2"), Cmp: CmpVersion, CmpVersion: old}})
				if st := status(t, s.Apply(idx, cas)); st == StatusOK && !plant {
					t.Fatal("a CAS on the version read before the move succeeded after the target rewrote the key")
				}
			}
			if plant && !reissued {
				t.Fatal("planted noVersionFloor: the target never reissued the moved version (the test no longer exercises it)")
			}
		})
	}
}

// capturedSection is the section a capture of s persists, checked against
// s.Snapshot (what replicas write to disk is what the reference writes).
func capturedSection(t *testing.T, s *Store) []byte {
	t.Helper()
	c := s.Capture()
	b := make([]byte, c.Size())
	if err := c.Persist(b); err != nil {
		t.Fatal(err)
	}
	if want := s.Snapshot(); !bytes.Equal(b, want) {
		t.Fatalf("a capture persisted %d bytes that differ from the snapshot's %d", len(b), len(want))
	}
	return b
}

// TestStoreDropPublishesFirst: a drop's node writes (the deletion of the
// tablet's keys) all come after the header says the new ownership
// version and the directory area no longer lists the tablet: a reader
// checks the version before and after its node reads, so a leaf without
// the moved keys is never read under the old version (the client saw
// "not found" for keys that moved: TestKeyspaceMoveLinearizable). The
// planted dropBeforePublish deletes the keys first and is caught: node
// writes under the old version.
func TestStoreDropPublishesFirst(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			n := memNode(t)
			tb := Tablet{Low: []byte("a"), High: []byte("m")}
			s, err := NewStore(StoreConfig{Group: 0, Tree: Config{NodeSize: 256, MaxKey: 8}, FreeAfter: 4, Tablets: []Tablet{tb}}, n)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if plant {
				s.knobs.dropBeforePublish = true
			}
			idx := uint64(0)
			apply := func(b []byte) uint8 {
				idx++
				st := status(t, s.Apply(idx, b))
				s.Publish(idx)
				return st
			}
			for i := range 60 {
				if st := apply(putReq(fmt.Sprintf("b%02d", i), "v")); st != StatusOK {
					t.Fatal(st)
				}
			}
			if st := apply(ctlReq(CtlFreeze, 1, 1, tb)); st != StatusOK {
				t.Fatalf("freeze: %d", st)
			}
			own0 := s.OwnVersion()
			writes, oldOwn, listed := 0, 0, 0
			s.t.knobs.onWrite = func() {
				writes++
				b := s.Regions().hdr.Bytes()
				h, err := DecodeHeader(b[:HeaderSize])
				if err != nil {
					t.Fatal(err)
				}
				_, tbs, err := DecodeDir(b[HeaderSize:RegionSize])
				if err != nil {
					t.Fatal(err)
				}
				if h.OwnVersion == own0 {
					oldOwn++
				}
				if len(tbs) > 0 {
					listed++
				}
				if h.Applied > idx-1 {
					t.Fatalf("header published during the drop (entry %d) says applied %d", idx, h.Applied)
				}
			}
			if st := apply(ctlReq(CtlDrop, 1, 1, tb)); st != StatusOK {
				t.Fatalf("drop: %d", st)
			}
			s.t.knobs.onWrite = nil
			if s.Tree().Len() != 0 || s.OwnVersion() != own0+1 || writes == 0 {
				t.Fatalf("after the drop: %d keys, own %d (was %d), %d node writes", s.Tree().Len(), s.OwnVersion(), own0, writes)
			}
			switch {
			case !plant && (oldOwn > 0 || listed > 0):
				t.Fatalf("%d of the drop's %d node writes under the old ownership version, %d with the tablet still listed", oldOwn, writes, listed)
			case plant && oldOwn == 0:
				t.Fatalf("planted dropBeforePublish not caught: none of %d node writes under the old ownership version", writes)
			case plant:
				t.Logf("planted dropBeforePublish caught: %d of the drop's %d node writes under the old ownership version", oldOwn, writes)
			}
		})
	}
}
