package ycsb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/magiconair/properties"
	goycsb "github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/rdma"
)

// startDB starts a local cluster of 2 groups x 3 replicas on the mem
// fabric and opens the binding on it.
func startDB(t *testing.T, p *properties.Properties) *DB {
	t.Helper()
	db, err := startDBMap(t, p, &cluster.Map{Name: "ycsb", Fabric: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// startOrderedDB is startDB on a map declaring the ordered keyspace
// "ordered", with rdmakv.keyspace=ordered.
func startOrderedDB(t *testing.T) *DB {
	t.Helper()
	p := properties.NewProperties()
	p.Set(PropKeyspace, "ordered")
	p.Set("fieldlength", "50") // the default records do not fit 4 KiB nodes
	db, err := startDBMap(t, p, orderedMap())
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func orderedMap() *cluster.Map {
	return &cluster.Map{Name: "ycsb", Fabric: "mem", Keyspaces: []cluster.Keyspace{{Name: "ordered", Kind: cluster.KindOrdered, ID: 1}}}
}

func startDBMap(t *testing.T, p *properties.Properties, m *cluster.Map) (*DB, error) {
	t.Helper()
	id := rdma.NodeID(1)
	for range 2 {
		m.Groups = append(m.Groups, []rdma.NodeID{id, id + 1, id + 2})
		id += 3
	}
	m.ClientNodes = []rdma.NodeID{100}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lc, err := localcluster.Start(ctx, m, broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Close)
	n, err := lc.ClientNode(0)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, p, client.WithMap(m), client.WithNode(n), client.WithSlot(0))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { db.Close() })
	return db, nil
}

func record(tag string, n int) map[string][]byte {
	m := map[string][]byte{}
	for i := range n {
		m[fmt.Sprintf("field%d", i)] = []byte(fmt.Sprintf("%s-%d", tag, i))
	}
	return m
}

func TestBindingOps(t *testing.T) {
	db := startDB(t, nil)
	ctx := context.Background()

	if _, err := db.Read(ctx, "usertable", "user1", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read of a missing record: %v, want ErrNotFound", err)
	}
	rec := record("v1", 10)
	if err := db.Insert(ctx, "usertable", "user1", rec); err != nil {
		t.Fatal(err)
	}
	got, err := db.Read(ctx, "usertable", "user1", nil)
	if err != nil || !equalFields(got, rec) {
		t.Fatalf("read after insert: %v %v, want %v", got, err, rec)
	}
	got, err = db.Read(ctx, "usertable", "user1", []string{"field3", "field7"})
	if want := map[string][]byte{"field3": rec["field3"], "field7": rec["field7"]}; err != nil || !equalFields(got, want) {
		t.Fatalf("read of 2 fields: %v %v, want %v", got, err, want)
	}
	// Tables are separate key spaces.
	if _, err := db.Read(ctx, "other", "user1", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read in another table: %v, want ErrNotFound", err)
	}

	// Update replaces the given fields and keeps the others.
	if err := db.Update(ctx, "usertable", "user1", map[string][]byte{"field2": []byte("new2"), "extra": []byte("x")}); err != nil {
		t.Fatal(err)
	}
	want := record("v1", 10)
	want["field2"], want["extra"] = []byte("new2"), []byte("x")
	if got, err := db.Read(ctx, "usertable", "user1", nil); err != nil || !equalFields(got, want) {
		t.Fatalf("read after update: %v %v, want %v", got, err, want)
	}
	if err := db.Update(ctx, "usertable", "nobody", map[string][]byte{"field0": []byte("x")}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("update of a missing record: %v, want ErrNotFound", err)
	}
	if _, err := db.Read(ctx, "usertable", "nobody", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the update of a missing record created it: %v", err)
	}

	// Insert replaces the record.
	if err := db.Insert(ctx, "usertable", "user1", map[string][]byte{"only": []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if got, err := db.Read(ctx, "usertable", "user1", nil); err != nil || len(got) != 1 || string(got["only"]) != "1" {
		t.Fatalf("read after a second insert: %v %v", got, err)
	}

	if err := db.Delete(ctx, "usertable", "user1"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Read(ctx, "usertable", "user1", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read after delete: %v, want ErrNotFound", err)
	}
	if err := db.Delete(ctx, "usertable", "user1"); err != nil {
		t.Fatalf("delete of a missing record: %v", err)
	}

	_, err = db.Scan(ctx, "usertable", "user0", 10, nil)
	if !errors.Is(err, ErrScanUnsupported) || !strings.Contains(err.Error(), PropKeyspace) {
		t.Fatalf("scan: %v, want ErrScanUnsupported naming %s", err, PropKeyspace)
	}

	// A value that is not a record is an error, not a panic.
	if _, err := db.Client().Put(ctx, Key("usertable", "junk"), []byte{9, 9}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Read(ctx, "usertable", "junk", nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("read of a malformed record: %v, want ErrMalformed", err)
	}
	if err := db.Update(ctx, "usertable", "junk", rec); !errors.Is(err, ErrMalformed) {
		t.Fatalf("update of a malformed record: %v, want ErrMalformed", err)
	}
}

func TestBindingBatches(t *testing.T) {
	db := startDB(t, nil)
	ctx := context.Background()
	var keys []string
	var recs []map[string][]byte
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("user%d", i))
		recs = append(recs, record(fmt.Sprint(i), 3))
	}
	// A small request limit forces the batch into several commits.
	db.maxRequest = 600
	if err := db.BatchInsert(ctx, "usertable", keys, recs); err != nil {
		t.Fatal(err)
	}
	got, err := db.BatchRead(ctx, "usertable", keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if !equalFields(got[i], recs[i]) {
			t.Fatalf("batch read %s: %v, want %v", keys[i], got[i], recs[i])
		}
	}
	ups := make([]map[string][]byte, len(keys))
	for i := range ups {
		ups[i] = map[string][]byte{"field1": []byte("up")}
	}
	if err := db.BatchUpdate(ctx, "usertable", keys, ups); err != nil {
		t.Fatal(err)
	}
	got, err = db.BatchRead(ctx, "usertable", keys, []string{"field0", "field1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if string(got[i]["field1"]) != "up" || !bytes.Equal(got[i]["field0"], recs[i]["field0"]) || len(got[i]) != 2 {
			t.Fatalf("after batch update, %s: %v", keys[i], got[i])
		}
	}
	db.maxBatch = 7
	if err := db.BatchDelete(ctx, "usertable", keys[:30]); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		_, err := db.Read(ctx, "usertable", k, nil)
		if deleted := i < 30; deleted != errors.Is(err, client.ErrNotFound) {
			t.Fatalf("%s after batch delete of the first 30: %v", k, err)
		}
	}
	if _, err := db.BatchRead(ctx, "usertable", keys, nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("batch read with missing records: %v, want ErrNotFound", err)
	}
}

// Concurrent updates of different fields of one record all land.
func TestConcurrentUpdatesKeepFields(t *testing.T) {
	db := startDB(t, nil)
	ctx := context.Background()
	if err := db.Insert(ctx, "t", "k", map[string][]byte{}); err != nil {
		t.Fatal(err)
	}
	const writers, rounds = 4, 10
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				f := fmt.Sprintf("w%d-%d", w, r)
				if err := db.Update(ctx, "t", "k", map[string][]byte{f: []byte(f)}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	got, err := db.Read(ctx, "t", "k", nil)
	if err != nil || len(got) != writers*rounds {
		t.Fatalf("after %d concurrent updates of distinct fields: %d fields, %v", writers*rounds, len(got), err)
	}
}

func TestConfig(t *testing.T) {
	cfg, err := ParseConfig(properties.NewProperties())
	if err != nil || cfg.Consistency != client.Linearizable || cfg.Timeout != DefaultTimeout || cfg.MapFile != client.DefaultMapFile || cfg.CombineHold != -1 {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
	p := properties.MustLoadString("rdmakv.map=/x/y.json\nrdmakv.consistency=stale-ok\nrdmakv.timeout=250ms\nrdmakv.combinehold=1\n")
	cfg, err = ParseConfig(p)
	if err != nil || cfg.Consistency != client.StaleOK || cfg.Timeout != 250*time.Millisecond || cfg.MapFile != "/x/y.json" || cfg.CombineHold != 1 {
		t.Fatalf("set: %+v %v", cfg, err)
	}
	for _, bad := range []string{"rdmakv.consistency=strong", "rdmakv.timeout=soon", "rdmakv.timeout=-1s", "rdmakv.combinehold=-1", "rdmakv.combinehold=x"} {
		if _, err := ParseConfig(properties.MustLoadString(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if goycsb.GetDBCreator(Name) == nil {
		t.Fatalf("%q is not registered with go-ycsb", Name)
	}
	// The registered creator reads rdmakv.map: a missing file is a clear error.
	_, err = goycsb.GetDBCreator(Name).Create(properties.MustLoadString("rdmakv.map=" + t.TempDir() + "/none.json"))
	if err == nil || !strings.Contains(err.Error(), "none.json") {
		t.Fatalf("create with a missing map file: %v", err)
	}
}

// Stale-ok reads work too (a lagging replica may miss the latest write, so
// only the first insert's record is checked, once it shows).
func TestStaleOKReads(t *testing.T) {
	db := startDB(t, properties.MustLoadString("rdmakv.consistency=stale-ok"))
	ctx := context.Background()
	rec := record("s", 4)
	if err := db.Insert(ctx, "usertable", "s1", rec); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := db.Read(ctx, "usertable", "s1", nil)
		if err == nil {
			if !equalFields(got, rec) {
				t.Fatalf("stale-ok read: %v, want %v", got, rec)
			}
			return
		}
		if !errors.Is(err, client.ErrNotFound) || time.Now().After(deadline) {
			t.Fatalf("stale-ok read: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

func equalFields(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, bytes.Equal)
}

// TestOrderedScan: with rdmakv.keyspace every op goes to the ordered
// keyspace, and Scan returns count records from startkey on, in key
// order, with the requested fields, never past the table's end.
func TestOrderedScan(t *testing.T) {
	db := startOrderedDB(t)
	ctx := context.Background()
	for _, table := range []string{"usertable", "usertablf", "other"} {
		for i := range 20 {
			if err := db.Insert(ctx, table, fmt.Sprintf("user%02d", i), record(fmt.Sprintf("%s-%d", table, i), 3)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The records are in the ordered keyspace, not the hashed one.
	if _, err := db.Client().Get(ctx, Key("usertable", "user00")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the hashed keyspace's get of a record: %v, want ErrNotFound", err)
	}
	got, err := db.Scan(ctx, "usertable", "user05", 5, nil)
	if err != nil || len(got) != 5 {
		t.Fatalf("scan of 5 from user05: %d records, %v", len(got), err)
	}
	for i, r := range got {
		if want := record(fmt.Sprintf("usertable-%d", 5+i), 3); !equalFields(r, want) {
			t.Fatalf("scan record %d: %v, want %v", i, r, want)
		}
	}
	// Near the table's end: the records left, none of the next table.
	got, err = db.Scan(ctx, "usertable", "user17", 10, []string{"field1"})
	if err != nil || len(got) != 3 {
		t.Fatalf("scan of 10 from user17: %d records, %v; want 3", len(got), err)
	}
	for i, r := range got {
		if want := map[string][]byte{"field1": []byte(fmt.Sprintf("usertable-%d-1", 17+i))}; !equalFields(r, want) {
			t.Fatalf("scan record %d with field1: %v, want %v", i, r, want)
		}
	}
	// A start key between records starts at the next one.
	got, err = db.Scan(ctx, "usertable", "user055", 1, nil)
	if err != nil || len(got) != 1 || string(got[0]["field0"]) != "usertable-6-0" {
		t.Fatalf("scan from user055: %v %v, want user06", got, err)
	}
	// Update merges fields; Delete removes; batches work one by one.
	if err := db.Update(ctx, "usertable", "user00", map[string][]byte{"field1": []byte("new")}); err != nil {
		t.Fatal(err)
	}
	r, err := db.Read(ctx, "usertable", "user00", nil)
	if want := map[string][]byte{"field0": []byte("usertable-0-0"), "field1": []byte("new"), "field2": []byte("usertable-0-2")}; err != nil || !equalFields(r, want) {
		t.Fatalf("read after update: %v %v, want %v", r, err, want)
	}
	if err := db.Update(ctx, "usertable", "nobody", map[string][]byte{"f": nil}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("update of a missing record: %v, want ErrNotFound", err)
	}
	if err := db.BatchDelete(ctx, "usertable", []string{"user01", "user02"}); err != nil {
		t.Fatal(err)
	}
	got, err = db.Scan(ctx, "usertable", "", 2, []string{"field0"})
	if err != nil || len(got) != 2 || string(got[1]["field0"]) != "usertable-3-0" {
		t.Fatalf("scan after deleting user01, user02: %v %v", got, err)
	}
}

// TestOrderedConcurrentUpdatesKeepFields: the read-then-swap Update of
// an ordered keyspace loses no concurrent update's field.
func TestOrderedConcurrentUpdatesKeepFields(t *testing.T) {
	db := startOrderedDB(t)
	ctx := context.Background()
	if err := db.Insert(ctx, "t", "k", map[string][]byte{}); err != nil {
		t.Fatal(err)
	}
	const writers, rounds = 4, 5
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				f := fmt.Sprintf("w%d-%d", w, r)
				if err := db.Update(ctx, "t", "k", map[string][]byte{f: []byte(f)}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	got, err := db.Read(ctx, "t", "k", nil)
	if err != nil || len(got) != writers*rounds {
		t.Fatalf("after %d concurrent updates of distinct fields: %d fields, %v", writers*rounds, len(got), err)
	}
}

func TestUnknownKeyspace(t *testing.T) {
	p := properties.NewProperties()
	p.Set(PropKeyspace, "nope")
	_, err := startDBMap(t, p, orderedMap())
	if !errors.Is(err, client.ErrUnknownKeyspace) || !strings.Contains(err.Error(), `"ordered"`) {
		t.Fatalf("open with rdmakv.keyspace=nope: %v, want ErrUnknownKeyspace naming \"ordered\"", err)
	}
}

// TestRecordTooLargeForKeyspace: YCSB's default records (1,081 bytes) do
// not fit the values of a keyspace of 4 KiB nodes; Open says so, and how
// long a field fits.
func TestRecordTooLargeForKeyspace(t *testing.T) {
	p := properties.NewProperties()
	p.Set(PropKeyspace, "ordered")
	_, err := startDBMap(t, p, orderedMap())
	if !errors.Is(err, ErrRecordTooLarge) || !strings.Contains(err.Error(), "fieldlength=") {
		t.Fatalf("open with default records on 4 KiB nodes: %v, want ErrRecordTooLarge naming a fieldlength", err)
	}
	var fits int
	fmt.Sscanf(err.Error()[strings.Index(err.Error(), "fieldlength=")+len("fieldlength="):], "%d", &fits)
	p.Set("fieldlength", fmt.Sprint(fits))
	db, err := startDBMap(t, p, orderedMap())
	if err != nil {
		t.Fatalf("open with the fieldlength the error gave (%d): %v", fits, err)
	}
	rec := map[string][]byte{}
	for i := range 10 {
		rec[fmt.Sprintf("field%d", i)] = bytes.Repeat([]byte{'x'}, fits)
	}
	if err := db.Insert(context.Background(), "usertable", "user1", rec); err != nil {
		t.Fatalf("insert of a record of 10 fields of %d bytes: %v", fits, err)
	}
}

// TestOrderedUpdateIsOneWrite: an Update of an ordered keyspace's record
// is one blind merge: no read of the record (the client's ordered gets do
// not move), the other fields kept; a missing record is ErrNotFound and
// is not created.
func TestOrderedUpdateIsOneWrite(t *testing.T) {
	db := startOrderedDB(t)
	ctx := context.Background()
	if err := db.Insert(ctx, "t", "k", map[string][]byte{"a": []byte("1"), "b": []byte("2")}); err != nil {
		t.Fatal(err)
	}
	before := db.Client().Stats()
	for i := range 5 {
		if err := db.Update(ctx, "t", "k", map[string][]byte{"b": []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	after := db.Client().Stats()
	if after.OrderedGets != before.OrderedGets {
		t.Fatalf("5 updates made %d ordered gets: an update reads the record", after.OrderedGets-before.OrderedGets)
	}
	got, err := db.Read(ctx, "t", "k", nil)
	if err != nil || string(got["a"]) != "1" || string(got["b"]) != "4" || len(got) != 2 {
		t.Fatalf("after the updates: %q %v", got, err)
	}
	if err := db.Update(ctx, "t", "missing", map[string][]byte{"a": []byte("x")}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("update of a missing record: %v, want ErrNotFound", err)
	}
	if _, err := db.Read(ctx, "t", "missing", nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the update created the missing record: %v", err)
	}
}

// TestThreadReads: reads through InitThread's contexts (each thread's own
// record decoders) return what DecodeSelected gives, from 8 threads at once
// over records of two field sets, with every field and with some named
// (run it with -race: a thread's decoders are its own); and such a read
// allocates at least a string per field less than one through a plain
// context.
func TestThreadReads(t *testing.T) {
	db := startDB(t, nil)
	ctx := context.Background()
	recs := map[string]map[string][]byte{"r1": record("one", 10), "r2": {"a": []byte("x"), "b": nil, "field3": []byte("y")}}
	for k, r := range recs {
		if err := db.Insert(ctx, "usertable", k, r); err != nil {
			t.Fatal(err)
		}
	}
	want := func(k string, fields []string) map[string][]byte {
		m, err := DecodeSelected(EncodeFields(recs[k]), fields)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for th := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tctx := db.InitThread(ctx, th, 8)
			defer db.CleanupThread(tctx)
			for i := range 100 {
				k := []string{"r1", "r2"}[(i+th)%2]
				fields := [][]string{nil, {"field3"}, {"b", "a"}}[(i/2+th)%3]
				got, err := db.Read(tctx, "usertable", k, fields)
				if err == nil && !equalFields(got, want(k, fields)) {
					err = fmt.Errorf("thread %d: read %d of %s (fields %q) = %q, want %q", th, i, k, fields, got, want(k, fields))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tctx := db.InitThread(ctx, 0, 1)
	read := func(c context.Context) float64 {
		return testing.AllocsPerRun(100, func() {
			if _, err := db.Read(c, "usertable", "r1", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
	plain, thread := read(ctx), read(tctx)
	if thread > plain-9 {
		t.Errorf("a read of 10 fields allocates %v objects through InitThread's context, %v through a plain one: want at least 9 fewer (the field names)", thread, plain)
	}
	t.Logf("allocations per read of 10 fields: %v through a plain context, %v through InitThread's", plain, thread)
}
