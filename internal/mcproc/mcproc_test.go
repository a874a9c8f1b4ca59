package mcproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast"
)

func TestPayloadID(t *testing.T) {
	id := multicast.MsgID{Client: 3, Inc: 1<<40 + 7, Seq: 99}
	for _, size := range []int{0, 24, 100} {
		b := Payload(id, size)
		if len(b) != max(size, PayloadMin) {
			t.Fatalf("size %d: payload of %d bytes", size, len(b))
		}
		got, ok := PayloadID(b)
		if !ok || got != id {
			t.Fatalf("size %d: PayloadID = %v, %v; want %v", size, got, ok, id)
		}
	}
	if _, ok := PayloadID(make([]byte, 10)); ok {
		t.Fatal("a short payload decoded")
	}
	if CheckID(id) == CheckID(multicast.MsgID{Client: 4, Inc: id.Inc, Seq: 99}) {
		t.Fatal("CheckID maps two clients to one id")
	}
}

// TestFSMSnapshot: a replica restored from another's snapshot continues
// with the same results, and reports the restore.
func TestFSMSnapshot(t *testing.T) {
	var dels []*Delivery
	var rest []*Restore
	var fails []*Failure
	a := &FSM{Group: 1, Replica: 0, Inc: 1, OnDeliver: func(d *Delivery) { dels = append(dels, d) }, OnFailure: func(f *Failure) { fails = append(fails, f) }}
	b := &FSM{Group: 1, Replica: 2, Inc: 2, OnRestore: func(r *Restore) { rest = append(rest, r) }, OnFailure: func(f *Failure) { fails = append(fails, f) }}
	for i := uint64(1); i <= 5; i++ {
		a.Apply(broadcast.Entry{Index: i, Data: Payload(multicast.MsgID{Client: 1, Inc: 1, Seq: i}, 40)})
	}
	s, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, s.Size())
	if err := s.Persist(buf); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(buf); err != nil {
		t.Fatal(err)
	}
	if len(rest) != 1 || rest[0].Index != 5 || rest[0].Inc != 2 || b.Delivered() != 5 {
		t.Fatalf("restore reported %+v, delivered %d", rest, b.Delivered())
	}
	e := broadcast.Entry{Index: 6, Data: Payload(multicast.MsgID{Client: 1, Inc: 1, Seq: 6}, 40)}
	ra := string(a.Apply(e))
	rb := string(b.Apply(e))
	if ra != rb || !strings.HasPrefix(ra, "g1@6:") {
		t.Fatalf("results after the snapshot differ: %q vs %q", ra, rb)
	}
	if len(dels) != 6 || dels[5].Msg.Seq != 6 || string(dels[5].Result) != ra || dels[5].Malformed {
		t.Fatalf("deliveries %+v", dels)
	}
	if len(fails) != 0 {
		t.Fatalf("failures: %+v", fails)
	}
	b.Apply(broadcast.Entry{Index: 9, Data: e.Data})
	if len(fails) != 1 {
		t.Fatalf("an index gap was not reported: %+v", fails)
	}
	if err := b.Restore([]byte{1}); err == nil || len(fails) != 2 {
		t.Fatal("a bad snapshot was accepted")
	}
}

// TestEmitter: lines come out in order, all of them, by close.
func TestEmitter(t *testing.T) {
	var out bytes.Buffer
	em := newEmitter(bufio.NewWriter(&out))
	for i := range 1000 {
		if i%10 == 0 {
			em.emitSync(Line{ID: uint64(i + 1)})
			if !bytes.Contains(out.Bytes(), fmt.Appendf(nil, `{"id":%d}`, i+1)) {
				t.Fatalf("line %d not written when emitSync returned", i+1)
			}
			continue
		}
		em.emit(Line{ID: uint64(i + 1)})
	}
	em.close()
	sc := bufio.NewScanner(&out)
	n := 0
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		n++
		if l.ID != uint64(n) {
			t.Fatalf("line %d has id %d", n, l.ID)
		}
	}
	if n != 1000 {
		t.Fatalf("%d lines", n)
	}
}
