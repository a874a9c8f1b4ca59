package wal

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// BenchmarkRecoverMux: RecoverMux of a shared log of one group's three
// streams, each writing every entry (2.7 KB, about 29 puts of kvbench's
// async x64), 33 entries a batch, from real files in the page cache.
// "refs": the followers' records are the leader's payload (references);
// "whole": each differs in a byte (no references: the log before them).
func BenchmarkRecoverMux(b *testing.B) {
	for _, c := range []struct {
		name string
		same bool
	}{{"refs", true}, {"whole", false}} {
		b.Run(c.name, func(b *testing.B) {
			const entries, size, perBatch = 10_000, 2700, 33
			dir := filepath.Join(b.TempDir(), "wal")
			mr, err := RecoverMux(vfs.OS, dir, testMuxMember)
			if err != nil {
				b.Fatal(err)
			}
			d := newTestDevice(vfs.OS)
			defer d.x.Close()
			m, err := OpenMux(d, Config{Dir: dir, Member: testMuxMember, Mode: Async}, mr)
			if err != nil {
				b.Fatal(err)
			}
			ss := []*Stream{m.Stream(1, nil), m.Stream(2, nil), m.Stream(3, nil)}
			p := make([]byte, size)
			for i := range entries {
				p[i%size]++
				for k, s := range ss {
					q := p
					if !c.same {
						q = append([]byte(nil), p...)
						q[0] ^= byte(k)
					}
					if _, ok := s.Append(RecEntry, q); !ok {
						b.Fatal(s.Err())
					}
				}
				if i%perBatch == perBatch-1 {
					m.Flush()
					muxDrain(b, m, d, 0)
				}
			}
			m.Flush()
			muxDrain(b, m, d, 0)
			if m.w.Err() != nil {
				b.Fatal(m.w.Err())
			}
			logBytes := m.Stats().BytesWritten
			b.SetBytes(int64(logBytes))
			cpu0 := processCPU()
			b.ResetTimer()
			for b.Loop() {
				mr, err := RecoverMux(vfs.OS, dir, testMuxMember)
				if err != nil {
					b.Fatal(err)
				}
				if n := len(mr.Streams[3].Records); n != entries {
					b.Fatalf("stream 3: %d records of %d", n, entries)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/recover")
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/recover")
			b.ReportMetric(float64(logBytes)/entries, "logB/entry")
		})
	}
}

// processCPU is the process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
