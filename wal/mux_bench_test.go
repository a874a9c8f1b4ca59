package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// benchLogs is six streams' logs: six Writers or one Mux.
type benchLogs interface {
	append(i int, p []byte) uint64
	synced(i int) uint64
	poll(now time.Duration) bool
	err() error
	fsyncs() uint64
	close()
}

type sepLogs struct {
	ws   []*Writer
	devs []*FileDevice
}

func (l *sepLogs) append(i int, p []byte) uint64 {
	seq, ok := l.ws[i].Append(RecEntry, p)
	if !ok {
		panic(l.ws[i].Err())
	}
	return seq
}
func (l *sepLogs) synced(i int) uint64 { return l.ws[i].Synced() }
func (l *sepLogs) poll(now time.Duration) bool {
	p := false
	for _, w := range l.ws {
		p = w.Poll(now) || p
	}
	return p
}
func (l *sepLogs) err() error {
	for _, w := range l.ws {
		if w.Err() != nil {
			return w.Err()
		}
	}
	return nil
}
func (l *sepLogs) fsyncs() (n uint64) {
	for _, w := range l.ws {
		n += w.Stats().Fsyncs
	}
	return n
}
func (l *sepLogs) close() {
	for _, d := range l.devs {
		d.Close()
	}
}

type muxLogs struct {
	m   *Mux
	ss  []*Stream
	dev *FileDevice
}

func (l *muxLogs) append(i int, p []byte) uint64 {
	seq, ok := l.ss[i].Append(RecEntry, p)
	if !ok {
		panic(l.ss[i].Err())
	}
	return seq
}
func (l *muxLogs) synced(i int) uint64         { return l.ss[i].Synced() }
func (l *muxLogs) poll(now time.Duration) bool { return l.m.Poll(now) }
func (l *muxLogs) err() error                  { return l.ss[0].Err() }
func (l *muxLogs) fsyncs() uint64              { return l.m.Writer().Stats().Fsyncs }
func (l *muxLogs) close()                      { l.dev.Close() }

// cpuTime is the process's user and system CPU time so far (every
// goroutine's: the poller's and the devices').
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchDir is where the logs go: $WAL_BENCH_DIR (a disk to measure), else
// the test's temp dir.
func benchDir(b *testing.B) string {
	if d := os.Getenv("WAL_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "plog-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

const benchStreams = 6

func openBenchLogs(b *testing.B, mux bool, kick func()) benchLogs {
	dir := benchDir(b)
	cfg := Config{Mode: Sync, SegmentBytes: 8 << 20}
	if mux {
		cfg.Dir, cfg.Member = filepath.Join(dir, "wal"), MuxMember|1
		rec, err := RecoverMux(vfs.OS, cfg.Dir, cfg.Member)
		if err != nil {
			b.Fatal(err)
		}
		l := &muxLogs{dev: NewFileDevice(vfs.OS, kick)}
		if l.m, err = OpenMux(l.dev, cfg, rec); err != nil {
			b.Fatal(err)
		}
		for i := range benchStreams {
			l.ss = append(l.ss, l.m.Stream(uint32(i+1), nil))
		}
		return l
	}
	l := &sepLogs{}
	for i := range benchStreams {
		c := cfg
		c.Dir, c.Member = filepath.Join(dir, fmt.Sprintf("replica-%d", i+1), "wal"), uint64(i+1)
		rec, err := Recover(vfs.OS, c.Dir, c.Member)
		if err != nil {
			b.Fatal(err)
		}
		d := NewFileDevice(vfs.OS, kick)
		w, err := Open(d, c, rec)
		if err != nil {
			b.Fatal(err)
		}
		l.ws, l.devs = append(l.ws, w), append(l.devs, d)
	}
	return l
}

// BenchmarkSixStreamsSync: six streams (a process's six replicas) each
// keep depth 128-byte records appended and not yet synced in sync mode
// (depth 1: a sync put at one writer per replica, all at once; depth 8:
// more writers, group commit in each log), on real
// files: six Writers, each with its own device goroutine as each replica
// has today, or one Mux on one device. b.N counts records of all streams.
// fsyncs/record is the log's fdatasyncs (batches and new segments) per
// record; records/s the rate; cpu-us/record the process's CPU time (user
// and system, every goroutine) per record.
func BenchmarkSixStreamsSync(b *testing.B) {
	for _, depth := range []int{1, 8} {
		for _, mux := range []bool{false, true} {
			name := "separate"
			if mux {
				name = "mux"
			}
			b.Run(fmt.Sprintf("%s/depth=%d", name, depth), func(b *testing.B) { benchSixStreams(b, mux, depth) })
		}
	}
}

func benchSixStreams(b *testing.B, mux bool, depth int) {
	kick := make(chan struct{}, 1)
	l := openBenchLogs(b, mux, func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	defer l.close()
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	p := make([]byte, 128)
	out := make([][]uint64, benchStreams) // the seqs each stream waits for
	done, issued := 0, 0
	f0 := l.fsyncs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	t0 := time.Now()
	for done < b.N {
		for i := range out {
			k := 0
			for k < len(out[i]) && l.synced(i) >= out[i][k] {
				k++
			}
			out[i] = out[i][k:]
			done += k
			for len(out[i]) < depth && issued < b.N {
				out[i] = append(out[i], l.append(i, p))
				issued++
			}
		}
		if !l.poll(now()) {
			select {
			case <-kick:
			case <-time.After(time.Millisecond):
			}
		}
		if err := l.err(); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(t0)
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/record")
	b.ReportMetric(float64(l.fsyncs()-f0)/float64(b.N), "fsyncs/record")
	b.ReportMetric(float64(b.N)/el.Seconds(), "records/s")
}
