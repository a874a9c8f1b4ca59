package kvcheck

import (
	"strings"
	"testing"
)

func scanOp(client int, start, end string, limit int, pairs ...KV) Op {
	return Op{Client: client, Kind: Scan, Key: start, End: end, Limit: limit, Out: Output{Pairs: pairs}}
}

// A scan is checked against the model's range at its linearization
// point: one overlapping a put may or may not see it, but not a state
// that never existed; its limit and its end are honoured.
func TestScanLinearizable(t *testing.T) {
	h := []Op{
		at(putOp(0, "a", "1"), 0, 10),
		at(putOp(0, "c", "1"), 0, 10),
		at(putOp(1, "b", "2"), 20, 40),
		at(scanOp(2, "", "", 0, KV{"a", "1"}, KV{"c", "1"}), 25, 30),   // before the put of b
		at(scanOp(2, "a", "c", 0, KV{"a", "1"}, KV{"b", "2"}), 31, 35), // after it, b's put linearized by 31
		at(scanOp(3, "b", "", 1, KV{"b", "2"}), 41, 50),                // limit 1
		at(scanOp(3, "d", "z", 0), 41, 50),                             // nothing in range
		at(delOp(1, "a"), 60, 70),
		at(scanOp(2, "", "", 0, KV{"b", "2"}, KV{"c", "1"}), 71, 80),
	}
	res := mustLinearizable(t, h)
	if len(res.Partitions) != 2 { // a, b, c linked by the scans; the empty range alone
		t.Fatalf("partitions %v", res.Partitions)
	}
}

// Planted wrong scans: each is rejected by the model.
func TestScanRejectsWrong(t *testing.T) {
	base := []Op{
		at(putOp(0, "a", "1"), 0, 10),
		at(putOp(0, "b", "1"), 0, 10),
		at(putOp(0, "c", "1"), 0, 10),
	}
	for name, s := range map[string]Op{
		"missing key (Sherman #18)": scanOp(1, "", "", 0, KV{"a", "1"}, KV{"c", "1"}),
		"past its end":              scanOp(1, "a", "b", 0, KV{"a", "1"}, KV{"b", "1"}),
		"past its limit":            scanOp(1, "", "", 2, KV{"a", "1"}, KV{"b", "1"}, KV{"c", "1"}),
		"out of order":              scanOp(1, "", "", 0, KV{"b", "1"}, KV{"a", "1"}, KV{"c", "1"}),
		"wrong value":               scanOp(1, "", "", 0, KV{"a", "1"}, KV{"b", "2"}, KV{"c", "1"}),
		"a key never written":       scanOp(1, "", "", 0, KV{"a", "1"}, KV{"b", "1"}, KV{"bb", "1"}, KV{"c", "1"}),
		"empty range not empty":     scanOp(1, "d", "", 0, KV{"c", "1"}),
	} {
		h := append(append([]Op(nil), base...), at(s, 20, 30))
		res, err := CheckLinearizable(h, 10e9)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != Illegal || !strings.Contains(res.Err().Error(), "not linearizable") {
			t.Fatalf("%s: outcome %v", name, res.Outcome)
		}
	}
}

// A scan that mixes two states (one key before a batch, another after)
// is rejected: the batch is atomic.
func TestScanSeesBatchAtomically(t *testing.T) {
	h := []Op{
		at(batchOp(0, BatchOp{Key: "a", Value: "1"}, BatchOp{Key: "b", Value: "1"}), 0, 10),
		at(batchOp(0, BatchOp{Key: "a", Value: "2"}, BatchOp{Key: "b", Value: "2"}), 20, 40),
		at(scanOp(1, "", "", 0, KV{"a", "2"}, KV{"b", "1"}), 25, 35),
	}
	res, err := CheckLinearizable(h, 10e9)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Illegal {
		t.Fatalf("a torn scan: %v", res.Outcome)
	}
}

// A reverse scan returns its range's last pairs, descending: the model
// accepts that and rejects the ascending order or the first pairs.
func TestScanReverse(t *testing.T) {
	base := []Op{
		at(putOp(0, "a", "1"), 0, 10),
		at(putOp(0, "b", "1"), 0, 10),
		at(putOp(0, "c", "1"), 0, 10),
	}
	rev := func(limit int, pairs ...KV) Op {
		o := scanOp(1, "a", "", limit, pairs...)
		o.Reverse = true
		return o
	}
	ok := append(append([]Op(nil), base...), at(rev(2, KV{"c", "1"}, KV{"b", "1"}), 20, 30), at(rev(0, KV{"c", "1"}, KV{"b", "1"}, KV{"a", "1"}), 31, 40))
	mustLinearizable(t, ok)
	for name, s := range map[string]Op{
		"ascending":   rev(0, KV{"a", "1"}, KV{"b", "1"}, KV{"c", "1"}),
		"first pairs": rev(2, KV{"b", "1"}, KV{"a", "1"}),
	} {
		h := append(append([]Op(nil), base...), at(s, 20, 30))
		res, err := CheckLinearizable(h, 10e9)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != Illegal {
			t.Fatalf("%s: outcome %v", name, res.Outcome)
		}
	}
}
