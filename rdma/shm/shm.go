// Package shm is the fabric for many processes on one host: regions are
// files in a shared-memory directory (default /dev/shm) mapped MAP_SHARED,
// and a remote write is the initiator's own store into its mapping of the
// target's region file, so the target's CPU takes no part: truly one-sided.
//
// # Files
//
// Each node of a cluster (Options.Dir + Options.Cluster) has a node file,
// rdmakv.<cluster>.<node>.node, holding the owner's process identity (pid
// and start time), a closed flag and the doorbell words; each region has a
// region file, rdmakv.<cluster>.<node>.<region>.region, a header with a
// per-peer grant table followed by the region's bytes. layout.go draws
// both. Files appear complete (they are built unnamed and then linked into
// place) and are removed on Close; Open removes files that dead processes of
// the same cluster left behind, and refuses a node id a live process holds.
//
// # Ops
//
// Connect maps the target's node file; a Conn maps each target region
// lazily on its first op to it (mappings are cached per Node, so steady
// state Post allocates nothing and makes no system call). Every op is
// applied inside Post and so completes at once, in order. Aligned 8-byte
// writes and reads and both atomics are single atomic instructions on the
// shared mapping, atomic across processes.
//
// Revocation is a handshake on the region header (see layout.go): the
// initiator announces the op in its peer slot's in-flight word, checks its
// grant, touches the data, and retracts; Revoke clears the grant and waits
// for in-flight to drain or for the writer's process to be gone, bounded by
// a timeout (ErrRevokeTimeout), so it never waits forever; after a timeout
// the ops then in flight may still land (a stopped, not dead, peer).
//
// SweepStale removes what dead processes left in a directory for every
// cluster, and whole directories made by MkdirOwned (sweep.go).
//
// # Liveness and doorbells
//
// A Conn checks the target's closed flag on every op and, at most every few
// milliseconds, whether the target's process is still the one that created
// the node file (kill(pid, 0) and the start time in /proc/<pid>/stat, so a
// reused pid does not pass); a dead target fails ops with rdma.ErrPeerDead.
//
// A node's doorbell is the seq word of its node file. A Notify write bumps
// it and calls FUTEX_WAKE only if a waiter is parked; Doorbell.Wait spins
// for Options.Spin, then announces itself parked, rechecks seq and sleeps in
// FUTEX_WAIT on the seq value, so no wake-up is lost. Waiter and ringer in
// one process also go through the futex. A poller that owns several nodes
// waits for all their words at once, in one FUTEX_WAITV (waitset.go,
// rdma.WaitSet). Every futex sleep hands the goroutine's P back on entry
// (as the runtime's own blocking calls do): goroutines parked in futex(2)
// would otherwise hold the process's Ps and starve its other goroutines.
package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// Errors specific to shm; op failures wrap the rdma sentinels.
var (
	// ErrNodeInUse is returned by Open when a live process already holds
	// the node id in the cluster.
	ErrNodeInUse = errors.New("shm: node id held by a live process")
	// ErrCorrupt is wrapped by errors about a file in the directory that
	// has an rdmakv name but is not a valid rdmakv file.
	ErrCorrupt = errors.New("shm: not a valid rdmakv file")
	// ErrRevokeTimeout is returned by Grant and Revoke when a live peer
	// process (stopped, or not scheduled) kept an op in flight on the
	// region for longer than the revoke timeout. The grant is cleared, but
	// the ops in flight then (at most one Post or PostList run per Conn of
	// the peer) may still land when that process runs again; a later
	// Revoke waits for them again (see Region.Revoke).
	ErrRevokeTimeout = errors.New("shm: peer op still in flight at revoke timeout")
)

// Options configure a node. Dir and Cluster together name the cluster:
// nodes opened with the same pair, in any process of the host, reach each
// other.
type Options struct {
	// Dir is the directory for node and region files; default "/dev/shm".
	// It should be a tmpfs, or every store reaches a disk eventually.
	Dir string
	// Cluster names the cluster, [A-Za-z0-9_-]{1,64}; required. It
	// prefixes every file name.
	Cluster string
	// Spin is the doorbell spin budget before parking; 0 means
	// rdma.DefaultSpin, negative means park at once.
	Spin time.Duration
	// PeerTimeout bounds how long a dead peer may go unnoticed by a Conn
	// that posts to it; default 2s. Revoke waits at most
	// max(2*PeerTimeout, 1s) for a live peer's op in flight.
	PeerTimeout time.Duration
	// QueueDepth bounds a Conn's unpolled completions; default
	// rdma.DefaultQueueDepth.
	QueueDepth int
	// HugeDir, if set, is a hugetlbfs mount for the files of large
	// regions (huge.go); every node of the cluster should name the same.
	// Without it, or when it is not hugetlbfs, regions get huge pages if
	// Dir is a tmpfs mounted with huge=within_size, always or advise.
	HugeDir string
}

func (o *Options) fill() error {
	if o.Dir == "" {
		o.Dir = "/dev/shm"
	}
	if !clusterRE.MatchString(o.Cluster) {
		return fmt.Errorf("shm: cluster name %q must match [A-Za-z0-9_-]{1,64}", o.Cluster)
	}
	switch {
	case o.Spin == 0:
		o.Spin = rdma.DefaultSpin
	case o.Spin < 0:
		o.Spin = 0
	}
	if o.PeerTimeout <= 0 {
		o.PeerTimeout = 2 * time.Second
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = rdma.DefaultQueueDepth
	}
	return nil
}

// checkInterval is how often a Conn checks its target's process.
func (o *Options) checkInterval() time.Duration { return min(o.PeerTimeout/2, 5*time.Millisecond) }

// revokeTimeout bounds Revoke's wait for a live peer's op in flight.
func (o *Options) revokeTimeout() time.Duration { return max(2*o.PeerTimeout, time.Second) }

// Node is one shm endpoint. It implements rdma.Node.
type Node struct {
	id   rdma.NodeID
	opts Options
	self procIdent
	path string // node file
	nf   []byte // node file mapping
	db   *doorbell
	huge HugePages // decided at Open; Reason grows under mu
	// hugeFellBack: a region could not get hugetlbfs pages (under mu).
	hugeFellBack bool

	mu      sync.Mutex
	regions map[rdma.RegionID]*Region
	conns   map[*Conn]struct{}
	peers   map[rdma.NodeID]*peer // current view of each connected target
	closed  bool
}

var _ rdma.Node = (*Node)(nil)

// Open creates node id of the cluster opts describe. It first removes files
// of the cluster left by dead processes; it fails with ErrNodeInUse if a live
// process holds id, and with an error wrapping ErrCorrupt if a foreign file
// sits at the node file's name.
func Open(id rdma.NodeID, opts Options) (*Node, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	self, err := selfIdent()
	if err != nil {
		return nil, err
	}
	dfd, err := unix.Open(opts.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open directory %s: %w", opts.Dir, err)
	}
	defer unix.Close(dfd)
	// The directory lock serialises Opens (cleanup and node file creation)
	// across processes; the kernel drops it if its holder dies.
	if err := unix.Flock(dfd, unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("shm: lock directory %s: %w", opts.Dir, err)
	}
	defer unix.Flock(dfd, unix.LOCK_UN)

	n := &Node{
		id:      id,
		opts:    opts,
		self:    self,
		path:    filepath.Join(opts.Dir, nodeFileName(opts.Cluster, id)),
		regions: make(map[rdma.RegionID]*Region),
		conns:   make(map[*Conn]struct{}),
		peers:   make(map[rdma.NodeID]*peer),
	}
	if err := removeStale(opts.Dir, opts.Cluster); err != nil {
		return nil, err
	}
	n.huge = probeHost(opts.HugeDir, opts.Dir)
	if n.huge.Mode == HugeTLBFS {
		// Files of dead processes that never got their link in Dir.
		if err := removeStale(opts.HugeDir, opts.Cluster); err != nil {
			return nil, err
		}
	}
	if h, closed, err := readNodeFile(n.path); err == nil && h.id != id {
		return nil, fmt.Errorf("shm: open node %d: %s is in the way: %w: it names node %d", id, n.path, ErrCorrupt, h.id)
	} else if err == nil {
		if !closed && h.owner.alive() {
			return nil, fmt.Errorf("shm: open node %d of cluster %q in %s: %w (%v)", id, opts.Cluster, opts.Dir, ErrNodeInUse, h.owner)
		}
		// Closed by a live process that has not removed it yet.
		if err := os.Remove(n.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("shm: remove old node file: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("shm: open node %d: %s is in the way: %w", id, n.path, err)
	}
	n.nf, err = createFile(opts.Dir, filepath.Base(n.path), nodeFileSize, false, func(b []byte) {
		encodeNodeHeader(b, nodeHeader{id: id, owner: self})
	})
	if err != nil {
		return nil, fmt.Errorf("shm: create node file for node %d: %w", id, err)
	}
	n.db = &doorbell{spin: opts.Spin, nf: n.nf}
	return n, nil
}

// removeStale removes the node and region files of cluster in dir whose
// owning process is gone. Files it cannot read or recognise are left alone:
// they are reported to whoever tries to use them.
func removeStale(dir, cluster string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("shm: read directory %s: %w", dir, err)
	}
	for _, e := range ents {
		_, isNode, isRegion := parseFileName(cluster, e.Name())
		if !isNode && !isRegion {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			if isRegion {
				if err := removeStaleLink(path); err != nil {
					return err
				}
			}
			continue
		}
		var owner procIdent
		if isNode {
			h, _, err := readNodeFile(path)
			if err != nil {
				continue
			}
			owner = h.owner
		} else {
			h, err := readRegionHeader(path)
			if err != nil {
				continue
			}
			owner = h.owner
		}
		if !owner.alive() {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("shm: remove stale file: %w", err)
			}
		}
	}
	return nil
}

// removeStaleLink removes a region file's link in Dir, and the file in
// HugeDir it points to, if the file's owner is dead or the file is gone.
func removeStaleLink(path string) error {
	target, err := os.Readlink(path)
	if err != nil {
		return nil
	}
	h, err := readRegionHeader(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil || h.owner.alive():
		return nil
	default:
		if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("shm: remove stale file: %w", err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shm: remove stale link: %w", err)
	}
	return nil
}

// readHead returns the first n bytes (fewer if the file is shorter) and
// the size of the regular file at path.
func readHead(path string, n int) ([]byte, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%w: %s is not a regular file", ErrCorrupt, path)
	}
	b := make([]byte, min(int64(n), st.Size()))
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, 0, fmt.Errorf("shm: read %s: %w", path, err)
	}
	return b, int(st.Size()), nil
}

// readNodeFile decodes the node file at path and reports its closed flag.
func readNodeFile(path string) (nodeHeader, bool, error) {
	b, size, err := readHead(path, nodeFileSize)
	if err != nil {
		return nodeHeader{}, false, err
	}
	if size != nodeFileSize {
		return nodeHeader{}, false, fmt.Errorf("%w: %s: size %d, want %d", ErrCorrupt, path, size, nodeFileSize)
	}
	h, err := decodeNodeHeader(b)
	if err != nil {
		return nodeHeader{}, false, fmt.Errorf("%s: %w", path, err)
	}
	return h, rdma.Load64(b, nodeClosedW) != 0, nil
}

// readRegionHeader decodes the header of the region file at path.
func readRegionHeader(path string) (regionHeader, error) {
	b, size, err := readHead(path, regionTableOff)
	if err != nil {
		return regionHeader{}, err
	}
	h, err := decodeRegionHeader(b, size)
	if err != nil {
		return regionHeader{}, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// createFile creates dir/name of size bytes, maps it shared, lets init fill
// it, and only then gives it its name, so no process sees it half-made. It
// fails with an error wrapping os.ErrExist if the name is taken. advise:
// the mapping is madvised for huge pages and populated through it.
func createFile(dir, name string, size int, advise bool, init func([]byte)) ([]byte, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	tmp := ""
	if err != nil { // no O_TMPFILE on this file system: a hidden temporary name
		tmp = filepath.Join(dir, fmt.Sprintf(".%s.%d.%d.tmp", name, os.Getpid(), time.Now().UnixNano()))
		fd, err = unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create file in %s: %w", dir, err)
		}
		defer unix.Unlink(tmp)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("size %s to %d bytes: %w", name, size, err)
	}
	// Reserve the pages now: on a full tmpfs a store into a sparse file's
	// hole raises SIGBUS, so fail here instead.
	reserve := func() error {
		if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil && err != unix.EOPNOTSUPP {
			return fmt.Errorf("reserve %d bytes for %s: %w", size, name, err)
		}
		return nil
	}
	if !advise {
		if err := reserve(); err != nil {
			return nil, err
		}
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", name, err)
	}
	if advise {
		populated, err := adviseHuge(b)
		if err == nil && !populated {
			err = reserve()
		} else if err != nil {
			err = fmt.Errorf("reserve %d bytes for %s: %w", size, name, err)
		}
		if err != nil {
			unix.Munmap(b)
			return nil, err
		}
	}
	init(b)
	final := filepath.Join(dir, name)
	if tmp == "" {
		err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, final, unix.AT_SYMLINK_FOLLOW)
	} else {
		err = unix.Link(tmp, final)
	}
	if err != nil {
		unix.Munmap(b)
		return nil, fmt.Errorf("link %s: %w", final, err)
	}
	return b, nil
}

// mapFile maps the whole file at path shared and read-write.
func mapFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < regionTableOff || st.Size > maxRegionLength+regionDataOff {
		return nil, fmt.Errorf("%w: %s: not a regular file of a plausible size (%d bytes)", ErrCorrupt, path, st.Size)
	}
	b, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	return b, nil
}

// ID implements rdma.Node.
func (n *Node) ID() rdma.NodeID { return n.id }

// Doorbell implements rdma.Node: the node file's seq word, rung by Notify
// writes from any process.
func (n *Node) Doorbell() rdma.Doorbell { return n.db }

// Register implements rdma.Node: it creates the region file, zeroed.
func (n *Node) Register(id rdma.RegionID, size int) (rdma.Region, error) {
	if size <= 0 || size > maxRegionLength {
		return nil, fmt.Errorf("shm: node %d region %d: size %d out of range (1..%d)", n.id, id, size, maxRegionLength)
	}
	size = rdma.Round8(size)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, rdma.ErrClosed
	}
	if _, ok := n.regions[id]; ok {
		return nil, fmt.Errorf("shm: node %d region %d: %w", n.id, id, rdma.ErrRegionExists)
	}
	name := regionFileName(n.opts.Cluster, n.id, id)
	path := filepath.Join(n.opts.Dir, name)
	h := regionHeader{size: size, node: n.id, region: id, owner: n.self, slots: regionSlots, dataOff: regionDataOff}
	b, target, err := n.createRegionFile(name, h)
	if errors.Is(err, os.ErrExist) {
		// Left by an earlier incarnation of this node that died after our
		// Open's cleanup, or closed without removing it: not ours, remove.
		if old, rerr := readRegionHeader(path); rerr == nil && old.owner.alive() && old.owner != n.self {
			return nil, fmt.Errorf("shm: node %d region %d: %s belongs to live %v", n.id, id, path, old.owner)
		}
		if t, lerr := os.Readlink(path); lerr == nil {
			os.Remove(t)
		}
		os.Remove(path)
		b, target, err = n.createRegionFile(name, h)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: node %d register region %d: %w", n.id, id, err)
	}
	r := &Region{node: n, id: id, path: path, target: target, file: b, data: b[regionDataOff:][:size:size]}
	n.regions[id] = r
	return r, nil
}

// createRegionFile creates the file of the region h describes under its
// name in Dir: in HugeDir with a link in Dir (target is the file's path
// there) when the node uses hugetlbfs and huge pages are free, else in
// Dir. Called with n.mu held.
func (n *Node) createRegionFile(name string, h regionHeader) (b []byte, target string, err error) {
	init := func(b []byte) { encodeRegionHeader(b, h) }
	plain := regionDataOff + int(h.size)
	if n.huge.Mode == HugeOff || int(h.size) < hugeMinRegion {
		b, err = createFile(n.opts.Dir, name, plain, false, init)
		return b, "", err
	}
	size := hugeFileSize(n.huge, int(h.size))
	if n.huge.Mode != HugeTLBFS {
		b, err = createFile(n.opts.Dir, name, size, n.huge.Mode == HugeMadvise, init)
		return b, "", err
	}
	path := filepath.Join(n.opts.Dir, name)
	target = filepath.Join(n.opts.HugeDir, name)
	b, err = createFile(n.opts.HugeDir, name, size, false, init)
	if err == nil {
		if err = os.Symlink(target, path); err != nil {
			unix.Munmap(b)
			os.Remove(target)
			return nil, "", err
		}
		return b, target, nil
	}
	if !n.hugeFellBack {
		n.hugeFellBack = true
		n.huge.Reason += fmt.Sprintf("; regions fell back to %s: %v", n.opts.Dir, err)
	}
	b, err = createFile(n.opts.Dir, name, plain, false, init)
	return b, "", err
}

// HugePages reports how the node's large regions are backed, and why
// (huge.go).
func (n *Node) HugePages() HugePages {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.huge
}

// Connect implements rdma.Node. It maps peer's node file; peer must be open
// (in any process) or Connect fails with rdma.ErrUnknownPeer, or with
// rdma.ErrPeerDead if its file was left by a dead or closed node.
func (n *Node) Connect(peerID rdma.NodeID) (rdma.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, rdma.ErrClosed
	}
	p := n.peers[peerID]
	if p != nil && !p.live() {
		delete(n.peers, peerID)
		p.release()
		p = nil
	}
	if p == nil {
		var err error
		if p, err = n.openPeer(peerID); err != nil {
			return nil, err
		}
		n.peers[peerID] = p
	}
	p.refs++
	c := &Conn{
		node:    n,
		peer:    p,
		cq:      rdma.NewCQ(n.opts.QueueDepth+1, nil), // +1: see Post
		regions: make(map[rdma.RegionID]*remoteRegion),
	}
	n.conns[c] = struct{}{}
	return c, nil
}

// openPeer maps the node file of id.
func (n *Node) openPeer(id rdma.NodeID) (*peer, error) {
	path := filepath.Join(n.opts.Dir, nodeFileName(n.opts.Cluster, id))
	nf, err := mapFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("shm: node %d of cluster %q: no node file in %s: %w", id, n.opts.Cluster, n.opts.Dir, rdma.ErrUnknownPeer)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: connect to node %d: %w", id, err)
	}
	h, err := decodeNodeHeader(nf)
	if err == nil && h.id != id {
		err = fmt.Errorf("%w: node file names node %d", ErrCorrupt, h.id)
	}
	if err != nil {
		unix.Munmap(nf)
		return nil, fmt.Errorf("shm: connect to node %d: %s: %w", id, path, err)
	}
	p := &peer{id: id, owner: h.owner, nf: nf, regions: make(map[rdma.RegionID]*remoteRegion), refs: 1}
	if !p.live() {
		p.release()
		return nil, fmt.Errorf("shm: connect to node %d: its node file is left by a closed node or dead %v: %w", id, h.owner, rdma.ErrPeerDead)
	}
	if h.owner != n.self {
		// A node of another process: its process's monitor, shared with
		// this process's other peers of nodes that process owns. (A node
		// of this very process lives as long as we do, and its closing
		// shows in its node file's closed flag: no /proc check.)
		p.mon = acquireMonitor(h.owner, n.opts.checkInterval())
	}
	return p, nil
}

// Close implements rdma.Node: it closes the node's connections and regions,
// marks the node closed for its peers, wakes its doorbell's waiters and
// removes its files.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns, regions := n.conns, n.regions
	n.conns, n.regions = nil, nil
	n.mu.Unlock()

	rdma.Store64(n.nf, nodeClosedW, 1)
	var errs []error
	for c := range conns {
		errs = append(errs, c.Close())
	}
	for _, r := range regions {
		errs = append(errs, r.Close())
	}
	n.mu.Lock()
	for id, p := range n.peers {
		delete(n.peers, id)
		p.release()
	}
	n.mu.Unlock()
	n.db.close()
	if err := os.Remove(n.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("shm: remove node file: %w", err))
	}
	errs = append(errs, unix.Munmap(n.nf))
	return errors.Join(errs...)
}
