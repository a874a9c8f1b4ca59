package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/internal/procfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/fabrictest"
)

const testMounts = `sysfs /sys sysfs rw,nosuid 0 0
/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime,size=24684096k 0 0
tmpfs /mnt/huge\040shm tmpfs rw,relatime,size=65536k,huge=within_size 0 0
tmpfs /mnt/always tmpfs rw,relatime,huge=always 0 0
tmpfs /mnt/advise tmpfs rw,relatime,huge=advise 0 0
hugetlbfs /mnt/hugetlb hugetlbfs rw,relatime,pagesize=2M 0 0
hugetlbfs /mnt/giant hugetlbfs rw,relatime,pagesize=1024M 0 0
tmpfs /mnt/hidden tmpfs rw,huge=always 0 0
tmpfs /mnt/hidden tmpfs rw 0 0
`

// TestProbeHuge: the probe's decision and reason from /proc/mounts and
// shmem_enabled text.
func TestProbeHuge(t *testing.T) {
	const never = "always within_size advise [never] deny force\n"
	cases := []struct {
		hugeDir, dir, sysfs string
		mode                string
		pageSize            int
		reason              string // a part of the reason
	}{
		{"", "/dev/shm", never, HugeOff, 0, "tmpfs at /dev/shm mounted huge=never"},
		{"", "/dev/shm/sub/dir", never, HugeOff, 0, "huge=never"},
		{"", "/mnt/huge shm", never, HugeTmpfs, 2 << 20, "tmpfs at /mnt/huge shm mounted huge=within_size"},
		{"", "/mnt/huge shm/c", never, HugeTmpfs, 2 << 20, "huge=within_size"},
		{"", "/mnt/huge shmx", never, HugeOff, 0, "is on ext4, not tmpfs"},
		{"", "/mnt/always", never, HugeTmpfs, 2 << 20, "huge=always"},
		{"", "/mnt/advise", never, HugeMadvise, 2 << 20, "huge=advise"},
		{"", "/mnt/hidden", never, HugeOff, 0, "huge=never"}, // the later mount hides the first
		{"", "/dev/shm", "always within_size advise never deny [force]", HugeTmpfs, 2 << 20, "shmem_enabled=force"},
		{"", "/mnt/always", "always within_size advise never [deny] force", HugeOff, 0, "shmem_enabled=deny"},
		{"", "/mnt/always", "", HugeOff, 0, "no transparent huge pages"},
		{"", "/tmp", never, HugeOff, 0, "/tmp is on ext4, not tmpfs"},
		{"/mnt/hugetlb", "/dev/shm", never, HugeTLBFS, 2 << 20, "HugeDir /mnt/hugetlb is hugetlbfs (2048 KiB pages"},
		{"/mnt/giant", "/dev/shm", never, HugeTLBFS, 1 << 30, "1048576 KiB pages"},
		{"/mnt/hugetlb", "/dev/shm", "", HugeTLBFS, 2 << 20, "hugetlbfs"}, // no THP needed
		{"/mnt/advise", "/mnt/huge shm", never, HugeTmpfs, 2 << 20, "HugeDir /mnt/advise is tmpfs, not hugetlbfs; tmpfs at /mnt/huge shm"},
		{"/tmp/x", "/dev/shm", never, HugeOff, 0, "HugeDir /tmp/x is ext4, not hugetlbfs; tmpfs at /dev/shm mounted huge=never"},
	}
	for _, c := range cases {
		h := probeHuge(c.hugeDir, c.dir, testMounts, c.sysfs)
		if h.Mode != c.mode || h.PageSize != c.pageSize || !strings.Contains(h.Reason, c.reason) {
			t.Errorf("probeHuge(%q, %q, %q) = %+v, want mode %s page size %d, reason containing %q", c.hugeDir, c.dir, c.sysfs, h, c.mode, c.pageSize, c.reason)
		}
	}
	if _, ok := findMount("", "/x"); ok {
		t.Errorf("findMount in no mounts found one")
	}
	for in, want := range map[string]int{"2M": 2 << 20, "1G": 1 << 30, "4096": 4096, "64k": 64 << 10, "x": 0, "": 0} {
		if got := parseSize(in); got != want {
			t.Errorf("parseSize(%q) = %d, want %d", in, got, want)
		}
	}
	// The file size of a region: rounded only in a huge mode, and only
	// for large regions.
	on := HugePages{Mode: HugeTmpfs, PageSize: 2 << 20}
	for _, c := range []struct {
		h          HugePages
		size, want int
	}{
		{HugePages{Mode: HugeOff}, 8 << 20, regionDataOff + 8<<20},
		{on, 4096, regionDataOff + 4096},
		{on, 8 << 20, 10 << 20},
		{on, 2<<20 - regionDataOff, 2 << 20},
		{on, 1 << 20, 2 << 20},
	} {
		if got := hugeFileSize(c.h, c.size); got != c.want {
			t.Errorf("hugeFileSize(%s, %d) = %d, want %d", c.h.Mode, c.size, got, c.want)
		}
	}
}

// mountTmp mounts a file system of type fstype with data under a fresh
// temporary directory, or skips the test; the mount is undone and the
// directory removed when the test ends.
func mountTmp(t testing.TB, fstype, data string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rdmakv-huge-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("rdmakv-test", dir, fstype, 0, data); err != nil {
		os.Remove(dir)
		t.Skipf("cannot mount %s -o %s here (%v): needs root and a kernel that has it", fstype, data, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			unix.Unmount(dir, unix.MNT_DETACH)
		}
		os.Remove(dir)
	})
	return dir
}

// pmdMapped sums ShmemPmdMapped, FilePmdMapped and the hugetlb counters
// (kB) of this process's mappings of the file with inode ino, and counts
// the mappings.
func pmdMapped(t testing.TB, ino uint64) (kb, mappings int) {
	t.Helper()
	ms, err := procfs.Smaps("self")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Inode != ino {
			continue
		}
		mappings++
		kb += m.KB["ShmemPmdMapped"] + m.KB["FilePmdMapped"] + m.KB["Shared_Hugetlb"] + m.KB["Private_Hugetlb"]
	}
	return kb, mappings
}

// checkHugeRegion registers a region of size bytes on o's cluster, writes
// and reads it from a peer node (the last bytes included, and not one byte
// past them), and reports how many kB of both nodes' mappings of it are
// mapped with huge pages.
func checkHugeRegion(t *testing.T, o Options, size int) (hugeKB int, n1 *Node) {
	t.Helper()
	n1 = mustOpen(t, 1, o)
	n2 := mustOpen(t, 2, o)
	r := mustRegister(t, n1, 7, size, 2, rdma.PermReadWrite)
	c := mustConnect(t, n2, 1)
	defer c.Close()
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := 0; off < size; off += len(buf) {
		if _, err := rdma.Do(c, rdma.WR{Kind: rdma.OpWrite, Region: 7, Offset: uint64(off), Buf: buf}, rdma.DefaultOpTimeout); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	got := make([]byte, 8)
	if _, err := rdma.Do(c, rdma.WR{Kind: rdma.OpRead, Region: 7, Offset: uint64(size - 8), Buf: got}, rdma.DefaultOpTimeout); err != nil || got[7] != buf[len(buf)-1] {
		t.Fatalf("read of the last word: %v %v", got, err)
	}
	if _, err := rdma.Do(c, rdma.WR{Kind: rdma.OpRead, Region: 7, Offset: uint64(size - 4), Buf: got}, rdma.DefaultOpTimeout); !errors.Is(err, rdma.ErrBounds) {
		t.Fatalf("a read past the region's end (into the file's padding): %v, want ErrBounds", err)
	}
	if b := r.Bytes(); len(b) != size || b[size-1] != buf[len(buf)-1] {
		t.Fatalf("the owner's bytes: length %d (want %d), last %d", len(b), size, b[size-1])
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(o.Dir, regionFileName(o.Cluster, 1, 7)), &st); err != nil {
		t.Fatal(err)
	}
	kb, maps := pmdMapped(t, st.Ino)
	if maps != 2 {
		t.Fatalf("%d mappings of the region file, want 2 (owner and peer)", maps)
	}
	if want := int64(hugeFileSize(n1.HugePages(), size)); st.Size != want {
		t.Errorf("region file size %d, want %d", st.Size, want)
	}
	return kb, n1
}

// TestHugeTmpfsRegion: on a tmpfs mounted huge=within_size (and
// huge=advise, where the node madvises), a large region is on huge pages
// in the owner's mapping and in a peer's, and works as any region.
func TestHugeTmpfsRegion(t *testing.T) {
	for _, c := range []struct {
		huge, mode string
		size       int
	}{
		{"within_size", HugeTmpfs, 6<<20 + 4096},
		{"advise", HugeMadvise, 6<<20 + 4096},
		// A file of exactly 2 MiB: no padding, huge all the same.
		{"advise", HugeMadvise, 2<<20 - regionDataOff},
	} {
		t.Run(fmt.Sprintf("%s/%d", c.huge, c.size), func(t *testing.T) {
			dir := mountTmp(t, "tmpfs", "huge="+c.huge+",size=64m")
			o := Options{Dir: dir, Cluster: "huge"}
			kb, n1 := checkHugeRegion(t, o, c.size)
			if h := n1.HugePages(); h.Mode != c.mode {
				t.Fatalf("HugePages %v, want mode %s", h, c.mode)
			}
			if kb == 0 {
				sys, _ := os.ReadFile(shmemEnabledFile)
				t.Errorf("no huge page mapped for the region (shmem_enabled %q); smaps counted 0 kB PMD-mapped", strings.TrimSpace(string(sys)))
			}
			t.Logf("%s: %d kB of the owner's and peer's mappings PMD-mapped", n1.HugePages(), kb)
			// A small region is left alone.
			n1.Register(8, 4096)
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dir, regionFileName("huge", 1, 8)), &st); err != nil || st.Size != regionDataOff+4096 {
				t.Errorf("small region file: %d bytes (%v), want %d", st.Size, err, regionDataOff+4096)
			}
		})
	}
}

// TestHugeOffDevShm: on /dev/shm as this host mounts it the mode is what
// the probe of the real files says, and regions are not padded when off.
func TestHugeOffDevShm(t *testing.T) {
	o := newTestOptions(t)
	n := mustOpen(t, 1, o)
	h := n.HugePages()
	if h.Mode == "" || h.Reason == "" {
		t.Fatalf("HugePages %+v: no mode or reason", h)
	}
	t.Logf("/dev/shm: %v", h)
	if h.Mode == HugeOff {
		if _, err := n.Register(1, 4<<20); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(o.Dir, regionFileName(o.Cluster, 1, 1)))
		if err != nil || st.Size() != regionDataOff+4<<20 {
			t.Fatalf("region file size %v %v, want %d", st.Size(), err, regionDataOff+4<<20)
		}
	}
}

// TestHugeTLBFSFallback: with a HugeDir on hugetlbfs the mode is
// hugetlbfs; a region whose huge pages cannot be had (none reserved here,
// vm.nr_hugepages 0) falls back to Dir and says so, and one that gets them
// is a link in Dir to its file in HugeDir, both removed on Close.
func TestHugeTLBFSFallback(t *testing.T) {
	huge := mountTmp(t, "hugetlbfs", "pagesize=2M")
	o := newTestOptions(t)
	o.HugeDir = huge
	n1 := mustOpen(t, 1, o)
	if h := n1.HugePages(); h.Mode != HugeTLBFS {
		t.Fatalf("HugePages %v, want hugetlbfs", h)
	}
	n2 := mustOpen(t, 2, o)
	r := mustRegister(t, n1, 3, 4<<20, 2, rdma.PermReadWrite)
	c := mustConnect(t, n2, 1)
	defer c.Close()
	if _, err := rdma.Do(c, rdma.WR{Kind: rdma.OpWrite, Region: 3, Offset: 4<<20 - 8, Buf: make([]byte, 8)}, rdma.DefaultOpTimeout); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(o.Dir, regionFileName(o.Cluster, 1, 3))
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		t.Logf("hugetlbfs pages were free: %s -> %s", path, target)
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		if kb, maps := pmdMapped(t, st.Ino); kb == 0 || maps != 2 {
			t.Errorf("the region's hugetlbfs file: %d kB huge in %d mappings, want some in 2", kb, maps)
		}
		r.Close()
		if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close, %s: %v, want it removed", target, err)
		}
	} else {
		if h := n1.HugePages(); !strings.Contains(h.Reason, "fell back to "+o.Dir) {
			t.Errorf("HugePages %v: the reason does not say regions fell back", h)
		}
		t.Logf("no hugetlbfs pages: %v", n1.HugePages())
		r.Close()
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close, %s: %v, want it removed", path, err)
	}
	if ents, _ := os.ReadDir(huge); len(ents) != 0 {
		t.Errorf("HugeDir holds %d files after Close", len(ents))
	}
}

// TestHugeStaleLink: a region's link in Dir to a file elsewhere (a
// HugeDir) left by a dead process is removed with its file by the next
// Open, and so is a link whose file is gone; SweepStale does the same.
func TestHugeStaleLink(t *testing.T) {
	for _, sweep := range []bool{false, true} {
		t.Run(fmt.Sprintf("sweep=%v", sweep), func(t *testing.T) {
			o := newTestOptions(t)
			other := t.TempDir()
			self, err := selfIdent()
			if err != nil {
				t.Fatal(err)
			}
			deadIdent := self + 1<<pidBits // this pid, another start time: dead
			h := regionHeader{size: 4096, node: 5, region: 1, owner: deadIdent, slots: regionSlots, dataOff: regionDataOff}
			name := regionFileName(o.Cluster, 5, 1)
			b, err := createFile(other, name, regionDataOff+4096, false, func(b []byte) { encodeRegionHeader(b, h) })
			if err != nil {
				t.Fatal(err)
			}
			unix.Munmap(b)
			if err := os.Symlink(filepath.Join(other, name), filepath.Join(o.Dir, name)); err != nil {
				t.Fatal(err)
			}
			dangling := filepath.Join(o.Dir, regionFileName(o.Cluster, 5, 2))
			if err := os.Symlink(filepath.Join(other, "gone"), dangling); err != nil {
				t.Fatal(err)
			}
			if sweep {
				if _, err := SweepStale(o.Dir); err != nil {
					t.Fatal(err)
				}
			} else {
				mustOpen(t, 1, o)
			}
			for _, p := range []string{filepath.Join(o.Dir, name), filepath.Join(other, name), dangling} {
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: %v, want it removed", p, err)
				}
			}
		})
	}
}

// TestConformanceHugeTmpfs runs the conformance suite with the cluster's
// directory on a tmpfs mounted huge=within_size.
func TestConformanceHugeTmpfs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	h := harness
	h.Name = "shm-huge"
	h.NewCluster = func(t testing.TB, n int) string {
		dir := mountTmp(t, "tmpfs", "huge=within_size,size=512m")
		return filepath.Join(dir, fmt.Sprintf("c%d", n))
	}
	fabrictest.Run(t, h)
}
