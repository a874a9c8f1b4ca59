// Package backupcheck checks a backup's cut against the writes a test
// made while it was taken (docs/operations.md "Backup and restore"): it
// loads a cluster with batches spanning groups, records every
// acknowledged write with the index each group applied it at, and checks
// that the backup's indices cut no batch in two (the cut is consistent)
// and that a cluster restored from the backup holds exactly the writes
// at or below its group's index (the files hold the state at the cut).
package backupcheck

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// Write is one acknowledged put: its key's group, the index the group
// applied it at and the version it gave the key.
type Write struct {
	Key, Value string
	Group      int
	Index      uint64
	Version    uint64
}

// Recorder records the acknowledged batches of a load.
type Recorder struct {
	mu        sync.Mutex
	batches   [][]Write
	uncertain map[string]bool // keys of writes with an unknown outcome
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{uncertain: map[string]bool{}} }

// Batches counts the acknowledged batches.
func (r *Recorder) Batches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.batches)
}

// Load runs writers goroutines, each committing batches of one put per
// group, or of one put to one group, (keys k<g>-<0..keys-1> of each group, values unique) on c until
// ctx ends. A batch that fails makes its keys uncertain (left out of
// the checks).
func Load(ctx context.Context, c *client.Client, m *cluster.Map, r *Recorder, writers, keys int) {
	// keys per group, found by hashing names
	byGroup := make([][]string, len(m.Groups))
	for i := 0; slices.ContainsFunc(byGroup, func(ks []string) bool { return len(ks) < keys }); i++ {
		k := fmt.Sprintf("key%d", i)
		g := m.GroupOf([]byte(k))
		if len(byGroup[g]) < keys {
			byGroup[g] = append(byGroup[g], k)
		}
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for seq := 0; ctx.Err() == nil; seq++ {
				// Every other message goes to one group only, so that
				// the groups' indices differ and the cut check has
				// something to find.
				var b client.Batch
				var ws []Write
				one := -1
				if seq%2 == 1 {
					one = rng.IntN(len(byGroup))
				}
				for g := range byGroup {
					if one < 0 || g == one {
						ws = append(ws, Write{Key: byGroup[g][rng.IntN(keys)], Value: fmt.Sprintf("w%d-%d", w, seq), Group: g})
						b.Put([]byte(ws[len(ws)-1].Key), []byte(ws[len(ws)-1].Value))
					}
				}
				// ctx ends the load between batches, not during one (a
				// batch cut short would make its keys uncertain).
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				res, err := c.Commit(cctx, &b)
				cancel()
				r.mu.Lock()
				if err != nil {
					for _, x := range ws {
						r.uncertain[x.Key] = true
					}
				} else {
					for i := range ws {
						ws[i].Index, ws[i].Version = res.Groups[uint32(ws[i].Group)], res.Versions[i]
					}
					r.batches = append(r.batches, ws)
				}
				r.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// ErrCut and ErrState name the property a check found broken.
var (
	ErrCut   = errors.New("cut: a batch is below the cut in one group and above it in another")
	ErrState = errors.New("restored state: a key's value is not the last write at or below its group's cut")
)

// CheckCut checks that no acknowledged batch straddles cut (group ->
// index) and that the cut lies within the load (some batch on each side
// in every group, so that the check says something).
func (r *Recorder) CheckCut(cut map[int]uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	below, above := 0, 0
	for _, ws := range r.batches {
		in := 0
		for _, w := range ws {
			if w.Index <= cut[w.Group] {
				in++
			}
		}
		switch in {
		case 0:
			above++
		case len(ws):
			below++
		default:
			return fmt.Errorf("%w: %+v against cut %v", ErrCut, ws, cut)
		}
	}
	if below == 0 || above == 0 {
		return fmt.Errorf("the load did not span the backup: %d batches below the cut and %d above", below, above)
	}
	return nil
}

// Expected is what each key holds in a state at cut: the last write at
// or below its group's index (nil: absent), for every key written and not
// uncertain.
func (r *Recorder) Expected(cut map[int]uint64) map[string]*Write {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*Write{}
	for _, ws := range r.batches {
		for i := range ws {
			w := &ws[i]
			if r.uncertain[w.Key] {
				continue
			}
			cur, seen := out[w.Key]
			if !seen {
				out[w.Key] = nil
			}
			if w.Index <= cut[w.Group] && (cur == nil || cur.Index < w.Index) {
				out[w.Key] = w
			}
		}
	}
	return out
}

// Read reads a key: its value and version, found false if absent.
type Read func(key string) (value string, version uint64, found bool, err error)

// CheckState reads every key written (but those of uncertain writes) and
// checks it holds Expected(cut): returns an error wrapping ErrState
// naming the first key that does not, with how many do not.
func (r *Recorder) CheckState(cut map[int]uint64, read Read) error {
	exp := r.Expected(cut)
	keys := make([]string, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	bad, first := 0, ""
	for _, k := range keys {
		v, ver, found, err := read(k)
		if err != nil {
			return fmt.Errorf("read %s: %w", k, err)
		}
		w := exp[k]
		ok := w == nil && !found || w != nil && found && v == w.Value && ver == w.Version
		if !ok {
			bad++
			if first == "" {
				first = fmt.Sprintf("%s holds %q (version %d, found %v), want %+v", k, v, ver, found, w)
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d of %d keys, first %s (cut %v)", ErrState, bad, len(keys), first, cut)
	}
	return nil
}

// ClientRead is a Read through c (linearizable gets).
func ClientRead(ctx context.Context, c *client.Client) Read {
	return func(key string) (string, uint64, bool, error) {
		it, err := c.GetItem(ctx, []byte(key), client.Linearizable)
		if errors.Is(err, client.ErrNotFound) {
			return "", 0, false, nil
		}
		if err != nil {
			return "", 0, false, err
		}
		return string(it.Value), it.Version, true, nil
	}
}

// FileRead is a Read of the state backup files hold (each a disk
// snapshot file whose state is a kv table's snapshot, as `kvserver
// backup` writes DIR/group-<g>.snap): CheckState through it checks the
// files themselves, before any restore, so that a failure says whether
// the backup lacks a write or the restored cluster does.
func FileRead(paths ...string) (Read, error) {
	recs := map[string]record{}
	for _, path := range paths {
		img, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		ds, err := broadcast.DecodeSnapFile(img)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := tableRecords(ds.State, recs); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return func(key string) (string, uint64, bool, error) {
		r, ok := recs[key]
		return r.value, r.version, ok, nil
	}, nil
}

// record is a key's value and version in a table snapshot.
type record struct {
	value   string
	version uint64
}

// tableRecords adds the records of the kv table snapshot b (the bytes of
// Table.Snapshot's Persist: a 32-byte header whose second word counts
// the records that follow) to recs; a key already there is an error.
func tableRecords(b []byte, recs map[string]record) error {
	if len(b) < 32 {
		return fmt.Errorf("a table snapshot of %d bytes", len(b))
	}
	count, p := binary.LittleEndian.Uint64(b[8:]), 32
	for i := uint64(0); i < count; i++ {
		if p > len(b) {
			return fmt.Errorf("record %d of %d past the end", i, count)
		}
		ri, key, val, err := kv.DecodeRecord(b[p:])
		if err != nil {
			return fmt.Errorf("record %d of %d at byte %d: %w", i, count, p, err)
		}
		if _, dup := recs[string(key)]; dup {
			return fmt.Errorf("key %q held twice", key)
		}
		recs[string(key)] = record{string(val), ri.Version}
		p += ri.Size()
	}
	return nil
}

// ReplicaRead is a Read of the replicas in from only, through c, a client
// whose stale-ok gets read them first (client.WithNearReplica): a get
// that another replica served (one of from catching up answers
// ErrCatchingUp, and the get reads another) is made again until ctx
// ends.
func ReplicaRead(ctx context.Context, c *client.Client, from map[rdma.NodeID]bool) Read {
	return func(key string) (string, uint64, bool, error) {
		for {
			it, err := c.GetItem(ctx, []byte(key), client.StaleOK)
			if err != nil && !errors.Is(err, client.ErrNotFound) {
				return "", 0, false, err
			}
			if from[it.Replica] {
				return string(it.Value), it.Version, err == nil, nil
			}
			if ctx.Err() != nil {
				return "", 0, false, fmt.Errorf("no get of %s read replicas %v before the context ended (replica %d did): %w", key, slices.Sorted(maps.Keys(from)), it.Replica, ctx.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
