package kvproc_test

import (
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// TestHalfBatches: the failure labeller names a get that returned a
// batch's intermediate state, and no other.
func TestHalfBatches(t *testing.T) {
	h := []kvcheck.Op{
		{Client: 0, Kind: kvcheck.Batch, Batch: []kvcheck.BatchOp{{Key: "k", Value: "a"}, {Key: "k", Value: "b"}}, Call: 10, Return: 20, Out: kvcheck.Output{OK: true, Index: 5}},
		{Client: 1, Kind: kvcheck.Get, Key: "k", Call: 12, Return: 13, Out: kvcheck.Output{Found: true, Value: "a"}},
		{Client: 1, Kind: kvcheck.Get, Key: "k", Call: 14, Return: 15, Out: kvcheck.Output{Found: true, Value: "b"}},
		{Client: 2, Kind: kvcheck.Batch, Batch: []kvcheck.BatchOp{{Key: "j", Delete: true}, {Key: "j", Value: "c"}}, Call: 30, Return: 40, Out: kvcheck.Output{OK: true, Index: 6}},
		{Client: 1, Kind: kvcheck.Get, Key: "j", Call: 31, Return: 32},
		{Client: 1, Kind: kvcheck.Get, Key: "j", Call: 1, Return: 2},                                                 // before the batch: absent is fine
		{Client: 1, Kind: kvcheck.Get, Key: "k", Call: 50, Return: 51, Out: kvcheck.Output{Found: true, Value: "a"}}, // after it: not this bug
	}
	got := halfBatches(h, nil)
	if len(got) != 2 || !strings.HasPrefix(got[0], "op 1 ") || !strings.HasPrefix(got[1], "op 4 ") {
		t.Fatalf("halfBatches = %q, want ops 1 and 4", got)
	}
	if got := halfBatches(h, []int{2, 5, 6}); len(got) != 0 {
		t.Fatalf("halfBatches of ops 2, 5, 6 = %q, want none", got)
	}
}
