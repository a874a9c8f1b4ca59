package client_test

import (
	"context"
	"testing"

	"github.com/rdmakv/rdmakv/client"
)

// TestSplitTabletResent: the split request of a SplitTablet whose answer
// was lost and which was sent again. The move hook runs before the
// step sends its request: there a nested SplitTablet of the same tablet
// (same fences, same generation) applies the split first, so the outer
// request arrives as a resend of it. The outer call returns nil (before
// the fix: "status 1 ... nothing changed by this step", though the
// tablet was split), and the tablet is split once: two halves, all keys.
func TestSplitTabletResent(t *testing.T) {
	const n = 40
	c, _ := oneTabletCluster(t, "splitresend", 2, n) // no split but ours
	ctx := context.Background()
	var tb client.TabletInfo
	tbs, _ := tabletsOf(t, c)
	for _, x := range tbs {
		if x.Keys == n {
			tb = x
		}
	}
	if tb.Keys != n {
		t.Fatalf("tablets %+v: want one holding the %d keys", tbs, n)
	}
	before := len(tbs)
	nested := false
	var nestedErr error
	client.SetMoveHook(c, func(step string) {
		if step != "split" || nested {
			return
		}
		nested = true
		nestedErr = c.SplitTablet(ctx, tb.Low) // the first send, whose answer the outer call "lost"
	})
	err := c.SplitTablet(ctx, tb.Low)
	client.SetMoveHook(c, nil)
	if !nested || nestedErr != nil {
		t.Fatalf("the nested split: ran %v, error %v", nested, nestedErr)
	}
	if err != nil {
		t.Fatalf("the split sent again: %v", err)
	}
	tbs, _ = tabletsOf(t, c)
	if len(tbs) != before+1 {
		t.Fatalf("after a split and its resend: %d tablets, want %d: %+v", len(tbs), before+1, tbs)
	}
	keys := uint64(0)
	for _, x := range tbs {
		if x.Group == tb.Group {
			keys += x.Keys
		}
	}
	if keys != n {
		t.Fatalf("group %d's tablets hold %d keys, want %d", tb.Group, keys, n)
	}
}
