package procfs

import (
	"strings"
	"testing"
	"unsafe"
)

const sample = `7f1c2a000000-7f1c2a600000 rw-s 00000000 00:1a 4242                       /dev/shm/rdmakv-a b
Size:               6144 kB
ShmemPmdMapped:     4096 kB
AnonHugePages:         0 kB
VmFlags: rd wr sh mr mw me ms sd
7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]
Size:                  4 kB
AnonHugePages:         0 kB
`

func TestParseSmaps(t *testing.T) {
	ms, err := ParseSmaps(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d mappings, want 2", len(ms))
	}
	m := ms[0]
	if m.Start != 0x7f1c2a000000 || m.End != 0x7f1c2a600000 || m.Inode != 4242 || m.Path != "/dev/shm/rdmakv-a b" {
		t.Errorf("first mapping %+v", m)
	}
	if m.KB["ShmemPmdMapped"] != 4096 || m.KB["Size"] != 6144 {
		t.Errorf("first mapping's counters %v", m.KB)
	}
	if _, ok := m.KB["VmFlags"]; ok {
		t.Errorf("VmFlags parsed as a counter")
	}
	if ms[1].Inode != 0 || ms[1].Path != "[stack]" || ms[1].KB["Size"] != 4 {
		t.Errorf("second mapping %+v", ms[1])
	}
	for _, bad := range []string{"Size: 4 kB\n", "zzz-1 rw-p 0 0 0\n", "1000-2000 rw-p\n"} {
		if _, err := ParseSmaps(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseSmaps(%q) accepted it", bad)
		}
	}
}

// TestSmapsSelf finds this process's own stack variable's mapping.
func TestSmapsSelf(t *testing.T) {
	ms, err := Smaps("self")
	if err != nil {
		t.Fatal(err)
	}
	x := new([1 << 16]byte)
	addr := uintptr(unsafe.Pointer(x))
	for _, m := range ms {
		if m.Start <= addr && addr < m.End {
			if m.KB["Size"] <= 0 {
				t.Errorf("mapping of the heap has Size %d kB", m.KB["Size"])
			}
			return
		}
	}
	t.Errorf("no mapping holds %#x among %d", addr, len(ms))
}
