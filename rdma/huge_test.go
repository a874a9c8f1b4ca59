package rdma

import (
	"testing"

	"github.com/rdmakv/rdmakv/internal/procfs"
)

// TestProbeAnonHuge: the decision from the texts of
// transparent_hugepage/enabled and defrag: huge pages only where a fault
// does not compact memory in the faulting thread.
func TestProbeAnonHuge(t *testing.T) {
	for _, c := range []struct{ enabled, defrag, mode string }{
		{"always [madvise] never\n", "always defer defer+madvise madvise [never]\n", "madvise"},
		{"[always] madvise never", "always [defer] defer+madvise madvise never", "madvise"},
		{"always [madvise] never", "always defer defer+madvise [madvise] never", "off"},
		{"always [madvise] never", "[always] defer defer+madvise madvise never", "off"},
		{"always [madvise] never", "always defer [defer+madvise] madvise never", "off"},
		{"always madvise [never]", "always defer defer+madvise madvise [never]", "off"},
		{"", "", "off"},
	} {
		h := probeAnonHuge(c.enabled, c.defrag)
		if h.Mode != c.mode || h.Reason == "" {
			t.Errorf("probeAnonHuge(%q, %q) = %+v, want mode %s and a reason", c.enabled, c.defrag, h, c.mode)
		}
	}
}

// anonHugeKB is AnonHugePages (kB) of the mapping of this process that
// starts at addr.
func anonHugeKB(t *testing.T, addr uintptr) (kb int, found bool) {
	ms, err := procfs.Smaps("self")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Start == addr {
			return m.KB["AnonHugePages"], true
		}
	}
	return 0, false
}

// TestAllocMemoryHuge: a large region is 2 MiB-aligned, zeroed, of the
// size asked, and (where the host allows transparent huge pages with
// madvise) backed by huge pages once touched; a small one is left alone.
func TestAllocMemoryHuge(t *testing.T) {
	const size = 4<<20 + 8
	b, err := AllocMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := FreeMemory(b); err != nil {
			t.Errorf("FreeMemory: %v", err)
		}
	})
	if len(b) != size {
		t.Fatalf("length %d, want %d", len(b), size)
	}
	h := AnonHugePages()
	t.Logf("%v", h)
	for i := range b {
		if b[i] != 0 {
			t.Fatalf("byte %d not zero", i)
		}
		b[i] = 1
	}
	addr := uintptr(unsafePointer(b))
	if h.Mode != "madvise" {
		t.Skipf("no transparent huge pages here: %v", h)
	}
	if addr%HugePageSize != 0 || cap(b) != 6<<20 {
		t.Fatalf("address %#x, capacity %d: want 2 MiB-aligned and 6 MiB", addr, cap(b))
	}
	kb, found := anonHugeKB(t, addr)
	if !found {
		t.Fatalf("no mapping at %#x in smaps", addr)
	}
	if kb == 0 {
		t.Errorf("AnonHugePages 0 kB for the region's mapping")
	}
	s, err := AllocMemory(4096)
	if err != nil {
		t.Fatal(err)
	}
	FreeMemory(s)
}
