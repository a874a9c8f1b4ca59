package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"
)

// commonFlags are the options every kvbench benchmark takes.
type commonFlags struct {
	duration time.Duration
	runs     int
	json     bool
	shmDir   string
	cpuProf  string
	maxOther float64
	retries  int
}

// flagSet returns the flag set of subcommand cmd, printing usage and then
// the flags' defaults on stderr, with the common flags registered into c.
// The help texts of --duration, --max-other and --cpuprofile say what they
// mean for this benchmark.
func (c *commonFlags) flagSet(cmd, usage string, stderr io.Writer, durationHelp, maxOtherHelp, cpuProfHelp string) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.DurationVar(&c.duration, "duration", time.Second, durationHelp)
	fs.IntVar(&c.runs, "runs", 3, "runs; every figure is the median over them")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per result line instead of a table")
	fs.StringVar(&c.shmDir, "shm-dir", "/dev/shm", "directory for shared-memory files (shm fabric, replicas, baselines): kvbench works in a kvbench-XXXX directory of its own there, removed when it ends or is interrupted, and first removes what dead processes left there (shm.SweepStale)")
	fs.StringVar(&c.cpuProf, "cpuprofile", "", cpuProfHelp)
	fs.Float64Var(&c.maxOther, "max-other", 0.25, maxOtherHelp)
	fs.IntVar(&c.retries, "retries", 2, "most repeats of one measurement because of background load")
	return fs
}

// check validates the common flags of subcommand cmd.
func (c *commonFlags) check(cmd string) error {
	switch {
	case c.duration <= 0:
		return fmt.Errorf("%s: --duration must be positive", cmd)
	case c.runs <= 0:
		return fmt.Errorf("%s: --runs must be positive", cmd)
	case c.retries < 0:
		return fmt.Errorf("%s: --retries must not be negative", cmd)
	}
	return nil
}

// quickDefaults applies --quick's smoke-test settings to the flags the
// command line did not set (set: the flags given): 20,000 records, 200 ms
// measurements, one run, no retries.
func (c *commonFlags) quickDefaults(set map[string]bool, records *int) {
	if !set["records"] {
		*records = 20000
	}
	if !set["duration"] {
		c.duration = 200 * time.Millisecond
	}
	if !set["runs"] {
		c.runs = 1
	}
	if !set["retries"] {
		c.retries = 0
	}
}

// parseThreads appends the distinct goroutine counts of list (comma
// separated) to threads.
func parseThreads(cmd, list string, threads []int) ([]int, error) {
	for _, s := range splitList(list) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: --threads: bad goroutine count %q", cmd, s)
		}
		if !slices.Contains(threads, n) {
			threads = append(threads, n)
		}
	}
	return threads, nil
}
