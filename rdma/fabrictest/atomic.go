package fabrictest

import (
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// wordPattern is writer k's j-th whole-word pattern: eight equal bytes, so
// a word mixed from two writes has unequal bytes.
func wordPattern(k, j int) uint64 {
	b := uint64(1 + (k*37+j)%255)
	return b * 0x0101_0101_0101_0101
}

func wordWhole(v uint64) bool { return v == (v&0xff)*0x0101_0101_0101_0101 }

// testAtomic8Byte: concurrent writers of whole-word patterns to one aligned
// word; neither the owner's Load64 nor a peer's 8-byte read sees a mix.
func testAtomic8Byte(t *testing.T, h Harness) {
	const writers, minWrites = 3, 500
	const off = 8
	cl := newCluster(t, h, writers+2)
	owner := cl.open(1)
	r := register(t, owner, 1, 64)
	mem := r.Bytes()
	initial := uint64(0xEE) * 0x0101_0101_0101_0101
	rdma.Store64(mem, off, initial)
	var conns []rdma.Conn
	for k := range writers {
		id := rdma.NodeID(2 + k)
		n := cl.open(id)
		grant(t, r, id, rdma.PermWrite)
		conns = append(conns, connect(t, n, 1))
	}
	rid := rdma.NodeID(writers + 2)
	rn := cl.open(rid)
	grant(t, r, rid, rdma.PermRead)
	rc := connect(t, rn, 1)

	var done atomic.Bool
	started := make(chan struct{}, 2)
	ov := newOverlap(300, 50) // owner, remote reader
	type result struct {
		who      string
		reads    int
		distinct int
		err      error
	}
	results := make(chan result, 2)
	go func() { // the owner's Load64
		seen := map[uint64]bool{}
		res := result{who: "owner Load64"}
		started <- struct{}{}
		for last := false; !last; {
			last = done.Load()
			v := rdma.Load64(mem, off)
			ov.read(0)
			res.reads++
			seen[v] = true
			if !wordWhole(v) {
				res.err = fmt.Errorf("owner's Load64 saw mixed word %#016x: an aligned 8-byte write was torn", v)
				break
			}
			runtime.Gosched()
		}
		res.distinct = len(seen)
		if res.err != nil {
			ov.quit(0)
		}
		results <- res
	}()
	go func() { // a peer's 8-byte reads
		seen := map[uint64]bool{}
		res := result{who: "remote 8-byte read"}
		started <- struct{}{}
		for last := false; !last; {
			last = done.Load()
			v, err := read64(rc, 1, off)
			if err != nil {
				res.err = fmt.Errorf("remote read: %w", err)
				break
			}
			ov.read(1)
			res.reads++
			seen[v] = true
			if !wordWhole(v) {
				res.err = fmt.Errorf("remote 8-byte read saw mixed word %#016x: an aligned 8-byte access was torn", v)
				break
			}
		}
		res.distinct = len(seen)
		if res.err != nil {
			ov.quit(1)
		}
		results <- res
	}()
	<-started
	<-started

	var wg sync.WaitGroup
	werrs := make([]error, writers)
	ov.start()
	for k, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := newPipe(c, 32)
			for j := 0; j < minWrites || ov.more(); j++ {
				if _, err := p.write64(1, off, wordPattern(k, j), 0); err != nil {
					werrs[k] = fmt.Errorf("writer %d: %w", k, err)
					return
				}
				runtime.Gosched() // share the cores with the readers
			}
			werrs[k] = p.sync(1, 16, 1)
		}()
	}
	wg.Wait()
	ov.stop()
	done.Store(true)
	for _, err := range werrs {
		if err != nil {
			t.Error(err)
		}
	}
	for range 2 {
		res := <-results
		if res.err != nil {
			t.Errorf("%s: %v", res.who, res.err)
			continue
		}
		// The reader read the initial pattern or a write before the writers
		// started and a writer's pattern after they finished.
		if res.distinct < 2 {
			t.Errorf("%s: %d reads saw only %d distinct value(s); the writers' patterns never became visible", res.who, res.reads, res.distinct)
		}
		t.Logf("%s: %d reads, %d distinct whole words", res.who, res.reads, res.distinct)
	}
	if err := ov.check(); err != nil {
		t.Error(err)
	}
}

// Record layout for the torn-write case (recSize bytes, one write):
//
//	0         8                               recSize-8   recSize
//	+---------+-------------- ... ------------+-----------+
//	| version | payload (recPayload bytes)     | checksum  |
//	+---------+-------------- ... ------------+-----------+
//
// checksum is FNV-1a over version and payload. A reader copies the record
// (possibly torn by a concurrent write) and accepts it only if the checksum
// matches: the validation protocols must do on anything larger than a word.
const (
	recSize    = 512
	recPayload = recSize - 16
)

func recChecksum(b []byte) uint64 {
	h := uint64(0xcbf2_9ce4_8422_2325)
	for _, c := range b[:recSize-8] {
		h ^= uint64(c)
		h *= 0x100_0000_01b3
	}
	return h
}

// encodeRecord writes the record of version v into b.
func encodeRecord(b []byte, v uint64) {
	put64(b, v)
	for i := range recPayload {
		b[8+i] = byte(v*131 + uint64(i)*7)
	}
	put64(b[recSize-8:], recChecksum(b))
}

// decodeRecord validates b and returns its version.
func decodeRecord(b []byte) (v uint64, ok bool) {
	if recChecksum(b) != le64(b[recSize-8:]) {
		return 0, false
	}
	return le64(b), true
}

// recordConsistent reports whether b is exactly the record of its version.
func recordConsistent(b []byte) bool {
	var want [recSize]byte
	encodeRecord(want[:], le64(b))
	return string(want[:]) == string(b[:recSize])
}

// testTornRecords: records rewritten concurrently by two peers; readers
// validating them never accept an inconsistent one and do see valid ones.
func testTornRecords(t *testing.T, h Harness) {
	const minWrites = 300
	cl := newCluster(t, h, 4)
	owner := cl.open(1)
	r := register(t, owner, 1, recSize)
	mem := r.Bytes()
	var init [recSize]byte
	encodeRecord(init[:], 0)
	copy(mem, init[:])
	var conns []rdma.Conn
	for id := rdma.NodeID(2); id <= 3; id++ {
		grant(t, r, id, rdma.PermWrite)
		conns = append(conns, connect(t, cl.open(id), 1))
	}
	grant(t, r, 4, rdma.PermRead)
	rc := connect(t, cl.open(4), 1)

	// The validator must reject a spliced record, or the case proves nothing.
	var a, b [recSize]byte
	encodeRecord(a[:], 10)
	encodeRecord(b[:], 11)
	copy(a[recSize/2:], b[recSize/2:])
	if _, ok := decodeRecord(a[:]); ok {
		t.Fatal("suite bug: the record validator accepts a spliced record")
	}

	var done atomic.Bool
	started := make(chan struct{}, 2)
	ov := newOverlap(300, 50) // owner, remote reader
	type result struct {
		who             string
		accepted, torn  int
		err             error
		finalOK         bool
		sawWriterRecord bool
	}
	results := make(chan result, 2)
	check := func(res *result, buf []byte) bool {
		v, ok := decodeRecord(buf)
		if !ok {
			res.torn++
			return true
		}
		if !recordConsistent(buf) {
			res.err = fmt.Errorf("accepted an inconsistent record (version %d)", v)
			return false
		}
		res.accepted++
		if v != 0 {
			res.sawWriterRecord = true
		}
		return true
	}
	go func() {
		res := result{who: "owner"}
		buf := make([]byte, recSize)
		started <- struct{}{}
		for last := false; !last; {
			last = done.Load()
			copy(buf, mem[:recSize])
			ov.read(0)
			if !check(&res, buf) {
				break
			}
			runtime.Gosched()
		}
		if res.err != nil {
			ov.quit(0)
		}
		copy(buf, mem[:recSize])
		_, res.finalOK = decodeRecord(buf)
		results <- res
	}()
	go func() {
		res := result{who: "remote reader"}
		buf := make([]byte, recSize)
		started <- struct{}{}
		for last := false; !last; {
			last = done.Load()
			if err := read(rc, 1, 0, buf); err != nil {
				res.err = fmt.Errorf("read: %w", err)
				break
			}
			ov.read(1)
			if !check(&res, buf) {
				break
			}
		}
		if res.err == nil {
			if err := read(rc, 1, 0, buf); err != nil {
				res.err = fmt.Errorf("final read: %w", err)
			}
			_, res.finalOK = decodeRecord(buf)
		} else {
			ov.quit(1)
		}
		results <- res
	}()

	<-started
	<-started
	var wg sync.WaitGroup
	werrs := make([]error, len(conns))
	ov.start()
	for k, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := newPipe(c, 16)
			rec := make([]byte, recSize)
			for j := 0; j < minWrites || ov.more(); j++ {
				encodeRecord(rec, uint64(2*j+k+1))
				if _, err := p.write(1, 0, rec, 0); err != nil {
					werrs[k] = fmt.Errorf("writer %d: %w", k, err)
					return
				}
				runtime.Gosched() // share the cores with the readers
			}
			// Wait for the last write by writing the last record again,
			// signaled.
			id, err := p.write(1, 0, rec, rdma.Signaled)
			if err == nil {
				err = p.waitDone(id, opTimeout)
			}
			werrs[k] = err
		}()
	}
	wg.Wait()
	ov.stop()
	done.Store(true)
	for _, err := range werrs {
		if err != nil {
			t.Error(err)
		}
	}
	for range 2 {
		res := <-results
		if res.err != nil {
			t.Errorf("%s: %v", res.who, res.err)
			continue
		}
		if !res.finalOK {
			t.Errorf("%s: the record at rest, after every write completed, does not validate", res.who)
		}
		if !res.sawWriterRecord {
			t.Errorf("%s: never accepted a writer's record (%d accepted, %d torn)", res.who, res.accepted, res.torn)
		}
		t.Logf("%s: %d valid records accepted, %d torn copies rejected", res.who, res.accepted, res.torn)
	}
	if err := ov.check(); err != nil {
		t.Error(err)
	}
}

// testAtomicsContention: k peers FetchAdd one word and CAS-increment
// another; no update is lost and every returned old value is unique.
func testAtomicsContention(t *testing.T, h Harness) {
	const k, nFAA, nCAS = 3, 400, 200
	cl := newCluster(t, h, k+1)
	owner := cl.open(1)
	r := register(t, owner, 1, 64)
	var conns []rdma.Conn
	for i := range k {
		id := rdma.NodeID(2 + i)
		grant(t, r, id, rdma.PermReadWrite)
		conns = append(conns, connect(t, cl.open(id), 1))
	}
	faaVals := make([][]uint64, k)
	casVals := make([][]uint64, k)
	errs := make([]error, k)
	// Every worker goes on until all have done their minimum, so that the
	// workers overlap however the scheduler starts them.
	var progress [2][k]atomic.Int64
	deadline := time.Now().Add(liveTimeout)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			more := func(phase, done int) bool {
				progress[phase][i].Store(int64(done))
				min := [2]int64{nFAA, nCAS}[phase]
				if int64(done) < min {
					return true
				}
				for w := range k {
					if progress[phase][w].Load() < min && time.Now().Before(deadline) {
						return true
					}
				}
				return false
			}
			faaVals[i], casVals[i], errs[i] = atomicsWorker(c, 1, 0, 8, more)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	var totalFAA, totalCAS int
	for i := range k {
		totalFAA += len(faaVals[i])
		totalCAS += len(casVals[i])
	}
	mem := r.Bytes()
	if got := rdma.Load64(mem, 0); got != uint64(totalFAA) {
		t.Errorf("FetchAdd word = %d after %d increments by %d peers: updates lost", got, totalFAA, k)
	}
	if got := rdma.Load64(mem, 8); got != uint64(totalCAS) {
		t.Errorf("CAS word = %d after %d successful CAS increments by %d peers: updates lost", got, totalCAS, k)
	}
	checkPermutation(t, "FetchAdd", faaVals, totalFAA)
	checkPermutation(t, "CompareAndSwap", casVals, totalCAS)
	t.Logf("%d FetchAdds, %d CAS increments", totalFAA, totalCAS)
}

// fixedQuota is a worker quota of n FetchAdds and n/2 CAS increments.
func fixedQuota(n int) func(phase, done int) bool {
	return func(phase, done int) bool { return done < [2]int{n, n / 2}[phase] }
}

// atomicsWorker does FetchAdd(1) at faaOff, pipelined, while more(0, done)
// says so, then successful CAS increments at casOff while more(1, done) says
// so; it returns the old values.
func atomicsWorker(c rdma.Conn, region rdma.RegionID, faaOff, casOff uint64, more func(phase, done int) bool) (faas, cass []uint64, err error) {
	const window = 16
	var cs [window]rdma.Completion
	posted := 0
	for {
		for posted-len(faas) < window && more(0, posted) {
			err := c.Post(rdma.WR{ID: uint64(posted), Kind: rdma.OpFetchAdd, Flags: rdma.Signaled, Region: region, Offset: faaOff, Value: 1})
			if err != nil {
				return nil, nil, fmt.Errorf("post FetchAdd %d: %w", posted, err)
			}
			posted++
		}
		if len(faas) == posted {
			break
		}
		n := c.Wait(cs[:], opTimeout)
		if n == 0 {
			return nil, nil, fmt.Errorf("FetchAdd %d: %w", len(faas), errNoCompletion)
		}
		for _, cp := range cs[:n] {
			if cp.Err != nil {
				return nil, nil, fmt.Errorf("FetchAdd #%d: %w", cp.ID, cp.Err)
			}
			if cp.Kind != rdma.OpFetchAdd || cp.ID != uint64(len(faas)) {
				return nil, nil, fmt.Errorf("completion %s #%d, want FetchAdd #%d: completions out of posting order", cp.Kind, cp.ID, len(faas))
			}
			faas = append(faas, cp.Value)
		}
	}
	var old uint64
	for more(1, len(cass)) {
		got, err := cas(c, region, casOff, old, old+1)
		if err != nil {
			return nil, nil, fmt.Errorf("CAS %d->%d: %w", old, old+1, err)
		}
		if got == old {
			cass = append(cass, old)
			old++
		} else {
			old = got
		}
	}
	return faas, cass, nil
}

// checkPermutation checks that the old values returned to all workers are
// exactly 0..total-1, each once, and increase within each worker.
func checkPermutation(t *testing.T, what string, vals [][]uint64, total int) {
	t.Helper()
	var all []uint64
	for w, vs := range vals {
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Errorf("%s worker %d: old value %d after %d: a later op saw an older word", what, w, vs[i], vs[i-1])
				break
			}
		}
		all = append(all, vs...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) != total {
		t.Errorf("%s: %d old values returned, want %d", what, len(all), total)
		return
	}
	for i, v := range all {
		if v != uint64(i) {
			t.Errorf("%s: returned old values are not 0..%d each once: sorted position %d holds %d (duplicate or lost update)", what, total-1, i, v)
			return
		}
	}
}
