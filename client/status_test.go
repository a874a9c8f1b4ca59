package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestStatus reads every replica's header one-sided: a leader per group,
// applied indexes that follow the writes, then a stopped leader reported
// unreachable and its group's new leader (a higher epoch) reported.
func TestStatus(t *testing.T) {
	lc := startLocal(t, testMap("status", "mem", 2, 1))
	c := open(t, lc, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Writes to both groups, so every group has applied entries.
	for i := range 8 {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != "status" || st.Fabric != "mem" || len(st.Groups) != 2 {
		t.Fatalf("status: %+v", st)
	}
	for g, gs := range st.Groups {
		if gs.Group != uint32(g) || len(gs.Replicas) != 3 {
			t.Fatalf("group %d: %+v", g, gs)
		}
		if want := lc.Leader(g); gs.Leader != want || want < 0 {
			t.Fatalf("group %d: leader %d, the cluster says %d", g, gs.Leader, want)
		}
		if gs.Epoch == 0 || !gs.Confirmed {
			t.Fatalf("group %d: epoch %d confirmed %v", g, gs.Epoch, gs.Confirmed)
		}
		if gs.Applied == 0 || gs.Applied < gs.Known {
			t.Fatalf("group %d: applied %d, the client knows of %d", g, gs.Applied, gs.Known)
		}
		for i, r := range gs.Replicas {
			if !r.Reachable || r.Err != nil {
				t.Fatalf("group %d replica %d: %+v", g, i, r)
			}
			if r.Node != lc.Map.Groups[g][i] || r.Member != i {
				t.Fatalf("group %d replica %d: node %d member %d", g, i, r.Node, r.Member)
			}
			if r.Leader != (i == gs.Leader) || r.Leader && r.Serving != gs.Epoch {
				t.Fatalf("group %d replica %d: leader %v serving %d (group leader %d epoch %d)", g, i, r.Leader, r.Serving, gs.Leader, gs.Epoch)
			}
			if r.Behind != gs.Applied-r.Applied {
				t.Fatalf("group %d replica %d: behind %d, applied %d of %d", g, i, r.Behind, r.Applied, gs.Applied)
			}
			if r.Slots <= 0 || r.Buckets <= 0 || r.Slots != r.Buckets*7 || r.Inc == 0 {
				t.Fatalf("group %d replica %d: table %+v", g, i, r)
			}
			if r.Applied > 0 && (r.AppliedAt.Before(time.Now().Add(-time.Minute)) || r.AppliedAt.After(time.Now().Add(time.Minute))) {
				t.Fatalf("group %d replica %d: applied at %v", g, i, r.AppliedAt)
			}
		}
	}

	// Stop group 0's leader: it is reported unreachable, and once the
	// group elected another, the new leader serves a higher epoch.
	old := st.Groups[0].Leader
	oldEpoch := st.Groups[0].Epoch
	lc.Stop(0, old)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := lc.WaitServing(wctx); err != nil {
		t.Fatal(err)
	}
	// A write through the new leader (the client finds it).
	if _, err := c.Put(ctx, []byte("after"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	var gs client.GroupStatus
	for {
		st, err = c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gs = st.Groups[0]
		if gs.Leader >= 0 && gs.Leader != old && gs.Confirmed {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("group 0 after its leader %d stopped: %+v", old, gs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := gs.Replicas[old]
	if r.Reachable || r.Err == nil || r.Leader {
		t.Fatalf("the stopped replica: %+v", r)
	}
	t.Logf("stopped replica: %v", r.Err)
	if gs.Epoch <= oldEpoch || gs.Leader != lc.Leader(0) {
		t.Fatalf("group 0: leader %d epoch %d; before: leader %d epoch %d; the cluster says %d", gs.Leader, gs.Epoch, old, oldEpoch, lc.Leader(0))
	}
	// Group 1 is untouched.
	if g1 := st.Groups[1]; g1.Leader < 0 || !g1.Confirmed {
		t.Fatalf("group 1: %+v", g1)
	}

	c.Close()
	if _, err := c.Status(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("status of a closed client: %v", err)
	}
}
