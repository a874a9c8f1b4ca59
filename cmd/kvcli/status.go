package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
)

// The JSON of status and leaders.
type statusJSON struct {
	Command string      `json:"command"`
	Cluster string      `json:"cluster"`
	Fabric  string      `json:"fabric"`
	Read    time.Time   `json:"read_at"`
	Groups  []groupJSON `json:"groups"`
	Error   string      `json:"error,omitempty"`
}

type groupJSON struct {
	Group        uint32        `json:"group"`
	Leader       *uint32       `json:"leader_node"` // null: none
	LeaderMember int           `json:"leader_member"`
	Epoch        uint64        `json:"epoch"`
	Confirmed    bool          `json:"confirmed"`
	Applied      uint64        `json:"applied"`
	Replicas     []replicaJSON `json:"replicas,omitempty"`
}

type replicaJSON struct {
	Node      uint32     `json:"node"`
	Member    int        `json:"member"`
	Reachable bool       `json:"reachable"`
	Error     string     `json:"error,omitempty"`
	Leader    bool       `json:"leader"`
	Serving   uint64     `json:"serving_epoch"`
	Promise   uint64     `json:"promised_epoch"`
	Applied   uint64     `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
	Behind    uint64     `json:"behind"`
	Inc       uint64     `json:"incarnation,omitempty"`
	Gen       int        `json:"index_generation"`
	Buckets   int        `json:"index_buckets,omitempty"`
	Slots     int        `json:"index_slots,omitempty"`
	Migrating bool       `json:"migrating"`
}

func toJSON(cmd string, st client.Status, replicas bool) statusJSON {
	out := statusJSON{Command: cmd, Cluster: st.Name, Fabric: st.Fabric, Read: st.Read, Groups: []groupJSON{}}
	for _, g := range st.Groups {
		gj := groupJSON{Group: g.Group, LeaderMember: g.Leader, Epoch: g.Epoch, Confirmed: g.Confirmed, Applied: g.Applied}
		if g.Leader >= 0 {
			id := uint32(g.Replicas[g.Leader].Node)
			gj.Leader = &id
		}
		for _, r := range g.Replicas {
			if !replicas {
				break
			}
			rj := replicaJSON{Node: uint32(r.Node), Member: r.Member, Reachable: r.Reachable, Leader: r.Leader,
				Serving: r.Serving, Promise: r.Promise, Applied: r.Applied, Behind: r.Behind, Inc: r.Inc,
				Gen: r.Gen, Buckets: r.Buckets, Slots: r.Slots, Migrating: r.Migrating}
			if r.Err != nil {
				rj.Error = r.Err.Error()
			}
			if r.Reachable && r.Applied > 0 && !r.AppliedAt.IsZero() {
				at := r.AppliedAt
				rj.AppliedAt = &at
			}
			gj.Replicas = append(gj.Replicas, rj)
		}
		out.Groups = append(out.Groups, gj)
	}
	return out
}

// healthy: every group has a leader a majority confirms (exit 0, else 4).
func healthy(st client.Status) bool {
	for _, g := range st.Groups {
		if g.Leader < 0 || !g.Confirmed {
			return false
		}
	}
	return true
}

func (s *session) readStatus(x *call) (client.Status, int) {
	ctx, cancel := x.runCtx()
	defer cancel()
	st, err := s.c.Status(ctx)
	if err != nil {
		if x.json {
			s.printJSON(statusJSON{Command: x.cmd.name, Error: err.Error()})
			return st, exitCode(err)
		}
		return st, s.report(err)
	}
	return st, exitOK
}

func runStatus(s *session, x *call) int {
	st, code := s.readStatus(x)
	if code != exitOK {
		return code
	}
	if !healthy(st) {
		code = exitUnavailable
	}
	if x.json {
		s.printJSON(toJSON("status", st, true))
		return code
	}
	fmt.Fprintf(s.stdout, "cluster %q (%s), %s, read at %s\n", st.Name, st.Fabric, plural(len(st.Groups), "group"), st.Read.Format(watchTime))
	for _, g := range st.Groups {
		fmt.Fprintf(s.stdout, "\ngroup %d: %s, applied %d\n", g.Group, leaderText(g), g.Applied)
		tw := tabwriter.NewWriter(s.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tROLE\tEPOCH\tPROMISED\tAPPLIED\tBEHIND\tAPPLIED AT\tINDEX")
		for _, r := range g.Replicas {
			if !r.Reachable {
				fmt.Fprintf(tw, "  %d\tunreachable\t-\t-\t-\t-\t-\t%v\n", r.Node, r.Err)
				continue
			}
			role := "follower"
			if r.Leader {
				role = "leader"
			} else if r.Serving != 0 {
				role = "deposed" // serves an older epoch than the leader
			}
			at := "-"
			if r.Applied > 0 && !r.AppliedAt.IsZero() {
				at = r.AppliedAt.Format(watchTime)
			}
			idx := fmt.Sprintf("gen %d, %d buckets, %d slots", r.Gen, r.Buckets, r.Slots)
			if r.Migrating {
				idx += ", growing"
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Node, role, epoch(r.Serving), epoch(r.Promise), r.Applied, r.Behind, at, idx)
		}
		tw.Flush()
	}
	return code
}

// epoch is an epoch as broadcast writes it, (round,leader node); "-" for 0.
func epoch(e uint64) string {
	if e == 0 {
		return "-"
	}
	return broadcast.Epoch(e).String()
}

func leaderText(g client.GroupStatus) string {
	if g.Leader < 0 {
		return "no leader (an election is under way, or too few replicas are reachable)"
	}
	r := g.Replicas[g.Leader]
	t := fmt.Sprintf("leader node %d (member %d), epoch %s", r.Node, r.Member, epoch(g.Epoch))
	if !g.Confirmed {
		t += ", not confirmed by a majority"
	}
	return t
}

func runLeaders(s *session, x *call) int {
	st, code := s.readStatus(x)
	if code != exitOK {
		return code
	}
	if !healthy(st) {
		code = exitUnavailable
	}
	if x.json {
		s.printJSON(toJSON("leaders", st, false))
		return code
	}
	for _, g := range st.Groups {
		fmt.Fprintf(s.stdout, "group %d: %s\n", g.Group, leaderText(g))
	}
	return code
}
