package shm

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// statFields is the reference parse of a stat line: the fields after the
// last ')' split on spaces (what procStat did before parseStat).
func statFields(b []byte) (state byte, start uint64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 || !isStateLetter(f[0][0]) {
		return 0, 0, false
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], start, true
}

func TestParseStat(t *testing.T) {
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip(err)
	}
	rest := " R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21\n"
	for _, line := range [][]byte{
		self,
		[]byte("12 (a) b) c)" + rest),
		[]byte("12 (sp ace)" + rest),
		[]byte("12 (x) S 1 2"),
		[]byte("12 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 99 20"),
		[]byte("no paren at all"),
		[]byte("12 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 9x9 20"),
	} {
		s1, st1, ok1 := parseStat(line)
		s2, st2, ok2 := statFields(line)
		if s1 != s2 || st1 != st2 || ok1 != ok2 {
			t.Errorf("parseStat(%q) = %q %d %v, the field split says %q %d %v", line, s1, st1, ok1, s2, st2, ok2)
		}
	}
	if s, st, ok := parseStat([]byte("12 (a) b) c)" + rest)); !ok || s != 'R' || st != 4242 {
		t.Errorf("parseStat with ')' in comm = %q %d %v, want R 4242 true", s, st, ok)
	}
}

// FuzzParseStat: parseStat (allocation-free, reading a file the kernel
// wrote) agrees with the plain field split wherever that one succeeds on
// a single-spaced line, and never panics.
func FuzzParseStat(f *testing.F) {
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 7 1 2"))
	f.Add([]byte("1 ((x)) Z"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s1, st1, ok1 := parseStat(b)
		if ok1 && st1 == 0 && s1 == 0 {
			t.Fatalf("ok with no state: %q", b)
		}
		// The field split folds runs of white space; compare only lines
		// whose fields are single-spaced and free of other white space.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || bytes.Contains(b[i:], []byte("  ")) || bytes.ContainsAny(b[i:], "\t\r\v\f\n") || (len(b) > i+1 && b[i+1] != ' ') {
			return
		}
		s2, st2, ok2 := statFields(b)
		if ok2 && (!ok1 || s1 != s2 || st1 != st2) {
			t.Fatalf("parseStat(%q) = %q %d %v, the field split says %q %d %v", b, s1, st1, ok1, s2, st2, ok2)
		}
	})
}

// TestProcWatch: a watch says alive while its process runs, dead once it
// is reaped, and dead for an identity whose start time is not the
// process's (a reused pid).
func TestProcWatch(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	pid := cmd.Process.Pid
	_, start, err := procStat(pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	id := procIdent(start<<pidBits | uint64(pid))
	w := newProcWatch(id)
	defer w.close()
	if w.fd < 0 {
		t.Fatal("the watch did not open the stat file")
	}
	if !w.alive() {
		t.Fatal("a running process counts as dead")
	}
	reused := newProcWatch(id + 1<<pidBits)
	defer reused.close()
	if reused.alive() {
		t.Fatal("the pid with another start time (a reused pid) counts as alive")
	}
	cmd.Process.Kill()
	cmd.Wait() // reaped: its stat file is gone for the open fd too
	if w.alive() {
		t.Fatal("a killed and reaped process counts as alive")
	}
	if id.alive() {
		t.Fatal("procIdent.alive disagrees: the reaped process counts as alive")
	}
}

// TestProcWatchAllocs: the periodic liveness check of a shm peer (on the
// Post path) allocates nothing. Skipped under -race, which allocates.
func TestProcWatchAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	self, err := selfIdent()
	if err != nil {
		t.Fatal(err)
	}
	w := newProcWatch(self)
	defer w.close()
	if n := testing.AllocsPerRun(100, func() {
		if !w.alive() {
			t.Fatal("own process counts as dead")
		}
	}); n != 0 {
		t.Fatalf("procWatch.alive allocates %v times per check", n)
	}
}
