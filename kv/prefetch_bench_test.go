package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma/shm"
	"golang.org/x/sys/unix"
)

// BenchmarkApplyBatch is a replica's apply of one batch entry of n puts
// to random existing keys of a table of 1 M records (16-byte keys,
// 100-byte values, on shm in /dev/shm as a kvserver's table is: 4 KiB
// pages), as multicast applies it: BeginBatch, one Apply per message,
// EndBatch. The messages are requests of one put (shape req) or multi
// requests of up to 4 puts (shape multi4, as the client's combining
// makes at 64 writers: ~3 puts a message). Mode plain applies as before
// prefetch.go; mode mlp first calls Prefetch for each message, as
// multicast does. The sub-benchmarks alternate plain and mlp in one run;
// compare medians over -count runs. ns/put is the figure, and cpu-ns/put
// the benchmark thread's CPU time per put (what the others' load on a
// shared machine does not add to, but for their use of the caches).
// KV_BENCH_RECORDS sets the records (e.g. 16384 for a table in cache);
// KV_BENCH_MLP_FIRST runs mlp before plain (to see the order's bias).
func BenchmarkApplyBatch(b *testing.B) {
	records := 1 << 20
	if v := os.Getenv("KV_BENCH_RECORDS"); v != "" {
		fmt.Sscan(v, &records)
	}
	tb, cleanup := bigTable(b, records)
	defer cleanup()
	for _, n := range []int{1, 8, 64} {
		for _, shape := range []int{1, 4} {
			if n == 1 && shape > 1 {
				continue
			}
			name := "req"
			if shape > 1 {
				name = fmt.Sprintf("multi%d", shape)
			}
			modes := []string{"plain", "mlp"}
			if os.Getenv("KV_BENCH_MLP_FIRST") != "" {
				modes[0], modes[1] = modes[1], modes[0]
			}
			for _, mode := range modes {
				b.Run(fmt.Sprintf("n=%d/%s/%s", n, name, mode), func(b *testing.B) {
					benchApplyBatch(b, tb, records, n, shape, mode == "mlp")
				})
			}
		}
	}
}

// bigTable is a table on shm filled with records keys (benchKey).
func bigTable(b *testing.B, records int) (*Table, func()) {
	n1, err := shm.Open(1, shm.Options{Cluster: fmt.Sprintf("kvmlp%d", os.Getpid())})
	if err != nil {
		b.Fatal(err)
	}
	tb, err := NewTable(TableConfig{}, n1)
	if err != nil {
		n1.Close()
		b.Fatal(err)
	}
	val := make([]byte, 100)
	ops := make([]Op, MaxMulti)
	keys := make([][]byte, MaxMulti)
	for i := range keys {
		keys[i] = make([]byte, 16)
	}
	var req []byte
	for i := 0; i < records; i += MaxMulti {
		for k := range ops {
			benchKey(keys[k], uint64(i+k))
			ops[k] = Op{Kind: OpPut, Key: keys[k], Value: val}
		}
		req = AppendMulti(req[:0], ops)
		tb.Apply(broadcast.Entry{Index: tb.applied + 1, Data: req})
	}
	if tb.Len() != records {
		b.Fatalf("%d records, want %d", tb.Len(), records)
	}
	tb.step()
	for tb.old != nil {
		tb.step()
	}
	return tb, func() { tb.Close(); n1.Close() }
}

func benchKey(k []byte, i uint64) {
	copy(k, "key-\x00\x00\x00\x00")
	binary.LittleEndian.PutUint64(k[8:], i)
}

func benchApplyBatch(b *testing.B, tb *Table, records, n, shape int, mlp bool) {
	tb.knobs.noPrefetch = !mlp
	defer func() { tb.knobs.noPrefetch = false }()
	rng := rand.New(rand.NewPCG(uint64(n), uint64(shape)))
	// The batch's messages, encoded once; each iteration writes fresh
	// random keys into them in place (keyAt: where each key's index is).
	val := make([]byte, 100)
	var msgs [][]byte
	var keyAt [][]int
	for m := 0; m < n; m += shape {
		k := min(shape, n-m)
		ops := make([]Op, k)
		for j := range ops {
			key := make([]byte, 16)
			benchKey(key, uint64(1<<40+m+j))
			ops[j] = Op{Kind: OpPut, Key: key, Value: val}
		}
		var req []byte
		if shape == 1 {
			req = AppendRequest(nil, ops)
		} else {
			req = AppendMulti(nil, ops)
		}
		var at []int
		for j := range ops {
			p := bytes.Index(req, ops[j].Key)
			if p < 0 {
				b.Fatal("key not found in its request")
			}
			at = append(at, p+8)
		}
		msgs, keyAt = append(msgs, req), append(keyAt, at)
	}
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	puts := 0
	for b.Loop() {
		for m, req := range msgs {
			for _, p := range keyAt[m] {
				binary.LittleEndian.PutUint64(req[p:], rng.Uint64N(uint64(records)))
			}
		}
		if mlp {
			for _, req := range msgs {
				tb.Prefetch(req)
			}
		}
		tb.BeginBatch()
		for _, req := range msgs {
			tb.Apply(broadcast.Entry{Index: tb.applied + 1, Data: req})
		}
		tb.EndBatch()
		puts += n
	}
	cpu := threadCPU() - cpu0
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(puts), "ns/put")
	b.ReportMetric(float64(cpu)/float64(puts), "cpu-ns/put")
	if tb.Len() != records {
		b.Fatalf("%d records after overwrites, want %d", tb.Len(), records)
	}
}

// threadCPU is the calling thread's CPU time in nanoseconds.
func threadCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}
