package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// refLog writes, through a Mux on mem, three batches: in each, stream 1
// writes payload p and then streams 2 and 3 the same p (a leader's entry
// and its followers'), and stream 2 a payload of its own. It returns
// the model and the Mux (drained).
func refLog(t testing.TB, mem *vfs.Mem, knobs testingKnobs, segBytes int64) (muxModel, *Mux) {
	t.Helper()
	d := newTestDevice(mem)
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: segBytes}, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs, m.w.knobs = knobs, knobs
	rng := rand.New(rand.NewPCG(1, 2))
	s1, s2, s3 := m.Stream(1, nil), m.Stream(2, nil), m.Stream(3, nil)
	mm := muxModel{}
	p := payload(rng, 0, 700)
	for i := range 3 {
		if i > 0 && knobs.muxRefAcrossBatches {
			// the planted table matches across batches: the same
			// payload in the next batch, with no whole record of it
			mm.add(t, s2, RecEntry, 0, p, false)
			mm.add(t, s3, RecEntry, 0, p, false)
		} else {
			p = payload(rng, uint64(i), 700+100*i)
			mm.add(t, s1, RecEntry, 0, p, false)
			mm.add(t, s2, RecEntry, 0, p, false)
			mm.add(t, s3, RecEntry, 0, p, false)
		}
		mm.add(t, s2, RecCommit, 1, payload(rng, uint64(10+i), 90), true)
		muxDrain(t, m, d, 0)
	}
	if err := m.w.Err(); err != nil {
		t.Fatal(err)
	}
	return mm, m
}

// A payload a stream writes that an earlier record of the batch holds is
// a 64-byte reference on the disk, and recovery gives each stream its
// payload back.
func TestMuxRefWritesOnce(t *testing.T) {
	mem := vfs.NewMem()
	mm, m := refLog(t, mem, testingKnobs{}, 1<<16)
	refs, saved := m.RefStats()
	if refs != 6 {
		t.Fatalf("references written: %d, want 6 (two a batch)", refs)
	}
	whole := uint64(0)
	for _, n := range []int{700, 800, 900} {
		whole += 2 * uint64(recSize(muxHdrSize+n)-recSize(muxHdrSize+muxRefSize))
	}
	if saved != whole {
		t.Fatalf("bytes saved %d, want %d", saved, whole)
	}
	st := snapState(m)
	// What a stream counts is its own log's size: a reference counts its
	// payload (the snapshot cadence follows it).
	if b, a := m.byID[1].BytesWritten(), m.byID[3].BytesWritten(); a != b {
		t.Fatalf("stream 3 counted %d bytes, stream 1 %d: a follower's count shrank with its references", a, b)
	}
	mem.DropUnsynced()
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	if f := checkMux(mm, st, mr); len(f) > 0 {
		t.Fatalf("%q", f)
	}
	nref := 0
	for _, r := range mr.Log.Records {
		if x, _ := ParseMuxRecord(r.Data); x.Ref {
			nref++
		}
	}
	if nref != 6 {
		t.Fatalf("references on the disk: %d, want 6", nref)
	}
}

// The planted bugs of references and the checks aimed at them.
func TestMuxRefCatches(t *testing.T) {
	t.Run("wrong target", func(t *testing.T) {
		caughtBy(t, testingKnobs{muxRefWrongTarget: true}, 20, "does not match it")
	})
	t.Run("wrong target unchecked", func(t *testing.T) {
		caughtBy(t, testingKnobs{muxRefWrongTarget: true, muxRefNoCheck: true}, 20, "that it was not written")
	})
	t.Run("across batches", func(t *testing.T) {
		// segments of 4 KiB: the planted references name records of
		// an earlier segment too
		mem := vfs.NewMem()
		refLog(t, mem, testingKnobs{muxRefAcrossBatches: true}, 4096)
		mem.DropUnsynced()
		_, err := RecoverMux(mem, testDir, testMuxMember)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "not earlier in its batch") {
			t.Fatalf("recover: %v, want a reference not earlier in its batch", err)
		}
		t.Logf("caught: %v", err)
	})
}

// rewriteRecord replaces the payload of the record at pos (same length)
// in mem's segment and fixes its CRC, as a Writer would have written it.
func rewriteRecord(t testing.TB, mem *vfs.Mem, pos Pos, old, data []byte) {
	t.Helper()
	path := testDir + "/" + SegName(pos.Seg)
	f, err := mem.OpenFile(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, recHdrSize+len(old))
	if _, err := f.ReadAt(b, pos.Off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	nb := append([]byte(nil), b...)
	copy(nb[recHdrSize:], data)
	binary.LittleEndian.PutUint32(nb[0:], crc32.Checksum(nb[4:], castagnoli))
	for i := range b {
		if x := b[i] ^ nb[i]; x != 0 {
			if err := mem.Corrupt(path, pos.Off+int64(i), x); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// FuzzMuxRef: a reference record's bytes as the disk may hold them (its
// stream header and reference, CRC valid: a bug's or a forger's, not bit
// rot) never make RecoverMux return a payload that was not written there:
// it returns the written payloads, or ErrCorrupt. Never a panic.
func FuzzMuxRef(f *testing.F) {
	f.Add(0, []byte{}, false)
	f.Add(1, []byte{0xff}, true)
	f.Add(3, []byte{1, 0, 0, 0, 0, 0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, which int, patch []byte, hdr bool) {
		mem := vfs.NewMem()
		mm, m := refLog(t, mem, testingKnobs{}, 1<<16)
		st := snapState(m)
		mem.DropUnsynced()
		rec, err := Recover(mem.Clone(), testDir, testMuxMember)
		if err != nil {
			t.Fatal(err)
		}
		var refs []Record
		for _, r := range rec.Records {
			if x, _ := ParseMuxRecord(r.Data); x.Ref {
				refs = append(refs, r)
			}
		}
		r := refs[uint(which)%uint(len(refs))]
		data := append([]byte(nil), r.Data...)
		at := muxHdrSize // the reference
		if hdr {
			at = 0 // the stream header
		}
		copy(data[at:], patch)
		rewriteRecord(t, mem, r.Pos, r.Data, data)
		mr, err := RecoverMux(mem, testDir, testMuxMember)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("recover: %v, want ErrCorrupt", err)
			}
			return
		}
		if bytes.Equal(data, r.Data) {
			if fl := checkMux(mm, st, mr); len(fl) > 0 {
				t.Fatalf("unchanged log: %q", fl)
			}
			return
		}
		// Changed, and read: each stream record is one that was
		// written with that stream seq (the header's change may move
		// it to another stream or seq; that the records' CRCs cannot
		// tell).
		for id, s := range mr.Streams {
			for _, x := range s.Records {
				for wid, recs := range mm {
					if w, ok := recs[x.Seq]; ok && (wid == id || hdr) && w.Type == x.Type && bytes.Equal(w.Data, x.Data) {
						goto found
					}
				}
				if !hdr {
					t.Fatalf("stream %d seq %d: %d bytes that were not written", id, x.Seq, len(x.Data))
				}
				// a changed header may name a seq or type never
				// written, or stop being a reference (its 24 bytes are
				// then its payload); its payload must still be a
				// written one
				if bytes.Equal(x.Data, data[muxHdrSize:]) {
					goto found
				}
				for _, recs := range mm {
					for _, w := range recs {
						if bytes.Equal(w.Data, x.Data) {
							goto found
						}
					}
				}
				t.Fatalf("stream %d seq %d: %d bytes that were not written anywhere", id, x.Seq, len(x.Data))
			found:
			}
		}
	})
}
