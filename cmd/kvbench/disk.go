package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/internal/hist"
)

const diskHelp = `usage: kvbench disk [--raw-fsync] [flags]

Measures the disk under --dir (default $TMPDIR) without rdmakv: the
latency of one small durable write, the figure issue 19's target for
puts at one goroutine in sync mode compares with ("within 1.5x a raw
fsync of one small write on the same disk"). It prints the file system
type of --dir (the statfs magic) and removes its file at the end.

Rows (--ops writes each, one at a time; p50, p99 and mean per write):
  write+fdatasync   pwrite of --size bytes at offset 0 of a file already
                    written, then fdatasync: the device's flush, no
                    metadata (the floor of any durable write)
  O_DSYNC           the same pwrite on a file opened O_DSYNC (the kernel
                    flushes within the write)
  append+fdatasync  pwrite of --size bytes at the next offset of a file
                    preallocated with fallocate, then fdatasync: what the
                    log (package wal) does per batch, where the first
                    write to a preallocated extent also commits its
                    conversion to written
  written+fdatasync pwrite of --size bytes at the next offset of a file
                    whose blocks were written with zeros and synced
                    beforehand, then fdatasync: the log's pattern in a
                    segment zero-written ahead of its tail (no extent to
                    convert, so no journal commit per fdatasync)
  reused+fdatasync  the same into a file that holds old data (written
                    and synced beforehand): a recycled segment

--rounds N runs every row N times in turn (each time --ops writes into a
fresh file), so that the rows share the same minutes of a loaded machine;
each row's figures are over all its rounds.

--json prints one object per row: row, fs, dir, size, ops, rounds,
p50_us, p99_us, mean_us, max_us.

`

// diskFlags are kvbench disk's options.
type diskFlags struct {
	rawFsync bool
	dir      string
	size     int
	ops      int
	json     bool
	quick    bool
	rounds   int
}

// diskRow is one row of kvbench disk.
type diskRow struct {
	Row    string  `json:"row"`
	FS     string  `json:"fs"`
	Dir    string  `json:"dir"`
	Size   int     `json:"size"`
	Ops    int     `json:"ops"`
	Rounds int     `json:"rounds"`
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	MeanUS float64 `json:"mean_us"`
	MaxUS  float64 `json:"max_us"`
}

func runDisk(args []string, stdout, stderr io.Writer) error {
	var o diskFlags
	fs := flag.NewFlagSet("disk", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, diskHelp)
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.rawFsync, "raw-fsync", true, "measure one small write + fdatasync, and O_DSYNC (the only measurement so far)")
	fs.StringVar(&o.dir, "dir", os.TempDir(), "the directory on the disk to measure (a file kvbench-disk-* is made there and removed)")
	fs.IntVar(&o.size, "size", 4096, "bytes per write")
	fs.IntVar(&o.ops, "ops", 1000, "writes per row")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per row instead of a table")
	fs.BoolVar(&o.quick, "quick", false, "a smoke test: 50 writes per row (unless --ops is given)")
	fs.IntVar(&o.rounds, "rounds", 1, "run the rows this many times in turn (figures over all rounds)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick && !set["ops"] {
		o.ops = 50
	}
	switch {
	case !o.rawFsync:
		return errors.New("nothing to measure (--raw-fsync=false)")
	case o.size <= 0 || o.ops <= 0 || o.rounds <= 0:
		return fmt.Errorf("--size %d --ops %d --rounds %d: want all positive", o.size, o.ops, o.rounds)
	}
	fsType, err := fsTypeOf(o.dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "kvbench disk: %d writes of %d B per row and round, %d rounds, in %s (%s); load average %s\n", o.ops, o.size, o.rounds, o.dir, fsType, loadAvg())
	meas := []struct {
		name string
		run  func(dir string, size, ops int, h *hist.Hist) error
	}{{"write+fdatasync", rawOverwrite(false)}, {"O_DSYNC", rawOverwrite(true)}, {"append+fdatasync", rawAppend(fillNone)},
		{"written+fdatasync", rawAppend(fillZeros)}, {"reused+fdatasync", rawAppend(fillOld)}}
	hs := make([]hist.Hist, len(meas))
	for range o.rounds {
		for i, m := range meas {
			if runCtx.Err() != nil {
				return errStopping
			}
			if err := m.run(o.dir, o.size, o.ops, &hs[i]); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
	}
	var rows []diskRow
	for i, m := range meas {
		h := &hs[i]
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		rows = append(rows, diskRow{Row: m.name, FS: fsType, Dir: o.dir, Size: o.size, Ops: o.ops, Rounds: o.rounds,
			P50US: us(h.Quantile(0.5)), P99US: us(h.Quantile(0.99)), MeanUS: us(h.Mean()), MaxUS: us(h.Max())})
	}
	return emitRows("disk", stdout, stderr, rows, o.json, func() { printDiskTable(stdout, rows, &o, fsType) }, nil)
}

func printDiskTable(w io.Writer, rows []diskRow, o *diskFlags, fsType string) {
	fmt.Fprintf(w, "kvbench disk --raw-fsync  %s  %s, %d CPUs, %s\n%s (%s), %d writes of %d B per row and round, %d rounds; load average %s\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.dir, fsType, o.ops, o.size, o.rounds, loadAvg())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tp50\tp99\tmean\tmax\t")
	for _, r := range rows {
		d := func(us float64) string { return fmtDur(time.Duration(us * 1e3)) }
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", r.Row, d(r.P50US), d(r.P99US), d(r.MeanUS), d(r.MaxUS))
	}
	tw.Flush()
}

// diskFile makes a file for a disk row in dir and returns it and a
// function that closes and removes it.
func diskFile(dir string, flags int) (*os.File, func(), error) {
	f, err := os.CreateTemp(dir, "kvbench-disk-")
	if err != nil {
		return nil, nil, err
	}
	name := f.Name()
	if flags != 0 {
		f.Close()
		if f, err = os.OpenFile(name, os.O_RDWR|flags, 0); err != nil {
			os.Remove(name)
			return nil, nil, err
		}
	}
	return f, func() { f.Close(); os.Remove(name) }, nil
}

// rawOverwrite measures pwrite at offset 0 of a written file, then
// fdatasync (dsync false), or on an O_DSYNC file (dsync true).
func rawOverwrite(dsync bool) func(dir string, size, ops int, h *hist.Hist) error {
	return func(dir string, size, ops int, h *hist.Hist) error {
		flags := 0
		if dsync {
			flags = unix.O_DSYNC
		}
		f, done, err := diskFile(dir, flags)
		if err != nil {
			return err
		}
		defer done()
		buf := make([]byte, size)
		// the block exists and is written before the first measurement
		if _, err := f.WriteAt(buf, 0); err != nil {
			return err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return err
		}
		for i := range ops {
			if runCtx.Err() != nil {
				return errStopping
			}
			buf[i%size]++
			t0 := time.Now()
			if _, err := f.WriteAt(buf, 0); err != nil {
				return err
			}
			if !dsync {
				if err := unix.Fdatasync(int(f.Fd())); err != nil {
					return err
				}
			}
			h.Record(time.Since(t0))
		}
		return nil
	}
}

// How rawAppend's file is made before its writes.
const (
	fillNone  = iota // preallocated (fallocate): unwritten extents
	fillZeros        // zeros written and synced
	fillOld          // old data written and synced (a file's earlier life)
)

// rawAppend measures pwrite at the next offset of a file made as fill
// says, then fdatasync.
func rawAppend(fill int) func(dir string, size, ops int, h *hist.Hist) error {
	return func(dir string, size, ops int, h *hist.Hist) error {
		f, done, err := diskFile(dir, 0)
		if err != nil {
			return err
		}
		defer done()
		total := int64(size) * int64(ops)
		switch fill {
		case fillNone:
			if err := unix.Fallocate(int(f.Fd()), 0, 0, total); err != nil {
				return fmt.Errorf("fallocate: %w", err)
			}
		default:
			chunk := make([]byte, 1<<20)
			if fill == fillOld {
				for i := range chunk {
					chunk[i] = byte(i*7 + 1)
				}
			}
			for off := int64(0); off < total; off += int64(len(chunk)) {
				if _, err := f.WriteAt(chunk[:min(int64(len(chunk)), total-off)], off); err != nil {
					return err
				}
			}
		}
		if err := unix.Fsync(int(f.Fd())); err != nil {
			return err
		}
		buf := make([]byte, size)
		for i := range ops {
			if runCtx.Err() != nil {
				return errStopping
			}
			buf[i%size]++
			t0 := time.Now()
			if _, err := f.WriteAt(buf, int64(i)*int64(size)); err != nil {
				return err
			}
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				return err
			}
			h.Record(time.Since(t0))
		}
		return nil
	}
}

// fsTypes names the statfs magics of the common Linux file systems.
var fsTypes = map[int64]string{
	0xEF53:     "ext4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0x794c7630: "overlayfs",
	0x2fc12fc1: "zfs",
	0xF2F52010: "f2fs",
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0x65735546: "fuse",
	0x858458f6: "ramfs",
}

// fsTypeOf is the file system type of dir: its name, or its statfs magic.
func fsTypeOf(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Clean(dir), &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	if name, ok := fsTypes[int64(st.Type)]; ok {
		return name, nil
	}
	return fmt.Sprintf("fs type %#x", st.Type), nil
}
