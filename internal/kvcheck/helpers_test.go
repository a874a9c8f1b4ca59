package kvcheck

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// Builders of hand-written histories: op(kind...).at(call, return).

func putOp(c int, k, v string) Op { return Op{Client: c, Kind: Put, Key: k, Value: v} }
func delOp(c int, k string) Op    { return Op{Client: c, Kind: Delete, Key: k} }

func getOp(c int, k string, found bool, v string) Op {
	return Op{Client: c, Kind: Get, Key: k, Out: Output{Found: found, Value: v}}
}

func staleGet(c int, k string, found bool, v string, applied uint64) Op {
	return Op{Client: c, Kind: Get, Key: k, Stale: true, Out: Output{Found: found, Value: v, Applied: applied}}
}

func casOp(c int, k, old, v string, ok bool) Op {
	return Op{Client: c, Kind: CAS, Key: k, Old: old, Value: v, Out: Output{OK: ok}}
}

func batchOp(c int, ops ...BatchOp) Op { return Op{Client: c, Kind: Batch, Batch: ops} }

func at(o Op, call, ret int64) Op {
	o.Call, o.Return = call, ret
	return o
}

func idx(o Op, index uint64) Op {
	o.Out.Index = index
	return o
}

func unknown(o Op) Op {
	o.Out.Unknown = true
	return o
}

// testTimeout bounds a porcupine check: generous, since -race on a busy
// 2-core machine slows it several times and a timeout fails the test.
const testTimeout = 60 * time.Second

// mustLinearizable fails t unless h is linearizable.
func mustLinearizable(t *testing.T, h []Op) Result {
	t.Helper()
	res, err := CheckLinearizable(h, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Ok {
		t.Fatalf("history not linearizable: %v\n%s", res.Err(), dump(h))
	}
	return res
}

// mustIllegalIn fails t unless h is not linearizable and the failing
// partitions are exactly the one of keys.
func mustIllegalIn(t *testing.T, h []Op, keys ...string) Result {
	t.Helper()
	res, err := CheckLinearizable(h, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Illegal {
		t.Fatalf("outcome %v, want Illegal\n%s", res.Outcome, dump(h))
	}
	if len(res.Failed) != 1 || !slices.Equal(res.Failed[0].Keys, keys) || res.Failed[0].Outcome != Illegal {
		t.Fatalf("failed partitions %v, want only %q", res.Failed, keys)
	}
	if res.Err() == nil {
		t.Fatal("Err() is nil for an Illegal result")
	}
	t.Logf("caught as expected: %v", res.Err())
	return res
}

// staleErr returns the StaleError err holds (err must be a violation).
func staleErr(t *testing.T, err error) *StaleError {
	t.Helper()
	var se *StaleError
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *StaleError", err)
	}
	return se
}

func dump(h []Op) string {
	s := ""
	for i := range h {
		s += describe(i, &h[i]) + "\n"
	}
	return s
}
