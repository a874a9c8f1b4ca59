package wal

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/internal/vfs"
)

// BenchmarkAppend: the poller's cost of appending a 128-byte record
// (copy into the batch, CRC) with async batching on an in-memory disk.
func BenchmarkAppend(b *testing.B) {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	w := mustOpen(b, d, mustRecover(b, mem), Config{Mode: Async, SegmentBytes: 64 << 20})
	p := make([]byte, 128)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	var now time.Duration
	for i := 0; b.Loop(); i++ {
		if _, ok := w.Append(RecEntry, p); !ok {
			drain(b, w, d, now)
			if _, ok := w.Append(RecEntry, p); !ok {
				b.Fatal(w.Err())
			}
		}
		if i%64 == 0 {
			now += 100 * time.Microsecond
			w.Poll(now)
			d.runAll()
		}
	}
}

// BenchmarkSync: one record (128 or 4000 bytes) appended, written and fdatasynced on
// a real file in the test's temp dir, one at a time (sync mode at one
// writer: the latency a put waits for), into preallocated blocks
// (zeroahead=0) or blocks zero-written ahead of the tail (Config.ZeroAhead
// 1 MiB, as the servers' logs; its zero writes go at the idle Polls after
// each sync, so a record sometimes waits for one). A batch of 128 bytes
// shares its block with the batches before and after, so only one in
// about twenty is the first write into a preallocated block (the one
// whose sync commits the extent's conversion); one of 4000 bytes nearly
// always is. put-p50-us and
// put-p99-us are per record, append to synced.
func BenchmarkSync(b *testing.B) {
	for _, size := range []int{128, 4000} {
		for _, za := range []int64{0, DefaultZeroAhead} {
			b.Run(fmt.Sprintf("record=%d/zeroahead=%d", size, za), func(b *testing.B) { benchSync(b, size, za) })
		}
	}
}

func benchSync(b *testing.B, size int, zeroAhead int64) {
	dir := filepath.Join(b.TempDir(), "wal")
	rec, err := Recover(vfs.OS, dir, 7)
	if err != nil {
		b.Fatal(err)
	}
	kick := make(chan struct{}, 1)
	dev := NewFileDevice(vfs.OS, func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	defer dev.Close()
	w, err := Open(dev, Config{Dir: dir, Member: 7, Mode: Sync, ZeroAhead: zeroAhead}, rec)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	p := make([]byte, size)
	var h hist.Hist
	for b.Loop() {
		t0 := time.Now()
		seq, ok := w.Append(RecEntry, p)
		if !ok {
			b.Fatal(w.Err())
		}
		pollUntil(b, w, kick, now, func() bool { return w.Synced() >= seq })
		h.Record(time.Since(t0))
	}
	st := w.Stats()
	b.ReportMetric(float64(st.FsyncLatency.Quantile(0.5).Microseconds()), "fsync-p50-us")
	b.ReportMetric(float64(h.Quantile(0.5).Microseconds()), "put-p50-us")
	b.ReportMetric(float64(h.Quantile(0.99).Microseconds()), "put-p99-us")
	b.ReportMetric(float64(st.ZeroWrites), "zero-writes")
}

// BenchmarkRecover: Recover of a log of 1 M records of 130 bytes (about
// 160 MB in three 64 MiB segments, the last one mostly preallocated
// zeros) from real files in the test's temp dir, in the page cache: the
// log part of a replica's restart (issue 19: 1 M records in 2 s).
func BenchmarkRecover(b *testing.B) {
	const records, size = 1_000_000, 130
	dir := filepath.Join(b.TempDir(), "wal")
	rec, err := Recover(vfs.OS, dir, 7)
	if err != nil {
		b.Fatal(err)
	}
	d := newTestDevice(vfs.OS)
	defer d.x.Close()
	w, err := Open(d, Config{Dir: dir, Member: 7, Mode: Async, MaxUnsyncedBytes: 4 << 20}, rec)
	if err != nil {
		b.Fatal(err)
	}
	p := make([]byte, size)
	for i := range records {
		p[i%size]++
		if _, ok := w.Append(RecEntry, p); !ok {
			w.Flush()
			drain(b, w, d, 0)
			if _, ok := w.Append(RecEntry, p); !ok {
				b.Fatal(w.Err())
			}
		}
	}
	w.Flush()
	drain(b, w, d, 0)
	if w.Err() != nil {
		b.Fatal(w.Err())
	}
	b.SetBytes(int64(w.Stats().BytesWritten))
	b.ResetTimer()
	for b.Loop() {
		rec, err := Recover(vfs.OS, dir, 7)
		if err != nil {
			b.Fatal(err)
		}
		if len(rec.Records) != records || rec.TornAt != nil || len(rec.Corrupt) > 0 {
			b.Fatalf("recovered %d records of %d (torn %v, corrupt %v)", len(rec.Records), records, rec.TornAt, rec.Corrupt)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/recover")
}
