package client

import (
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestDescribeGroup: whether a group that has not registered the client
// can elect a leader, read from its replicas' headers, and what the text
// says. A replica that restarted without its data (its header says
// catching up) is reachable but cannot vote: a group whose reachable
// voters are no majority cannot elect, and Open must not wait for it.
func TestDescribeGroup(t *testing.T) {
	up := func(node rdma.NodeID) ReplicaStatus { return ReplicaStatus{Node: node, Reachable: true} }
	catching := func(node rdma.NodeID) ReplicaStatus {
		return ReplicaStatus{Node: node, Reachable: true, CatchingUp: true}
	}
	down := func(node rdma.NodeID) ReplicaStatus { return ReplicaStatus{Node: node} }
	leads := func(node rdma.NodeID, e uint64) ReplicaStatus {
		return ReplicaStatus{Node: node, Reachable: true, Serving: e}
	}
	for _, tc := range []struct {
		name     string
		rs       []ReplicaStatus
		canElect bool
		want     string // the whole text, or its start if it ends in "..."
	}{
		{"all up, electing", []ReplicaStatus{up(1), up(2), up(3)}, true,
			"no leader (an election is under way)"},
		{"one restarted", []ReplicaStatus{up(1), catching(2), up(3)}, true,
			"no leader (an election is under way)"},
		{"two restarted", []ReplicaStatus{up(1), catching(2), catching(3)}, false,
			`no leader: replicas 2 and 3 restarted without their data and cannot vote (see docs/deploy.md "force-new-cluster")`},
		{"one restarted, one down", []ReplicaStatus{catching(1), up(2), down(3)}, false,
			`no leader: replica 3 unreachable; replica 1 restarted without its data and cannot vote (see docs/deploy.md "force-new-cluster")`},
		{"all restarted", []ReplicaStatus{catching(1), catching(2), catching(3)}, false,
			`no leader: replicas 1, 2 and 3 restarted without their data and cannot vote (see docs/deploy.md "When a whole group is down")`},
		{"two down", []ReplicaStatus{up(1), down(2), down(3)}, false,
			"no leader: replicas 2 and 3 unreachable"},
		{"two down, the other restarted", []ReplicaStatus{catching(1), down(2), down(3)}, false,
			"no leader: replicas 2 and 3 unreachable"},
		// A leader catches the restarted members up itself: its group
		// is not dead, whatever the others' headers say.
		{"a leader and two restarted", []ReplicaStatus{leads(1, 7), catching(2), catching(3)}, true,
			"no answer to the client's registration (node 1's header says it leads; replicas 2 and 3 catching up)"},
		{"five, three restarted", []ReplicaStatus{up(1), up(2), catching(3), catching(4), catching(5)}, false,
			`no leader: replicas 3, 4 and 5 restarted without their data and cannot vote (see docs/deploy.md "force-new-cluster")`},
		{"five, two restarted", []ReplicaStatus{up(1), up(2), catching(3), catching(4), up(5)}, true,
			"no leader (an election is under way)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text, canElect := describeGroup(tc.rs, nil)
			if canElect != tc.canElect {
				t.Errorf("can elect: %v, want %v (%q)", canElect, tc.canElect, text)
			}
			if want, ok := strings.CutSuffix(tc.want, "..."); ok && !strings.HasPrefix(text, want) || !ok && text != tc.want {
				t.Errorf("text %q\n          want %q", text, tc.want)
			}
		})
	}
}
