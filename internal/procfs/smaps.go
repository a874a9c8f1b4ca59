// Package procfs reads the parts of /proc the tests and the server look
// at: the memory mappings of a process, with their counters.
package procfs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mapping is one mapping of /proc/PID/smaps: its address range, the
// inode of the file it maps (0 for anonymous memory), its path, and its
// counters in kB by name without the colon ("AnonHugePages",
// "ShmemPmdMapped", ...).
type Mapping struct {
	Start, End uintptr
	Inode      uint64
	Path       string
	KB         map[string]int
}

// Smaps returns the mappings of process pid ("self" for this one).
func Smaps(pid string) ([]Mapping, error) {
	f, err := os.Open("/proc/" + pid + "/smaps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseSmaps(f)
}

// ParseSmaps parses the text of an smaps file.
func ParseSmaps(r io.Reader) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if name, ok := strings.CutSuffix(fields[0], ":"); ok {
			if len(out) == 0 {
				return nil, fmt.Errorf("smaps: counter %q before the first mapping", name)
			}
			if len(fields) >= 2 {
				if v, err := strconv.Atoi(fields[1]); err == nil {
					out[len(out)-1].KB[name] = v
				}
			}
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok || len(fields) < 5 {
			return nil, fmt.Errorf("smaps: unexpected line %q", sc.Text())
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		ino, err3 := strconv.ParseUint(fields[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("smaps: unexpected mapping line %q", sc.Text())
		}
		m := Mapping{Start: uintptr(start), End: uintptr(end), Inode: ino, KB: map[string]int{}}
		if len(fields) >= 6 {
			m.Path = strings.Join(fields[5:], " ")
		}
		out = append(out, m)
	}
	return out, sc.Err()
}
