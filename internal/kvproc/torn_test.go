package kvproc_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/kv"
)

// tornLongEnv, set to a duration (e.g. 60s), makes TestReadersWhileTableChanges
// run its load that long, restoring a replica again and again, instead of
// the few seconds CI runs.
const tornLongEnv = "KVPROC_TORN_LONG"

// tornValue is a value that says which write made it: the key, the
// writer's sequence number for the key, padding of a length drawn per
// write (so that records of several sizes are freed and reused), and a
// CRC of all that. A get that returns bytes no write wrote (a record read
// torn and accepted anyway, a record of another key) fails checkTorn.
func tornValue(rng *rand.Rand, key string, seq uint64, pad int) []byte {
	v := fmt.Appendf(nil, "%s|%d|%s", key, seq, strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN(pad+1)))
	return fmt.Appendf(v, "|%08x", crc32.ChecksumIEEE(v))
}

// checkTorn validates v as a value of key and returns its sequence number.
func checkTorn(key string, v []byte) (uint64, error) {
	i := strings.LastIndexByte(string(v), '|')
	if i < 0 || fmt.Sprintf("%08x", crc32.ChecksumIEEE(v[:i])) != string(v[i+1:]) {
		return 0, fmt.Errorf("get(%q) returned %q: no write wrote it (checksum)", key, v)
	}
	f := strings.SplitN(string(v[:i]), "|", 3)
	if len(f) != 3 || f[0] != key {
		return 0, fmt.Errorf("get(%q) returned %q: a value of another key", key, v)
	}
	return strconv.ParseUint(f[1], 10, 64)
}

// TestReadersWhileTableChanges hammers keys with one-sided gets, on real
// replica processes (one group of 3 on shm), while the table changes under
// them in every way a reader must survive: the index grows through
// generations (a client commits batches of new keys past two growths of
// the 1,024-bucket index), batches and puts of values of varying sizes
// rewrite a few hot keys (records freed and reused while gets read them),
// and a follower is killed and restarted after the log moved on, so that
// it restores a snapshot while stale-ok gets read it.
//
// Every value read must be one a write wrote for that key (a CRC embedded
// in the value), linearizable gets of a hot key must return its last
// acknowledged write or a later one, linearizable gets of a key acknowledged
// by a batch must find it, and a hot key's sequence never goes past what
// its writer issued. The simulator shows the same class of reads with
// ReadOverlap (kv's TestSimTorn), in virtual time; this test shows it with
// real concurrency, between processes.
func TestReadersWhileTableChanges(t *testing.T) {
	run := 1500 * time.Millisecond
	rounds := 1
	if s := os.Getenv(tornLongEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", tornLongEnv, s, err)
		}
		run, rounds = d, max(1, int(d/(5*time.Second)))
	}
	// 240 s: the fill past two growths is 21.6 k keys since the index
	// grows four times while small (31 s for the test at load ~48 without
	// the race detector).
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second+2*run)
	defer cancel()
	const nreaders = 3
	// A short log: a follower that misses 3 x 64 entries restores a
	// snapshot.
	tu := testTuning
	tu.MaxLogEntries = 64
	c := newCluster(t, ctx, 1, 2+nreaders+1, tu)
	var cls []*client.Client
	defer func() {
		for _, cl := range cls {
			cl.Close()
		}
	}()
	open := func(k, near int) *client.Client {
		cl, err := c.openClient(ctx, k, client.WithNearReplica(near))
		if err != nil {
			t.Fatalf("open client %d: %v", k, err)
		}
		cls = append(cls, cl)
		return cl
	}
	filler, hotw := open(0, 0), open(1, 0)
	readers := make([]*client.Client, nreaders)
	for k := range readers {
		readers[k] = open(2+k, k)
	}

	var done atomic.Bool
	report, failures := collect(&done)
	const nhot = 8
	var acked, issued [nhot]atomic.Uint64 // hot keys' sequences
	var filled atomic.Int64               // keys f0.. acknowledged by the filler
	var gets, staleGets, batches atomic.Int64
	hot := func(i int) string { return fmt.Sprintf("h%d", i) }
	var wg sync.WaitGroup

	// The filler: batches of 64 new keys, past two growths of the index
	// (it grows at 75% of 1,024 x 7 slots, then at 75% of four times
	// that: kv.TableConfig.QuadGrowthLog), then on, slower, for the
	// restores' log.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 1))
		for n := 0; !done.Load(); {
			var b client.Batch
			for range 80 {
				k := fmt.Sprintf("f%d", n)
				b.Put([]byte(k), tornValue(rng, k, 1, 2))
				n++
			}
			if _, err := filler.Commit(ctx, &b); err != nil {
				report("filler batch: %v", err)
				return
			}
			filled.Store(int64(n))
			batches.Add(1)
		}
	})
	// The hot writer: puts and batches of 3 hot keys, each write of a key
	// with its next sequence number.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(2, 2))
		for !done.Load() {
			var b client.Batch
			var ks []int
			for range 1 + 2*rng.IntN(2) {
				i := rng.IntN(nhot)
				if !contains(ks, i) {
					ks = append(ks, i)
				}
			}
			var v []byte
			for _, i := range ks {
				v = tornValue(rng, hot(i), issued[i].Add(1), 300)
				b.Put([]byte(hot(i)), v)
			}
			var err error
			if len(ks) == 1 {
				_, err = hotw.Put(ctx, []byte(hot(ks[0])), v)
			} else {
				_, err = hotw.Commit(ctx, &b)
			}
			if err != nil {
				report("hot write: %v", err)
				return
			}
			for _, i := range ks {
				acked[i].Store(issued[i].Load())
			}
		}
	})
	var victimNode atomic.Uint64 // the replica restoring (0: none), for the count below
	var restoreGets atomic.Int64 // stale-ok gets it answered while it caught up or just after
	var restoreTotal int64
	reader := func(cl *client.Client, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 3))
		for i := 0; !done.Load(); i++ {
			if i%8 == 0 {
				// Leave the writers some of the machine's cores.
				time.Sleep(100 * time.Microsecond)
			}
			mode := client.Linearizable
			if rng.IntN(2) == 0 {
				mode = client.StaleOK
			}
			var key string
			var lo uint64
			hi := -1
			if n := filled.Load(); rng.IntN(2) == 0 && n > 0 {
				key = fmt.Sprintf("f%d", rng.Int64N(n))
			} else {
				hi = rng.IntN(nhot)
				key, lo = hot(hi), acked[hi].Load()
			}
			it, err := cl.GetItem(ctx, []byte(key), mode)
			if errors.Is(err, client.ErrNotFound) {
				if mode == client.Linearizable && (hi < 0 || lo > 0) {
					report("%v get(%q) found nothing, but a write of it was acknowledged before it began", mode, key)
				}
				continue
			}
			if err != nil {
				if ctx.Err() == nil && !done.Load() {
					report("%v get(%q): %v", mode, key, err)
				}
				return
			}
			gets.Add(1)
			if mode == client.StaleOK {
				staleGets.Add(1)
				if uint64(it.Replica) == victimNode.Load() {
					restoreGets.Add(1)
				}
			}
			seq, err := checkTorn(key, it.Value)
			if err != nil {
				report("%v %v", mode, err)
				continue
			}
			if hi >= 0 {
				if mode == client.Linearizable && seq < lo {
					report("linearizable get(%q) returned write %d, but write %d was acknowledged before it began", key, seq, lo)
				}
				if max := issued[hi].Load(); seq > max {
					report("%v get(%q) returned write %d, never issued (last %d)", mode, key, seq, max)
				}
			}
		}
	}
	for k, cl := range readers {
		wg.Go(func() { reader(cl, uint64(10+k)) })
	}

	// Two growths: 75% of 7,168 slots, then of 28,672 (four times the
	// buckets while the index is small: kv.DefaultQuadGrowthLog).
	grown := int64(kv.DefaultMaxLoad*float64(4*7<<kv.DefaultLogBuckets)) + 64
	for filled.Load() < grown && !done.Load() && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("+%v: %d keys filled (the index grew twice), %d batches, %d gets so far", c.since(), filled.Load(), batches.Load(), gets.Load())

	start := time.Now()
	end := start.Add(run)
	for round := 1; round <= rounds && !done.Load(); round++ {
		for time.Now().Before(start.Add(time.Duration(round-1)*run/time.Duration(rounds))) && !done.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		// Kill a follower, let the log move past it (the others keep
		// at most MaxLogEntries entries), restart it: it restores a
		// snapshot, while a stale-ok reader near it reads.
		l := c.leader(ctx, 0)
		v := (l + 1) % 3
		r := c.reps[0][v]
		s0 := c.status(r)
		p := r.p
		r.p = nil
		if err := p.Kill(); err != nil {
			t.Fatalf("kill replica %d: %v", v, err)
		}
		for !done.Load() {
			s := c.status(c.reps[0][l])
			if s == nil || s0 == nil || s.Delivered > s0.Delivered+uint64(3*tu.MaxLogEntries) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the log did not move on: %v", ctx.Err())
			}
			time.Sleep(2 * time.Millisecond)
		}
		var target uint64
		for _, o := range c.reps[0] {
			if s := c.status(o); s != nil {
				target = max(target, s.Delivered)
			}
		}
		r.cfg.Inc++
		r.cfg.Start = broadcast.StartExisting
		restoreGets.Store(0)
		victimNode.Store(uint64(c.m.Groups[0][v]))
		c.spawnAll([]*replica{r})
		// A reader near it, opened again whenever it was served by
		// another replica: a stale-ok reader moves on from a replica
		// whose read failed (it was down, its regions not registered
		// yet) and does not come back.
		rr := open(2+nreaders, v)
		rctx, rcancel := context.WithCancel(ctx)
		var rwg sync.WaitGroup
		rwg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(round), 4))
			reopened := time.Now()
			for rctx.Err() == nil && !done.Load() {
				if time.Since(reopened) > 5*time.Millisecond {
					rr.Close() // its node id is the new one's
					cl, err := c.openClient(rctx, 2+nreaders, client.WithNearReplica(v))
					if err != nil {
						if rctx.Err() == nil {
							report("reopen the reader near replica %d: %v", v, err)
						}
						rr = nil
						return
					}
					rr, reopened = cl, time.Now()
				}
				key := fmt.Sprintf("f%d", rng.Int64N(filled.Load()))
				it, err := rr.GetItem(rctx, []byte(key), client.StaleOK)
				if err != nil {
					if !errors.Is(err, client.ErrNotFound) && rctx.Err() == nil {
						report("stale-ok get(%q) near the restoring replica: %v", key, err)
					}
					continue
				}
				gets.Add(1)
				if uint64(it.Replica) == victimNode.Load() {
					restoreGets.Add(1)
					reopened = time.Now() // it reads the replica: keep it
				}
				if _, err := checkTorn(key, it.Value); err != nil {
					report("stale-ok near the restoring replica: %v", err)
				}
			}
		})
		s := c.waitCaughtUp(ctx, r, target, fmt.Sprintf("round %d", round))
		time.Sleep(50 * time.Millisecond)
		victimNode.Store(0)
		rcancel()
		rwg.Wait()
		if rr != nil {
			rr.Close()
		}
		cls = cls[:len(cls)-1] // rr, closed
		t.Logf("+%v round %d: replica %d restarted after the log moved %d entries on, caught up with %d snapshots restored; %d stale-ok gets read it while it caught up or in the 50 ms after",
			c.since(), round, v, target-s0.Delivered, s.SnapshotsRestored, restoreGets.Load())
		restoreTotal += restoreGets.Load()
		if s.SnapshotsRestored == 0 {
			t.Errorf("round %d: replica %d caught up without restoring a snapshot", round, v)
		}
	}
	for time.Now().Before(end) && !done.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	t.Logf("%d keys filled in %d batches; %d gets (%d stale-ok, %d of a replica catching up or just after)",
		filled.Load(), batches.Load(), gets.Load(), staleGets.Load(), restoreTotal)
	for _, b := range failures() {
		t.Error(b)
	}
	for _, cl := range cls {
		cl.Close()
	}
	cls = nil
	c.closeAll()
	c.checkNoFiles()
}

func contains(s []int, x int) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
