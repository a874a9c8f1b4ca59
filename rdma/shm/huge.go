package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// Huge pages. A get touches a few random places of a table of hundreds of
// megabytes: with 4 KiB pages most of them miss the TLB. Open decides once
// how the node's large regions get 2 MiB pages, in this order:
//
//  1. Options.HugeDir on hugetlbfs: large region files are created there
//     (with a symbolic link of the usual name in Dir, so peers find them
//     as always). A region whose huge pages cannot be reserved (none
//     free) falls back to Dir.
//  2. Dir on a tmpfs mounted huge=always or huge=within_size (or the
//     system-wide shmem_enabled=force): the kernel backs the files with
//     huge pages itself.
//  3. Dir on a tmpfs mounted huge=advise: each region's mapping is
//     madvise(MADV_HUGEPAGE)d and populated through it.
//  4. Otherwise off, with the reason (a tmpfs mounted huge=never, the
//     default for /dev/shm; shmem_enabled=deny; not a tmpfs).
//
// The system-wide /sys/kernel/mm/transparent_hugepage/shmem_enabled
// governs only the kernel's internal shmem mount (anonymous shared
// memory, memfd), not a tmpfs such as /dev/shm, except for its deny and
// force values; a tmpfs's own huge= mount option decides.
//
// In a huge mode, a region of at least hugeMinRegion bytes has its file
// rounded up to a multiple of the huge page size (the padding after the
// region's bytes is never read or written), so that its last page is huge
// too; smaller regions stay as they are.

// Huge page modes (HugePages.Mode).
const (
	HugeOff     = "off"
	HugeTLBFS   = "hugetlbfs"
	HugeTmpfs   = "tmpfs"
	HugeMadvise = "madvise"
)

// HugePages is how a node's large regions are backed, and why.
type HugePages = rdma.HugePages

const (
	hugePageSize = rdma.HugePageSize
	// hugeMinRegion is the smallest region (in bytes) put on huge pages.
	hugeMinRegion = 1 << 20
	// Where the probe reads.
	mountsFile       = "/proc/mounts"
	shmemEnabledFile = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
)

// mount is one line of /proc/mounts.
type mount struct {
	dir, fstype string
	opts        []string
}

// opt returns the value of mount option key ("" and false if absent).
func (m mount) opt(key string) (string, bool) {
	for _, o := range m.opts {
		if k, v, _ := strings.Cut(o, "="); k == key {
			return v, true
		}
	}
	return "", false
}

// unescapeMount undoes /proc/mounts' octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// findMount returns the mount that holds the absolute, symlink-free path
// in mounts (the text of /proc/mounts): the longest mount point that
// contains it, the last such line if one mount hides another.
func findMount(mounts, path string) (mount, bool) {
	var best mount
	found := false
	for line := range strings.Lines(mounts) {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		dir := unescapeMount(f[1])
		if !(path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")) {
			continue
		}
		if found && len(dir) < len(best.dir) {
			continue
		}
		best, found = mount{dir: dir, fstype: f[2], opts: strings.Split(f[3], ",")}, true
	}
	return best, found
}

// selected returns the bracketed choice of a sysfs multiple-choice file
// ("always within_size advise [never] deny force" -> "never"), "" if none.
func selected(sysfs string) string {
	_, rest, ok := strings.Cut(sysfs, "[")
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, "]")
	return v
}

// parseSize reads a hugetlbfs pagesize option ("2M", "1G", "2097152").
func parseSize(s string) int {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K") || strings.HasSuffix(s, "k"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "M") || strings.HasSuffix(s, "m"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "G") || strings.HasSuffix(s, "g"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0
	}
	return n * mult
}

// probeHuge decides a node's huge page mode from the text of /proc/mounts
// and of shmem_enabled ("" if the kernel has no such file). hugeDir and
// dir are absolute and free of symbolic links; hugeDir may be "".
func probeHuge(hugeDir, dir, mounts, shmemEnabled string) HugePages {
	var notes []string
	if hugeDir != "" {
		m, ok := findMount(mounts, hugeDir)
		switch {
		case !ok:
			notes = append(notes, fmt.Sprintf("HugeDir %s: no mount found", hugeDir))
		case m.fstype != "hugetlbfs":
			notes = append(notes, fmt.Sprintf("HugeDir %s is %s, not hugetlbfs", hugeDir, m.fstype))
		default:
			ps := hugePageSize
			if v, ok := m.opt("pagesize"); ok {
				if n := parseSize(v); n > 0 {
					ps = n
				}
			}
			return HugePages{Mode: HugeTLBFS, PageSize: ps,
				Reason: fmt.Sprintf("HugeDir %s is hugetlbfs (%d KiB pages, reserved with vm.nr_hugepages)", hugeDir, ps>>10)}
		}
	}
	off := func(why string) HugePages {
		return HugePages{Mode: HugeOff, Reason: strings.Join(append(notes, why), "; ")}
	}
	sys := selected(shmemEnabled)
	if sys == "" {
		return off("the kernel has no transparent huge pages for shared memory")
	}
	if sys == "deny" {
		return off("shmem_enabled=deny")
	}
	m, ok := findMount(mounts, dir)
	if !ok {
		return off(fmt.Sprintf("%s: no mount found", dir))
	}
	if m.fstype != "tmpfs" {
		return off(fmt.Sprintf("%s is on %s, not tmpfs", dir, m.fstype))
	}
	huge, ok := m.opt("huge")
	if !ok {
		huge = "never"
	}
	on := func(mode, why string) HugePages {
		return HugePages{Mode: mode, PageSize: hugePageSize, Reason: strings.Join(append(notes, why), "; ")}
	}
	switch {
	case sys == "force":
		return on(HugeTmpfs, "shmem_enabled=force")
	case huge == "always" || huge == "within_size":
		return on(HugeTmpfs, fmt.Sprintf("tmpfs at %s mounted huge=%s", m.dir, huge))
	case huge == "advise":
		return on(HugeMadvise, fmt.Sprintf("tmpfs at %s mounted huge=advise", m.dir))
	}
	return off(fmt.Sprintf("tmpfs at %s mounted huge=%s (mount a tmpfs with huge=within_size and use it as the shm directory; see docs/operations.md)", m.dir, huge))
}

// ProbeHugePages is the HugePages a node opened with this HugeDir and Dir
// decides on this host (before any region falls back).
func ProbeHugePages(hugeDir, dir string) HugePages { return probeHost(hugeDir, dir) }

// probeHost runs probeHuge on this host's files.
func probeHost(hugeDir, dir string) HugePages {
	abs := func(p string) string {
		if p == "" {
			return ""
		}
		if a, err := filepath.Abs(p); err == nil {
			p = a
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return p
	}
	mounts, _ := os.ReadFile(mountsFile)
	sys, _ := os.ReadFile(shmemEnabledFile)
	return probeHuge(abs(hugeDir), abs(dir), string(mounts), string(sys))
}

// hugeFileSize is the file size of a region of size bytes in mode h.
func hugeFileSize(h HugePages, size int) int {
	n := regionDataOff + size
	if h.Mode == HugeOff || size < hugeMinRegion {
		return n
	}
	return (n + h.PageSize - 1) / h.PageSize * h.PageSize
}

// adviseHuge asks for huge pages on a fresh shared mapping and populates
// it through the mapping (so the pages are allocated with the advice; a
// fallocate would allocate small ones). populated is false if the kernel
// cannot populate that way (before 5.14): the caller then fallocates.
func adviseHuge(b []byte) (populated bool, err error) {
	if err := unix.Madvise(b, unix.MADV_HUGEPAGE); err != nil {
		return false, nil // no THP in this kernel: small pages
	}
	switch err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err {
	case nil:
		return true, nil
	case unix.EINVAL:
		return false, nil
	default:
		return false, err
	}
}
