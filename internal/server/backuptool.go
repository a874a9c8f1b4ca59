package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// Backup and restore, the tool's side (`kvserver backup`, `kvserver
// restore`; docs/operations.md "Backup and restore").

// ManifestName is the manifest's file name in a backup directory.
const ManifestName = "manifest.json"

// Manifest describes a backup directory: the cluster it was taken of and,
// per group, the file holding the group's state at the cut.
type Manifest struct {
	Format  int             `json:"format"` // 1
	Cluster string          `json:"cluster"`
	Fabric  string          `json:"fabric"`
	Backup  string          `json:"backup"` // the id, hex
	Created time.Time       `json:"created"`
	Members [][]rdma.NodeID `json:"members"` // each group's replicas
	// Slots is a checksum of the hash-slot map (which group owns which
	// key): a cluster restored from the backup must have the same.
	Slots  string          `json:"slots"`
	Groups []ManifestGroup `json:"groups"`
}

// ManifestGroup is one group's file: the cut's index in the group, the
// replica that wrote it, its size and its check word (the snapshot
// file's, hex).
type ManifestGroup struct {
	Group int         `json:"group"`
	File  string      `json:"file"`
	Index uint64      `json:"index"`
	Node  rdma.NodeID `json:"node"`
	Bytes int64       `json:"bytes"`
	Check string      `json:"check"`
}

const manifestFormat = 1

// slotsSum is Manifest.Slots for map m.
func slotsSum(m *cluster.Map) string {
	b := make([]byte, 4*len(m.Slots))
	for i, g := range m.Slots {
		binary.LittleEndian.PutUint32(b[4*i:], g)
	}
	return fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
}

// BackupOptions are Backup's.
type BackupOptions struct {
	Map *cluster.Map
	// Controls are, per group, the control ports to fetch the group's
	// file from, tried in order; every address listed is asked to remove
	// the replica-side files at the end.
	Controls [][]string
	// Secret is the cluster secret (proof of it goes with each request).
	Secret []byte
	// Client opens the client that sends the marker.
	Client []client.Option
	// Out is the backup directory: created, or empty.
	Out string
	// Timeout bounds the whole backup (default 10 minutes); replicas
	// applying the marker after it capture nothing.
	Timeout time.Duration
	// Progress, if set, gets a line per second while files download.
	Progress io.Writer
}

// Backup takes a backup of the cluster into o.Out: it multicasts a
// marker to every group, fetches each group's file from a replica's
// control port, checks it, and writes DIR/group-<g>.snap and
// DIR/manifest.json; then it asks every replica to remove its files. On
// failure it leaves nothing in o.Out (and removes o.Out if it made it).
func Backup(ctx context.Context, o BackupOptions) (_ *Manifest, err error) {
	m := o.Map
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if len(o.Controls) != len(m.Groups) {
		return nil, fmt.Errorf("control ports of %d groups for a cluster of %d", len(o.Controls), len(m.Groups))
	}
	made, err := emptyDir(o.Out)
	if err != nil {
		return nil, err
	}
	var written []string
	defer func() {
		if err != nil {
			for _, p := range written {
				os.Remove(p)
			}
			if made {
				os.Remove(o.Out)
			}
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var idb [8]byte
	rand.Read(idb[:])
	id := binary.LittleEndian.Uint64(idb[:]) | 1
	start := time.Now()
	hc := &http.Client{}
	var all []string
	seen := map[string]bool{}
	for _, cs := range o.Controls {
		for _, c := range cs {
			if c != "" && !seen[c] {
				seen[c] = true
				all = append(all, c)
			}
		}
	}
	defer func() {
		// The replica-side files go whatever happened (a replica that
		// applies the marker later writes none: DELETE remembers it).
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		for _, c := range all {
			req, _ := http.NewRequestWithContext(dctx, http.MethodDelete, fmt.Sprintf("http://%s/backup/%x", c, id), nil)
			authBackup(req, o.Secret, id)
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}()

	cl, err := client.Open(ctx, o.Client...)
	if err != nil {
		return nil, fmt.Errorf("open a client: %w", err)
	}
	idx, err := cl.BackupMarker(ctx, id, start.Add(o.Timeout))
	cl.Close()
	if err != nil {
		return nil, fmt.Errorf("the backup marker: %w", err)
	}
	man := &Manifest{Format: manifestFormat, Cluster: m.Name, Fabric: m.Fabric, Backup: fmt.Sprintf("%016x", id), Created: start.UTC(),
		Members: m.Groups, Slots: slotsSum(m)}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "backup %016x: the cut is at index %s\n", id, cutString(idx, len(m.Groups)))
	}
	for g := range m.Groups {
		name := fmt.Sprintf("group-%d.snap", g)
		path := filepath.Join(o.Out, name)
		written = append(written, path, path+".tmp")
		mg, err := fetchGroup(ctx, hc, o, id, g, idx[uint32(g)], path)
		if err != nil {
			return nil, fmt.Errorf("group %d: %w", g, err)
		}
		mg.File = name
		man.Groups = append(man.Groups, mg)
	}
	b, _ := json.MarshalIndent(man, "", "  ")
	mp := filepath.Join(o.Out, ManifestName)
	written = append(written, mp, mp+".tmp")
	if err := writeFileSync(mp, append(b, '\n')); err != nil {
		return nil, err
	}
	return man, nil
}

func cutString(idx map[uint32]uint64, n int) string {
	var s []string
	for g := range n {
		s = append(s, fmt.Sprintf("%d (group %d)", idx[uint32(g)], g))
	}
	return strings.Join(s, ", ")
}

// emptyDir makes dir, or checks that it is an empty directory.
func emptyDir(dir string) (made bool, err error) {
	if dir == "" {
		return false, errors.New("no backup directory (--out)")
	}
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return false, err
		}
		return true, nil
	case err != nil:
		return false, err
	case len(ents) > 0:
		return false, fmt.Errorf("%s is not empty: give a new or empty directory", dir)
	}
	return false, nil
}

func authBackup(req *http.Request, secret []byte, id uint64) {
	if len(secret) > 0 {
		req.Header.Set(ForceAuthHeader, BackupAuth(secret, id))
	}
}

// fetchGroup downloads group g's file of backup id into path (through
// path.tmp), from the first of o.Controls[g] that has it, and checks it:
// its check word, its index (the marker's, want), and that it is this
// backup's file of group g.
func fetchGroup(ctx context.Context, hc *http.Client, o BackupOptions, id uint64, g int, want uint64, path string) (ManifestGroup, error) {
	var why []string
	for {
		why = why[:0]
		for _, c := range o.Controls[g] {
			if c == "" {
				continue
			}
			mg, retry, err := fetchFrom(ctx, hc, o, c, id, g, want, path)
			if err == nil {
				return mg, nil
			}
			if !retry {
				return mg, err
			}
			why = append(why, fmt.Sprintf("%s: %v", c, err))
		}
		select {
		case <-ctx.Done():
			if len(why) == 0 {
				why = append(why, "no control port")
			}
			return ManifestGroup{}, fmt.Errorf("%w within the timeout (%s)", errNoBackup, strings.Join(why, "; "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fetchFrom tries one control port; retry says whether another (or a
// later try) may succeed.
func fetchFrom(ctx context.Context, hc *http.Client, o BackupOptions, control string, id uint64, g int, want uint64, path string) (mg ManifestGroup, retry bool, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/backup/%x?group=%d", control, id, g), nil)
	authBackup(req, o.Secret, id)
	resp, err := hc.Do(req)
	if err != nil {
		return mg, true, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		msg := strings.TrimSpace(string(b))
		return mg, resp.StatusCode != http.StatusForbidden, errors.New(msg)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return mg, false, err
	}
	pw := &progressWriter{w: f, out: o.Progress, total: resp.ContentLength, what: fmt.Sprintf("group %d from %s", g, control), last: time.Now()}
	_, err = io.Copy(pw, resp.Body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return mg, true, err
	}
	img, err := os.ReadFile(tmp)
	if err == nil {
		mg, err = checkBackupFile(img, o.Map.Name, id, g, want)
	}
	if err != nil {
		os.Remove(tmp)
		return mg, true, fmt.Errorf("the file it sent: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return mg, false, err
	}
	mg.Bytes = int64(len(img))
	return mg, false, syncDir(filepath.Dir(path))
}

// checkBackupFile checks a backup file image: its checks, and that it is
// backup id's file of group g of cluster at index want (want 0: any).
func checkBackupFile(img []byte, cluster string, id uint64, g int, want uint64) (ManifestGroup, error) {
	ds, err := broadcast.DecodeSnapFile(img)
	if err != nil {
		return ManifestGroup{}, err
	}
	var meta BackupMeta
	if err := json.Unmarshal(ds.Meta, &meta); err != nil {
		return ManifestGroup{}, fmt.Errorf("not a backup file (%v)", err)
	}
	switch {
	case meta.Cluster != cluster || meta.Backup != id || meta.Group != g:
		return ManifestGroup{}, fmt.Errorf("it is backup %016x's file of group %d of cluster %q, not backup %016x's of group %d of %q", meta.Backup, meta.Group, meta.Cluster, id, g, cluster)
	case meta.Index != ds.Index || want != 0 && ds.Index != want:
		return ManifestGroup{}, fmt.Errorf("it holds index %d (meta %d), the marker's is %d", ds.Index, meta.Index, want)
	}
	return ManifestGroup{Group: g, Index: ds.Index, Node: meta.Node, Check: fmt.Sprintf("%016x", broadcast.SnapCheckWord(img))}, nil
}

// progressWriter writes through to w and prints a line a second.
type progressWriter struct {
	w     io.Writer
	out   io.Writer
	total int64
	n     int64
	what  string
	last  time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if p.out != nil && time.Since(p.last) >= time.Second {
		p.last = time.Now()
		fmt.Fprintf(p.out, "backup: %s: %d of %d MiB\n", p.what, p.n>>20, p.total>>20)
	}
	return n, err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// RestoreOptions are Restore's.
type RestoreOptions struct {
	// Config is the cluster's (kvserver --config): each replica's data
	// dir is the config's, and gets its identity file.
	Config *cluster.Config
	// Map, DataDir and Mode are an embedded cluster's instead (Config
	// nil): the replicas' dirs are DataDir/replica-<id> (UseDataDir).
	Map     *cluster.Map
	DataDir string
	Mode    broadcast.Durability
	From    string // the backup directory
	// Force moves a non-empty data directory aside (to
	// <dir>.before-restore-<time>) instead of refusing.
	Force bool
	// Out gets a line per replica written.
	Out io.Writer

	knobs restoreKnobs
}

// restoreKnobs are the planted bugs of the restore tests.
type restoreKnobs struct {
	// zeroHeader: the replicas' snapshots have the header (0,0) instead
	// of kv.BackupHeader's (0, index), as they had before: a member that
	// starts empty and rejoins looks as far along as the restored ones,
	// gets no snapshot, and follows with an empty table
	// (TestRestoreRejoins: ErrState in the rejoined member's reads).
	zeroHeader bool
}

// zeroHeaderImage is img (a disk snapshot file) with the header (0,0)
// (restoreKnobs.zeroHeader), and its file name.
func zeroHeaderImage(img []byte, created int64) (string, []byte, error) {
	ds, err := broadcast.DecodeSnapFile(img)
	if err != nil {
		return "", nil, err
	}
	return broadcast.SnapName(ds.Index, broadcast.MsgHdr{}), broadcast.EncodeSnapFile(ds.Index, broadcast.MsgHdr{}, ds.Member, created, ds.Meta, ds.State), nil
}

// Restore writes a backup into the data directories of every replica of
// o.Config, offline: each replica gets its group's state as its only
// disk snapshot (and an empty log), no stable state, and its identity:
// started, the replicas form a new cluster whose state is the backup's
// cut. It refuses, writing nothing, a backup of another shape (groups,
// replicas per group, hash-slot map), a file that fails its checks, a
// config in memory mode, and a data directory that is not empty (unless
// Force) or in use.
func Restore(o RestoreOptions) error {
	var m *cluster.Map
	var dirOf func(id rdma.NodeID) string
	mode := o.Mode
	if cfg := o.Config; cfg != nil {
		var err error
		if m, err = cfg.Map(); err != nil {
			return err
		}
		dc, err := DurableFor(cfg)
		if err != nil {
			return err
		}
		mode, dirOf = dc.Mode, func(id rdma.NodeID) string { return cfg.ReplicaDir(int64(id)) }
	} else {
		m = o.Map
		if err := m.Fill(); err != nil {
			return err
		}
		dirOf = func(id rdma.NodeID) string { return replicaDir(o.DataDir, id) }
	}
	if mode == broadcast.Memory {
		return errors.New("durability is memory: a replica in memory mode starts from nothing, not from a snapshot; set durability = \"sync\" (or \"async\") in the config to restore into it")
	}
	b, err := os.ReadFile(filepath.Join(o.From, ManifestName))
	if err != nil {
		return fmt.Errorf("%s is not a backup directory: %v", o.From, err)
	}
	var man Manifest
	if err := json.Unmarshal(b, &man); err != nil || man.Format != manifestFormat {
		return fmt.Errorf("%s: not an rdmakv backup manifest of format %d (%v)", filepath.Join(o.From, ManifestName), manifestFormat, err)
	}
	shape := func(groups [][]rdma.NodeID) string {
		n := 0
		if len(groups) > 0 {
			n = len(groups[0])
		}
		return fmt.Sprintf("%d groups x %d replicas", len(groups), n)
	}
	same := len(man.Members) == len(m.Groups) && len(man.Groups) == len(m.Groups)
	for g := 0; same && g < len(m.Groups); g++ {
		same = len(man.Members[g]) == len(m.Groups[g]) && man.Groups[g].Group == g
	}
	if !same {
		return fmt.Errorf("the backup is of cluster %q with %s, the config describes %s: restore into a cluster of the same shape", man.Cluster, shape(man.Members), shape(m.Groups))
	}
	if man.Slots != slotsSum(m) {
		return fmt.Errorf("the backup's hash-slot map (checksum %s) differs from the config's (%s): keys would land in other groups; restore into a cluster with the same slots", man.Slots, slotsSum(m))
	}
	var id uint64
	fmt.Sscanf(man.Backup, "%x", &id)
	// Every check first: nothing is written unless all pass.
	type replicaImage struct {
		id         int64
		dir, name  string
		img        []byte
		ident      identity
		aside      string
		group, idx int
	}
	var plan []replicaImage
	now := time.Now()
	for g := range m.Groups {
		mg := man.Groups[g]
		path := filepath.Join(o.From, filepath.Base(mg.File))
		img, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		got, err := checkBackupFile(img, man.Cluster, id, g, mg.Index)
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		if got.Check != mg.Check {
			return fmt.Errorf("%s: check word %s, the manifest says %s", path, got.Check, mg.Check)
		}
		ds, _ := broadcast.DecodeSnapFile(img)
		rc, err := m.ReplicaConfig(g, broadcast.Config{})
		if err != nil {
			return err
		}
		for i, node := range m.Groups[g] {
			name, rimg, err := kv.BackupImage(rc, uint64(node), now.UnixNano(), ds.Index, ds.State)
			if err == nil && o.knobs.zeroHeader {
				name, rimg, err = zeroHeaderImage(rimg, now.UnixNano()) // planted
			}
			if err != nil {
				return err
			}
			dir := dirOf(node)
			ri := replicaImage{id: int64(node), dir: dir, name: name, img: rimg, group: g, idx: i,
				ident: identity{Cluster: m.Name, Fabric: m.Fabric, Node: node, Group: g, Members: m.Groups[g]}}
			ents, err := os.ReadDir(dir)
			switch {
			case errors.Is(err, os.ErrNotExist):
			case err != nil:
				return err
			case len(ents) > 0:
				if holder := lockHolder(dir); holder != "" {
					return fmt.Errorf("replica %d runs (process %s holds %s): stop every replica before a restore", node, holder, filepath.Join(dir, "lock"))
				}
				if !o.Force {
					return fmt.Errorf("data dir %s of replica %d is not empty: restore writes only into empty data dirs (--force moves it aside)", dir, node)
				}
				ri.aside = fmt.Sprintf("%s.before-restore-%s", dir, now.UTC().Format("20060102T150405"))
			}
			plan = append(plan, ri)
		}
	}
	// An embedded cluster's shared log (UseDataDir: DataDir/wal) holds
	// every replica's records: replayed over the restored snapshots it
	// would undo the restore.
	var sharedAside, shared string
	if o.Config == nil {
		shared = filepath.Join(o.DataDir, "wal")
		if n, err := dirEntries(vfs.OS, shared); err != nil {
			return err
		} else if n > 0 {
			if !o.Force {
				return fmt.Errorf("the shared log %s is not empty: restore writes only into empty data dirs (--force moves it aside)", shared)
			}
			sharedAside = fmt.Sprintf("%s.before-restore-%s", shared, now.UTC().Format("20060102T150405"))
		}
	}
	if sharedAside != "" {
		if err := os.Rename(shared, sharedAside); err != nil {
			return err
		}
		if err := syncDir(o.DataDir); err != nil {
			return err
		}
		if o.Out != nil {
			fmt.Fprintf(o.Out, "moved %s aside to %s\n", shared, sharedAside)
		}
	}
	for _, ri := range plan {
		if ri.aside != "" {
			if err := os.Rename(ri.dir, ri.aside); err != nil {
				return err
			}
			if o.Out != nil {
				fmt.Fprintf(o.Out, "moved %s aside to %s\n", ri.dir, ri.aside)
			}
		}
		for _, d := range []string{ri.dir, filepath.Join(ri.dir, "snap"), filepath.Join(ri.dir, "wal")} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return err
			}
		}
		if err := writeFileSync(filepath.Join(ri.dir, "snap", ri.name), ri.img); err != nil {
			return err
		}
		if o.Config != nil {
			if err := checkIdentity(ri.dir, ri.ident); err != nil {
				return err
			}
		}
		if err := syncDir(ri.dir); err != nil {
			return err
		}
		if o.Out != nil {
			fmt.Fprintf(o.Out, "replica %d (group %d): %s at index %d\n", ri.id, ri.group, filepath.Join(ri.dir, "snap", ri.name), man.Groups[ri.group].Index)
		}
	}
	return nil
}

// lockHolder returns the process holding dir's lock ("" if none),
// without creating the lock file.
func lockHolder(dir string) string {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return ""
	}
	b, _ := os.ReadFile(path)
	if h := strings.TrimSpace(string(b)); h != "" {
		return h
	}
	return "unknown"
}
