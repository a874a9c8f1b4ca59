package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/magiconair/properties"
	goycsb "github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/rdmakv/rdmakv/internal/redisproc"
)

// startRedis starts a redis-server for the test, or skips the test if
// there is none.
func startRedis(t *testing.T) *redisproc.Server {
	t.Helper()
	bin, err := redisproc.Find("redis-server")
	if err != nil {
		t.Skipf("redis-server is not installed (apt-get install -y redis-server): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := redisproc.Start(ctx, bin, redisproc.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// openRedisDB opens the go-ycsb DB registered as name on srv.
func openRedisDB(t *testing.T, name string, srv *redisproc.Server) goycsb.DB {
	t.Helper()
	p := properties.NewProperties()
	p.Set("redis.addr", srv.Addr)
	p.Set("threadcount", "2")
	db, err := goycsb.GetDBCreator(name).Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// rec is the record of key k: field0 names it, field1 is its version.
func rec(k string, version int) map[string][]byte {
	return map[string][]byte{"field0": []byte(k), "field1": []byte(fmt.Sprint(version))}
}

// keysOf is the field0 of each scanned record.
func keysOf(recs []map[string][]byte) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r["field0"]))
	}
	return out
}

// TestRedisSorted checks the redis-sorted DB's semantics against a real
// redis-server: the records are go-ycsb's redis binding's hashes, and
// scans follow the sorted-set index in key order.
func TestRedisSorted(t *testing.T) {
	srv := startRedis(t)
	db := openRedisDB(t, redisSortedName, srv)
	ctx := context.Background()
	const table = "usertable"
	var keys []string
	for i := range 20 {
		k := fmt.Sprintf("user%03d", i)
		keys = append(keys, k)
	}
	// Inserted out of order: the index orders them.
	for _, i := range []int{7, 3, 19, 0, 12, 5, 1, 18, 9, 2, 4, 6, 8, 10, 11, 13, 14, 15, 16, 17} {
		if err := db.Insert(ctx, table, keys[i], rec(keys[i], 0)); err != nil {
			t.Fatal(err)
		}
	}
	// A record of another table, whose key sorts among usertable's.
	if err := db.Insert(ctx, "other", "user0055", rec("other/user0055", 0)); err != nil {
		t.Fatal(err)
	}

	// Read: all fields, then one.
	got, err := db.Read(ctx, table, "user005", []string{"field0", "field1"})
	if err != nil || string(got["field0"]) != "user005" || string(got["field1"]) != "0" || len(got) != 2 {
		t.Fatalf("read user005: %q %v", got, err)
	}
	got, err = db.Read(ctx, table, "user005", []string{"field1"})
	if err != nil || len(got) != 1 || string(got["field1"]) != "0" {
		t.Fatalf("read user005 field1: %q %v", got, err)
	}
	// Update: the given fields change, the others stay.
	if err := db.Update(ctx, table, "user005", map[string][]byte{"field1": []byte("1")}); err != nil {
		t.Fatal(err)
	}
	got, err = db.Read(ctx, table, "user005", []string{"field0", "field1"})
	if err != nil || string(got["field0"]) != "user005" || string(got["field1"]) != "1" {
		t.Fatalf("read user005 after the update: %q %v", got, err)
	}

	check := func(what, start string, count int, want []string) {
		t.Helper()
		if err := checkScan(ctx, db, table, start, count, want); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	scan := func(start string, count int, fields []string) []map[string][]byte {
		t.Helper()
		recs, err := db.Scan(ctx, table, start, count, fields)
		if err != nil {
			t.Fatalf("scan from %s, %d: %v", start, count, err)
		}
		return recs
	}
	for _, tc := range []struct {
		start string
		count int
		want  []string
	}{
		{"user000", 3, []string{"user000", "user001", "user002"}},
		{"user005", 3, []string{"user005", "user006", "user007"}},  // from a key in the middle
		{"user0055", 2, []string{"user006", "user007"}},            // from between two keys
		{"user017", 10, []string{"user017", "user018", "user019"}}, // more than the rest
		{"user", 1, []string{"user000"}},                           // before the first
		{"user020", 5, nil},                                        // past the last
		{"", 25, keys},                                             // all, not the other table's
		{"user019", 1, []string{"user019"}},                        // the last
		{"user010", 0, nil},                                        // none asked for
	} {
		check("before the deletes", tc.start, tc.count, tc.want)
	}
	// Scanned records carry the updated fields, and only the requested
	// ones when asked.
	recs := scan("user005", 1, nil)
	if len(recs) != 1 || string(recs[0]["field1"]) != "1" || len(recs[0]) != 2 {
		t.Errorf("scan of user005 after its update: %q", recs)
	}
	recs = scan("user005", 2, []string{"field1"})
	if len(recs) != 2 || len(recs[0]) != 1 || string(recs[0]["field1"]) != "1" || string(recs[1]["field1"]) != "0" {
		t.Errorf("scan of field1 from user005: %q", recs)
	}

	// Delete: gone from reads and from scans, which still return count
	// records when there are enough (the index forgets the key too).
	for _, k := range []string{"user006", "user007", "user019"} {
		if err := db.Delete(ctx, table, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Delete(ctx, table, "user999"); err != nil {
		t.Errorf("delete of a missing record: %v", err)
	}
	if got, err := db.Read(ctx, table, "user006", []string{"field0", "field1"}); !errors.Is(err, errRedisNotFound) {
		t.Errorf("read of deleted user006: %q %v, want errRedisNotFound", got, err)
	}
	for _, tc := range []struct {
		start string
		count int
		want  []string
	}{
		{"user005", 3, []string{"user005", "user008", "user009"}},
		{"user006", 2, []string{"user008", "user009"}},
		{"user017", 5, []string{"user017", "user018"}},
		{"user019", 5, nil},
	} {
		check("after the deletes", tc.start, tc.count, tc.want)
	}
	// A deleted key inserted again is scanned again.
	if err := db.Insert(ctx, table, "user007", rec("user007", 2)); err != nil {
		t.Fatal(err)
	}
	check("after user007's new insert", "user006", 2, []string{"user007", "user008"})

	// The index holds exactly the table's records, and the records are
	// go-ycsb's redis binding's hashes: it reads them the same.
	members, err := srv.Client.ZRange(ctx, redisIndexKey(table), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return k == "user006" || k == "user019" })
	if !slices.Equal(members, want) {
		t.Errorf("index %s: %q, want %q", redisIndexKey(table), members, want)
	}
	plain := openRedisDB(t, "redis", srv)
	got, err = plain.Read(ctx, table, "user005", []string{"field0", "field1"})
	if err != nil || string(got["field0"]) != "user005" || string(got["field1"]) != "1" {
		t.Errorf("go-ycsb's redis binding reads user005 as %q %v", got, err)
	}
	if typ, err := srv.Client.Type(ctx, table+"/user005").Result(); err != nil || typ != "hash" {
		t.Errorf("type of %s/user005: %q %v, want hash", table, typ, err)
	}
}

// checkScan checks that a scan of table from start for count records
// returns the records of keys want (whose field0 names them), in order.
func checkScan(ctx context.Context, db goycsb.DB, table, start string, count int, want []string) error {
	recs, err := db.Scan(ctx, table, start, count, nil)
	if err != nil {
		return fmt.Errorf("scan from %q, %d: %w", start, count, err)
	}
	if got := keysOf(recs); !slices.Equal(got, want) {
		return fmt.Errorf("scan from %q, %d: %q, want %q", start, count, got, want)
	}
	return nil
}

// TestRedisSortedPlanted: each planted bug of the index is caught by the
// scan checks of TestRedisSorted.
func TestRedisSortedPlanted(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		knobs redisSortedKnobs
	}{
		{"skipIndexAdd", redisSortedKnobs{skipIndexAdd: true}},
		{"skipIndexRem", redisSortedKnobs{skipIndexRem: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := srv.Client.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			db := openRedisDB(t, redisSortedName, srv).(*redisSorted)
			db.knobs = tc.knobs
			for i := range 6 {
				k := fmt.Sprintf("user%03d", i)
				if err := db.Insert(ctx, "usertable", k, rec(k, 0)); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Delete(ctx, "usertable", "user002"); err != nil {
				t.Fatal(err)
			}
			err := checkScan(ctx, db, "usertable", "user001", 3, []string{"user001", "user003", "user004"})
			if err == nil {
				t.Fatalf("planted %s: the scan check passed", tc.name)
			}
			t.Logf("planted %s caught: %v", tc.name, err)
			// The property that failed: inserted records missing from
			// the scan (skipIndexAdd), or fewer records than count
			// while more exist (skipIndexRem).
			recs, _ := db.Scan(ctx, "usertable", "user001", 3, nil)
			switch {
			case tc.knobs.skipIndexAdd && len(recs) != 0:
				t.Errorf("skipIndexAdd: the scan found %q in an index nothing was added to", keysOf(recs))
			case tc.knobs.skipIndexRem && !slices.Equal(keysOf(recs), []string{"user001", "user003"}):
				t.Errorf("skipIndexRem: scan %q, want 2 records (the deleted key's index entry taking the third place)", keysOf(recs))
			}
		})
	}
}

// TestRedisSortedRefuses: modes in which its transactions or records
// would not be what it says are refused when it opens.
func TestRedisSortedRefuses(t *testing.T) {
	for _, kv := range []string{"redis.mode=cluster", "redis.datatype=json"} {
		p := properties.NewProperties()
		k, v, _ := strings.Cut(kv, "=")
		p.Set(k, v)
		p.Set("threadcount", "1")
		if _, err := (redisSortedCreator{}).Create(p); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s: %v, want a refusal naming %s", kv, err, k)
		}
	}
}

// TestLoadRunRedisSorted: kvycsb loadrun e --db redis-sorted runs
// workload E on Redis, every scan and insert succeeding.
func TestLoadRunRedisSorted(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server)")
	}
	srv := startRedis(t)
	code, out, errOut := runBin(t, 60*time.Second, "loadrun", "e", "--db", redisSortedName, "-p", "redis.addr="+srv.Addr,
		"--records", "200", "--ops", "200", "--threads", "2")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"SCAN   - ", "INSERT - ", "[OVERALL] run e on redis-sorted: 200 operations", "2 threads, 0 errors"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "_ERROR") {
		t.Errorf("failed operations:\n%s", out)
	}
	// 200 loaded, the run's inserts added some: all in the index.
	n, err := srv.Client.ZCard(context.Background(), redisIndexKey("usertable")).Result()
	if err != nil || n < 200 {
		t.Errorf("index of %d members (%v), want at least the 200 loaded", n, err)
	}
}
