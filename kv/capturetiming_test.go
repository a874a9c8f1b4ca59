package kv

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// TestCaptureTiming prints (asserts nothing about time) how long the
// polling goroutine's part of a capture (Snapshot) takes on a table of
// KV_CAPTURE_TIMING records (16-byte keys, 100-byte values, on shm as a
// kvserver's): the first capture, then two after a release, without and
// with PrefaultSpare (its pre-faults done before the capture). Skipped
// unless KV_CAPTURE_TIMING is set: a measurement for issue 19's bound
// (no Poll over ET/20 while a snapshot is written), not a test.
func TestCaptureTiming(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KV_CAPTURE_TIMING"))
	if n <= 0 {
		t.Skip("set KV_CAPTURE_TIMING=records to measure")
	}
	for _, pre := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefault=%v", pre), func(t *testing.T) { captureTiming(t, n, pre) })
	}
}

func captureTiming(t *testing.T, n int, prefault bool) {
	n1, err := shm.Open(1, shm.Options{Dir: t.TempDir(), Cluster: fmt.Sprintf("kvcap%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	tb, err := NewTable(TableConfig{PrefaultSpare: prefault}, n1)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	val := make([]byte, 100)
	ops := make([]Op, 0, 28)
	var req []byte
	idx := uint64(0)
	for i := 0; i < n; {
		ops = ops[:0]
		for ; len(ops) < cap(ops) && i < n; i++ {
			k := make([]byte, 16)
			binary.LittleEndian.PutUint64(k, uint64(i))
			ops = append(ops, Op{Kind: OpPut, Key: k, Value: val})
		}
		req = AppendRequest(req[:0], ops)
		idx++
		tb.Apply(broadcast.Entry{Index: idx, Data: req})
	}
	tb.prefaultWG.Wait()
	st := tb.Stats()
	t.Logf("%d records, index %d MiB, migrating %v, %d spares pre-faulted", st.Records, st.IndexBytes>>20, st.Migrating, st.SparePrefaults)
	for i := range 3 {
		w := tb.SnapshotWork()
		var r0, r1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
		start := time.Now()
		c, err := tb.Snapshot()
		d := time.Since(start)
		syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("capture %d: %v on the poller (index copy %v, %d minor page faults in the process), fresh index copies so far %d",
			i+1, d, time.Duration(tb.SnapshotWork().Index-w.Index), r1.Minflt-r0.Minflt, tb.Stats().FreshIndexCopies)
		c.Release()
	}
}
