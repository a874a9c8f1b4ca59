package kv

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
)

// BenchmarkRestore restores a snapshot of 200 k records of 16+100 bytes
// into a fresh table, as a durable replica's restart from its disk
// snapshot does (issue 19): CPU time per record.
func BenchmarkRestore(b *testing.B) {
	const n, per = 200000, 25
	src, _ := soloTable(b, TableConfig{})
	src.replaying = true
	val := bytes.Repeat([]byte{'v'}, 100)
	for i := 0; i < n; i += per {
		ops := make([]Op, per)
		for k := range ops {
			ops[k] = Op{Kind: OpPut, Key: fmt.Appendf(nil, "key-%012d", i+k), Value: val}
		}
		src.Apply(broadcast.Entry{Index: uint64(i/per + 1), Data: AppendRequest(nil, ops)})
	}
	src.replaying = false
	snap := snapshotOf(b, src)
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		tb, _ := soloTable(b, TableConfig{})
		c0 := cpuTime()
		b.StartTimer()
		if err := tb.Restore(snap); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += cpuTime() - c0
		if tb.Len() != n {
			b.Fatalf("%d records, want %d", tb.Len(), n)
		}
		tb.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/rec")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/rec")
}
