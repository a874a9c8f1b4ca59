package btree

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/cespare/xxhash/v2"
	tbtree "github.com/tidwall/btree"
	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// BenchmarkWarmLookup measures a warm lookup through a cache that holds
// every inner node, reading leaves from the arena (a copy of the node, as
// a one-sided read delivers it, then Decode and Find), for several node
// sizes, 100 k keys of 16 bytes and 100-byte values; and tidwall/btree's
// Get over the same keys in the same run, the in-process baseline.
func BenchmarkWarmLookup(b *testing.B) {
	const n = 100_000
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12))
	}
	val := make([]byte, 100)
	for _, size := range []int{1024, 4096, 16384} {
		cfg := Config{NodeSize: size, MaxKey: 64}
		a := NewArena(size, 1024, nil)
		tr, err := New(cfg, a, 1)
		if err != nil {
			b.Fatal(err)
		}
		for i, k := range keys {
			if _, err := tr.Put(k, val, uint64(i+2), uint64(i+2)); err != nil {
				b.Fatal(err)
			}
		}
		c := NewCache(64 << 20)
		buf := make([]byte, size)
		read := func(slot uint32) ([]byte, error) {
			copy(buf, a.Bytes(slot))
			return buf, nil
		}
		for _, k := range keys {
			c.Lookup(read, tr.Root(), k)
		}
		b.Run(fmt.Sprintf("node=%d", size), func(b *testing.B) {
			reads := 0
			for i := 0; b.Loop(); i++ {
				_, found, nr, err := c.Lookup(read, tr.Root(), keys[i%n])
				if err != nil || !found {
					b.Fatal(found, err)
				}
				reads += nr
			}
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
			st := tr.Stats()
			b.ReportMetric(st.LeafFill, "leaf-fill")
			b.ReportMetric(float64(c.Stats().Bytes)/float64(n*116), "cache/raw")
		})
	}
	var m tbtree.Map[string, []byte]
	for _, k := range keys {
		m.Set(string(k), val)
	}
	b.Run("tidwall", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, ok := m.Get(string(keys[i%n])); !ok {
				b.Fatal("missing")
			}
		}
	})
}

// BenchmarkRemoteLookup measures a warm lookup read one-sided: a tree of
// 100 k keys (16 bytes, 100-byte values, 4 KiB nodes) in registered
// memory on one node of the mem fabric, and a reader on another node
// whose cache holds every inner node, so that each lookup is one local
// search and one leaf read through btree.Remote (reads/op says so).
func BenchmarkRemoteLookup(b *testing.B) {
	const n, size = 100_000, 4096
	f := mem.New(mem.Options{})
	wn, err := f.NewNode(1)
	if err != nil {
		b.Fatal(err)
	}
	defer wn.Close()
	rg, err := NewRegions(wn, 0, size, 1024, []rdma.NodeID{2})
	if err != nil {
		b.Fatal(err)
	}
	defer rg.Close()
	tr, err := New(Config{NodeSize: size, MaxKey: 64}, rg.Arena, 1)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([][]byte, n)
	val := make([]byte, 100)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12))
		if _, err := tr.Put(keys[i], val, uint64(i+2), uint64(i+2)); err != nil {
			b.Fatal(err)
		}
	}
	rg.Publish(tr, n+1, 0, 0, nil)
	rn, err := f.NewNode(2)
	if err != nil {
		b.Fatal(err)
	}
	defer rn.Close()
	conn, err := rn.Connect(1)
	if err != nil {
		b.Fatal(err)
	}
	rem := NewRemote(conn, 0)
	hd, err := rem.Header()
	if err != nil {
		b.Fatal(err)
	}
	c := NewCache(64 << 20)
	for _, k := range keys {
		if _, _, _, err := c.Lookup(rem.Read, hd.Root, k); err != nil {
			b.Fatal(err)
		}
	}
	reads := 0
	for i := 0; b.Loop(); i++ {
		_, found, nr, err := c.Lookup(rem.Read, hd.Root, keys[i%n])
		if err != nil || !found {
			b.Fatal(found, err)
		}
		reads += nr
	}
	b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
}

// BenchmarkStoreApply measures the apply of one ordered put on a replica
// (Store.Apply of a one-op request: the version read, the conditions, the
// leaf's change and its check word) into a tree of 100 k keys of 16 bytes
// and 100-byte values in 4 KiB nodes: inserts of new keys, and updates of
// keys already there.
func BenchmarkStoreApply(b *testing.B) {
	const n = 100_000
	r := rand.New(rand.NewPCG(2, 2))
	mk := func() []byte { return []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12)) }
	val := make([]byte, 100)
	for _, kind := range []string{"insert", "update"} {
		b.Run(kind, func(b *testing.B) {
			s, err := NewStore(StoreConfig{Tablets: []Tablet{All}, MaxChunks: 64, ChunkSlots: 4096}, nil)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([][]byte, n)
			idx := uint64(1)
			for i := range keys {
				keys[i] = mk()
				idx++
				s.Apply(idx, AppendRequest(nil, []Op{{Kind: OpPut, Key: keys[i], Value: val}}))
			}
			reqs := make([][]byte, 4096)
			for i := range reqs {
				k := mk()
				if kind == "update" {
					k = keys[r.IntN(n)]
				}
				reqs[i] = AppendRequest(nil, []Op{{Kind: OpPut, Key: k, Value: val}})
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				idx++
				if res := s.Apply(idx, reqs[i%len(reqs)]); res[0] != StatusOK {
					b.Fatal(res[0])
				}
			}
		})
	}
}

// BenchmarkNodeCheck measures a node's check word over the used bytes of
// a 4 KiB and an 8 KiB node at 70% fill: XXH3 (nodeCheck) and the XXH64
// it replaced.
func BenchmarkNodeCheck(b *testing.B) {
	for _, size := range []int{4096, 8192} {
		buf := make([]byte, size*7/10)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		b.Run(fmt.Sprintf("xxh3/node=%d", size), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				nodeCheck(buf)
			}
		})
		b.Run(fmt.Sprintf("xxh64/node=%d", size), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				xxhash.Sum64(buf)
			}
		})
	}
}

// BenchmarkStoreApplyBatch measures what a replica's apply of kvbench
// btree's insert row costs per insert: a Store of 100 k keys loaded in
// ascending order (kvbench's load: 17-byte internal keys, 100-byte
// values), then batch entries of 16 multi requests of 4 inserts of new
// keys between the loaded ones (a loaded key with its last digit made a
// letter), as the client's combining sends them at 64 writers. With
// replicas=3 three Stores apply every batch in turn, as a group's three
// replicas do on one poller (their trees compete for the caches). Mode
// get looks each put's key up before the put (noBlindPut: the apply
// before blind puts), mode blind does not. cpu-ns/insert is the
// benchmark thread's CPU time per insert on one replica; splits/k the
// leaf splits per 1000 inserts.
func BenchmarkStoreApplyBatch(b *testing.B) {
	for _, replicas := range []int{1, 3} {
		for _, mode := range []string{"get", "blind", "off", "batch"} {
			b.Run(fmt.Sprintf("replicas=%d/%s", replicas, mode), func(b *testing.B) {
				benchStoreApply(b, Config{}, replicas, mode)
			})
		}
	}
}

// BenchmarkStoreApplyNodeSize is BenchmarkStoreApplyBatch's
// replicas=3/batch at node sizes of 1, 2, 4 and 8 KiB (keys of at most
// 64 bytes, so that 1 KiB nodes are valid; kvbench's keys are 17). Run
// with -count N to alternate the sizes in the same minutes. nodes/k is
// the arena's new slots per 1000 inserts, pages/k the same in pages.
func BenchmarkStoreApplyNodeSize(b *testing.B) {
	for _, size := range []int{1024, 2048, 4096, 8192} {
		b.Run(fmt.Sprintf("node=%d", size), func(b *testing.B) {
			benchStoreApply(b, Config{NodeSize: size, MaxKey: 64}, 3, "batch")
		})
	}
}

// benchStoreApply is the body of BenchmarkStoreApplyBatch for one
// geometry, replica count and mode.
func benchStoreApply(b *testing.B, tree Config, replicas int, mode string) {
	const n, msgs, per = 100_000, 16, 4
	key := func(dst []byte, i int) []byte {
		dst = append(dst[:0], 1, 'k')
		for range 15 {
			dst = append(dst, '0')
		}
		for j := len(dst) - 1; i > 0; j-- {
			dst[j] = byte('0' + i%10)
			i /= 10
		}
		return dst
	}
	val := make([]byte, 100)
	stores := make([]*Store, replicas)
	for r := range stores {
		s, err := NewStore(StoreConfig{Tree: tree, Tablets: []Tablet{All}, MaxChunks: min(127, 64*4096/tree.withDefaults().NodeSize), ChunkSlots: 4096}, nil)
		if err != nil {
			b.Fatal(err)
		}
		stores[r] = s
		s.knobs.noBlindPut = mode == "get"
		s.t.knobs.noPrefetch = mode == "off"
		ops := make([]Op, MaxMulti)
		idx := uint64(1)
		for i := 0; i < n; i += MaxMulti {
			for j := range ops {
				ops[j] = Op{Kind: OpPut, Key: key(nil, i+j), Value: val}
			}
			idx++
			s.Apply(idx, AppendMulti(nil, ops))
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	reqs := make([][]byte, msgs)
	ops := make([]Op, per)
	for i := range ops {
		ops[i] = Op{Kind: OpPut, Value: val}
	}
	idx := uint64(1 << 20)
	applyBatch := func() {
		for m := range reqs {
			for j := range ops {
				k := key(ops[j].Key, rng.IntN(n))
				k[len(k)-1] = byte('a' + rng.IntN(26))
				ops[j].Key = k
			}
			reqs[m] = AppendMulti(reqs[m][:0], ops)
		}
		idx++
		for _, s := range stores {
			if mode == "batch" {
				for _, req := range reqs {
					s.Prefetch(req)
				}
				s.TouchBatch()
			}
			for _, req := range reqs {
				s.Apply(idx, req)
			}
			s.Publish(idx)
		}
	}
	// As kvbench's x1 insert row before its x64 row: 10 k
	// inserts split the leaves that the ascending load left full.
	for range 10_000 / (msgs * per) {
		applyBatch()
	}
	splits0 := stores[0].Stats().LeafSplits
	ins0 := stores[0].Stats().Inserts
	slots0 := stores[0].a.Slots()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	inserts := 0
	b.ReportAllocs()
	for b.Loop() {
		applyBatch()
		inserts += msgs * per
	}
	cpu := threadCPU() - cpu0
	st := stores[0].Stats()
	ins := float64(max(st.Inserts-ins0, 1))
	b.ReportMetric(float64(cpu)/float64(inserts*replicas), "cpu-ns/insert")
	b.ReportMetric(1000*float64(st.LeafSplits-splits0)/ins, "splits/k")
	newSlots := float64(stores[0].a.Slots() - slots0)
	b.ReportMetric(1000*newSlots/ins, "nodes/k")
	b.ReportMetric(1000*newSlots*float64(stores[0].cfg.Tree.NodeSize)/4096/ins, "pages/k")
}

// threadCPU is the calling thread's CPU time in nanoseconds.
func threadCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}

// BenchmarkArenaFreshSlot measures what a split's new node costs in
// memory never written before: alloc a new slot and write a node image
// into it, the arena's chunks mapped from files in /dev/shm as the shm
// fabric maps its regions (fallocated, shared). Mode populate is alloc's
// window (populate.go), plain has it off (noPopulate): the first write
// of each page faults. cpu-ns/slot is the thread's CPU per new slot.
func BenchmarkArenaFreshSlot(b *testing.B) {
	const nodeSize, per = 4096, 1024
	for _, mode := range []string{"plain", "populate"} {
		b.Run(mode, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var maps [][]byte
			defer func() {
				for _, m := range maps {
					unix.Munmap(m)
				}
			}()
			grow := func(n int) ([]byte, error) {
				fd, err := unix.Open("/dev/shm", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
				if err != nil {
					return nil, err
				}
				defer unix.Close(fd)
				if err := unix.Fallocate(fd, 0, 0, int64(n)); err != nil {
					return nil, err
				}
				m, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
				if err != nil {
					return nil, err
				}
				maps = append(maps, m)
				return m, nil
			}
			a := NewArena(nodeSize, per, grow)
			a.noPopulate = mode == "plain"
			img := make([]byte, nodeSize)
			for i := range img {
				img[i] = byte(i)
			}
			b.ResetTimer()
			cpu0 := threadCPU()
			for range b.N {
				id := a.alloc()
				copy(a.bytes(id.Slot()), img)
			}
			b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "cpu-ns/slot")
		})
	}
}

// BenchmarkTreeInsertFill measures what splits cost an insert right after
// an ascending load (kvbench btree's insert row at the Tree: 100 k
// 17-byte keys loaded in order, 100-byte values, then 10 k new keys
// between them, then the measured ones), three trees applying each
// insert in turn as a group's three replicas do on one poller. It
// compares, in one process and alternated in blocks of 256 inserts (the
// load of a shared machine falls on both alike), trees whose load left
// their leaves RightFill full (full-cpu-ns/insert, the default: nearly
// every leaf splits at its first new key) with trees split in halves
// (halfSplits: leaves about half full, room for a dozen new keys each;
// half-cpu-ns/insert). full-splits/k and half-splits/k are the leaf
// splits per 1000 measured inserts. The arenas are one chunk each,
// allocated before the measurement.
func BenchmarkTreeInsertFill(b *testing.B) {
	const n, trees, block = 100_000, 3, 256
	key := func(i int) []byte { return fmt.Appendf(nil, "\x01k%015d", i) }
	val := make([]byte, 100)
	rng := rand.New(rand.NewPCG(7, 7))
	news := make([][]byte, 1<<18)
	for i := range news {
		k := key(rng.IntN(n))
		k[len(k)-1] = byte('a' + rng.IntN(26))
		news[i] = k
	}
	mk := func(halves bool) []*Tree {
		ts := make([]*Tree, trees)
		for r := range ts {
			t, err := New(DefaultConfig, NewArena(4096, 1<<15, nil), 1)
			if err != nil {
				b.Fatal(err)
			}
			t.knobs.halfSplits = halves
			for i := range n {
				if _, err := t.Put(key(i), val, uint64(i+1), 2); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 10_000 {
				t.Put(news[len(news)-1-i], val, 1, 3)
			}
			ts[r] = t
		}
		return ts
	}
	sets := [2][]*Tree{mk(false), mk(true)}
	var cpu [2]int64
	var splits0 [2]uint64
	for s := range sets {
		splits0[s] = sets[s][0].Usage().LeafSplits
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	i := 0
	run := func(set, from int) {
		c0 := threadCPU()
		for j := from; j < from+block; j++ {
			k := news[j%(len(news)-10_000)]
			for _, t := range sets[set] {
				t.Put(k, val, uint64(j), 4)
			}
		}
		cpu[set] += threadCPU() - c0
	}
	for b.Loop() {
		first := (i / block) % 2
		run(first, i)
		run(1-first, i)
		i += block
	}
	for s, name := range []string{"full", "half"} {
		b.ReportMetric(float64(cpu[s])/float64(i*trees), name+"-cpu-ns/insert")
		b.ReportMetric(1000*float64(sets[s][0].Usage().LeafSplits-splits0[s])/float64(i), name+"-splits/k")
	}
}

// BenchmarkStoreApplyPrefetch compares a replica's apply of kvbench
// btree's x64 insert row with and without the batch's prefetch
// (prefetch.go), in one process: two sets of three Stores (a group's
// replicas on one poller) of 100 k keys loaded in ascending order, then
// 10 k inserts, then batch entries of 16 multi requests of 4 new keys
// (as BenchmarkStoreApplyBatch), each batch applied by one set and then
// by the other, which set goes first alternating, so the load of a
// shared machine falls on both alike. off-cpu-ns/insert and
// on-cpu-ns/insert are the thread's CPU per insert on one replica:
// without prefetch (noPrefetch) and with it (Prefetch of every request,
// TouchBatch, the applies, Publish, as kv.Table drives it).
func BenchmarkStoreApplyPrefetch(b *testing.B) {
	const n, msgs, per, replicas = 100_000, 16, 4, 3
	mk := func(off bool) []*Store {
		stores := make([]*Store, replicas)
		for r := range stores {
			s, err := NewStore(StoreConfig{Tablets: []Tablet{All}, MaxChunks: 64, ChunkSlots: 4096}, nil)
			if err != nil {
				b.Fatal(err)
			}
			s.t.knobs.noPrefetch = off
			abLoad(s, n)
			stores[r] = s
		}
		return stores
	}
	ab := newABInserts([2][]*Store{mk(true), mk(false)}, n, msgs, per)
	i := ab.run(b)
	for s, name := range []string{"off", "on"} {
		b.ReportMetric(float64(ab.cpu[s])/float64(i*msgs*per*replicas), name+"-cpu-ns/insert")
	}
}

// abKey is the benchmarks' i-th key of abLoad's tree.
func abKey(i int) []byte { return fmt.Appendf(nil, "\x01k%015d", i) }

// abLoad loads n keys (abKey 0..n-1, 100-byte values) in ascending order
// into s, MaxMulti a request.
func abLoad(s *Store, n int) {
	val := make([]byte, 100)
	ops := make([]Op, MaxMulti)
	for i := 0; i < n; i += MaxMulti {
		for j := range ops {
			ops[j] = Op{Kind: OpPut, Key: abKey(i + j), Value: val}
		}
		s.Apply(uint64(i/MaxMulti+2), AppendMulti(nil, ops))
	}
}

// abInserts drives two sets of Stores (a group's replicas each, loaded
// by abLoad with n keys) with the same batch entries of msgs multi
// requests of per new keys, applied as kv.Table drives a batch (Prefetch
// of every request, TouchBatch, the applies, Publish), each batch by one
// set and then by the other, which set goes first alternating, so the
// load of a shared machine falls on both alike. cpu is each set's
// applying thread's CPU since newABInserts's 10 k warming inserts.
type abInserts struct {
	sets [2][]*Store
	n    int
	rng  *rand.Rand
	reqs [][]byte
	ops  []Op
	val  []byte
	idx  uint64
	cpu  [2]int64
}

func newABInserts(sets [2][]*Store, n, msgs, per int) *abInserts {
	ab := &abInserts{sets: sets, n: n, rng: rand.New(rand.NewPCG(7, 7)), reqs: make([][]byte, msgs),
		ops: make([]Op, per), val: make([]byte, 100), idx: 1 << 20}
	for range 10_000 / (msgs * per) {
		ab.batch()
		ab.apply(0)
		ab.apply(1)
	}
	ab.cpu = [2]int64{}
	return ab
}

// run applies a batch by both sets per iteration of b (on one locked
// thread, which threadCPU measures) and returns the iterations.
func (ab *abInserts) run(b *testing.B) int {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	i := 0
	for b.Loop() {
		ab.round(i)
		i++
	}
	return i
}

// round applies the next batch by both sets, set i%2 first.
func (ab *abInserts) round(i int) {
	ab.batch()
	ab.apply(i % 2)
	ab.apply(1 - i%2)
}

func (ab *abInserts) apply(set int) {
	c0 := threadCPU()
	for _, s := range ab.sets[set] {
		for _, req := range ab.reqs {
			s.Prefetch(req)
		}
		s.TouchBatch()
		for _, req := range ab.reqs {
			s.Apply(ab.idx, req)
		}
		s.Publish(ab.idx)
	}
	ab.cpu[set] += threadCPU() - c0
}

func (ab *abInserts) batch() {
	for m := range ab.reqs {
		for j := range ab.ops {
			k := abKey(ab.rng.IntN(ab.n))
			k[len(k)-1] = byte('a' + ab.rng.IntN(26))
			ab.ops[j] = Op{Kind: OpPut, Key: k, Value: ab.val}
		}
		ab.reqs[m] = AppendMulti(ab.reqs[m][:0], ab.ops)
	}
	ab.idx++
}

// BenchmarkStoreApplyPrefault measures what the arena's faulter
// (StoreConfig.PrefaultNodes) saves a replica's apply of kvbench btree's
// x64 insert row, in one process: two sets of three Stores (a group's
// replicas on one poller) whose arenas are regions of shm nodes in
// /dev/shm (files mapped shared, as kvserver's), 100 k keys loaded in
// ascending order, 10 k inserts, then batch entries of 16 multi requests
// of 4 new keys applied as kv.Table drives them (Prefetch, TouchBatch,
// the applies, Publish), each batch by one set and then by the other,
// which set goes first alternating, so the load of a shared machine falls
// on both alike. Set off populates windows on the writer (populate.go),
// set on has the faulter (DefaultPrefaultNodes). off-cpu-ns/insert and
// on-cpu-ns/insert are the applying thread's CPU per insert on one
// replica (the poller's); on-total-cpu-ns/insert adds the faulters' CPU
// (Faulter.CPU) over the same inserts; splits/k the leaf splits per 1000
// inserts (the same in both sets).
func BenchmarkStoreApplyPrefault(b *testing.B) {
	const n, msgs, per, replicas = 100_000, 16, 4, 3
	mk := func(set int, on bool) []*Store {
		node, err := shm.Open(rdma.NodeID(set+1), shm.Options{Cluster: fmt.Sprintf("btpf%d", os.Getpid())})
		if err != nil {
			b.Skipf("shm: %v", err)
		}
		b.Cleanup(func() { node.Close() })
		stores := make([]*Store, replicas)
		for r := range stores {
			cfg := StoreConfig{Group: uint32(r), Tablets: []Tablet{All}, MaxChunks: 64}
			if on {
				cfg.PrefaultNodes = DefaultPrefaultNodes
			}
			s, err := NewStore(cfg, node)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			abLoad(s, n)
			stores[r] = s
		}
		return stores
	}
	sets := [2][]*Store{mk(0, false), mk(1, true)}
	faulterCPU := func() (ns int64) {
		for _, s := range sets[1] {
			ns += s.Stats().PrefaultCPU
		}
		return ns
	}
	ab := newABInserts(sets, n, msgs, per)
	splits0, ins0 := sets[0][0].Stats().LeafSplits, sets[0][0].Stats().Inserts
	f0 := faulterCPU()
	i := ab.run(b)
	for _, s := range sets[1] {
		s.a.faulter.Wait()
	}
	inserts := float64(i * msgs * per * replicas)
	b.ReportMetric(float64(ab.cpu[0])/inserts, "off-cpu-ns/insert")
	b.ReportMetric(float64(ab.cpu[1])/inserts, "on-cpu-ns/insert")
	b.ReportMetric(float64(ab.cpu[1]+faulterCPU()-f0)/inserts, "on-total-cpu-ns/insert")
	st := sets[0][0].Stats()
	b.ReportMetric(1000*float64(st.LeafSplits-splits0)/float64(max(st.Inserts-ins0, 1)), "splits/k")
}
