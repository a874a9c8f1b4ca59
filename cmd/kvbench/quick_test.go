package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuickAndThreadsFlags: kv and btree share --quick's defaults (only
// for flags not given) and the --threads parsing (distinct counts, bad
// counts refused naming the command).
func TestQuickAndThreadsFlags(t *testing.T) {
	kv, err := parseKVFlags([]string{"--quick", "--runs", "3", "--threads", "1,4,1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if kv.records != 20000 || kv.duration != 200*time.Millisecond || kv.runs != 3 || kv.retries != 0 || !slices.Equal(kv.threads, []int{1, 4}) {
		t.Errorf("kv --quick --runs 3 --threads 1,4,1: records %d duration %v runs %d retries %d threads %v", kv.records, kv.duration, kv.runs, kv.retries, kv.threads)
	}
	bt, err := parseBTreeFlags([]string{"--quick", "--records", "500", "--threads", "2,8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if bt.records != 500 || bt.duration != 200*time.Millisecond || bt.runs != 1 || bt.retries != 0 || !slices.Equal(bt.threads, []int{2, 8}) {
		t.Errorf("btree --quick --records 500 --threads 2,8: records %d duration %v runs %d retries %d threads %v", bt.records, bt.duration, bt.runs, bt.retries, bt.threads)
	}
	for _, cmd := range []string{"kv", "btree"} {
		var err error
		if cmd == "kv" {
			_, err = parseKVFlags([]string{"--threads", "1,0"}, io.Discard)
		} else {
			_, err = parseBTreeFlags([]string{"--threads", "x"}, io.Discard)
		}
		if err == nil || !strings.HasPrefix(err.Error(), cmd+": --threads: bad goroutine count") {
			t.Errorf("%s with a bad --threads: %v", cmd, err)
		}
	}
}
