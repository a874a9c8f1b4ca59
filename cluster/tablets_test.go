package cluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

const twoGroups = `name = "t"
fabric = "shm"
data_dir = "data"

[[group]]
  [[group.replica]]
  id = 1
[[group]]
  [[group.replica]]
  id = 2

[[clients]]
count = 4
`

// TestOrderedTablets: the keyspaces' split points cut the key order into
// tablets placed round-robin over the groups (as internal keys, every
// keyspace's points together); each group's Store gets its tablets;
// uniform_splits gives prefix + two digits; bad split points are refused.
func TestOrderedTablets(t *testing.T) {
	doc := twoGroups + `
[[keyspace]]
name = "users"
kind = "ordered"
splits = ["m"]
[[keyspace]]
name = "events"
kind = "ordered"
uniform_splits = 4
split_prefix = "user"
`
	m := configMap(t, doc)
	if got := fmt.Sprint(m.Keyspaces[1].Splits); got != "[user25 user50 user75]" {
		t.Fatalf("uniform splits %s", got)
	}
	var got []string
	for _, p := range m.OrderedTablets() {
		got = append(got, fmt.Sprintf("%d:%q", p.Group, p.Low))
	}
	want := `[0:"" 1:"\x01m" 0:"\x02user25" 1:"\x02user50" 0:"\x02user75"]`
	if fmt.Sprint(got) != want {
		t.Fatalf("tablets %v, want %s", got, want)
	}
	s0, _ := m.OrderedStore(0)
	s1, _ := m.OrderedStore(1)
	if len(s0.Tablets) != 3 || len(s1.Tablets) != 2 || !s0.Tablets[2].HighInf || string(s1.Tablets[0].High) != "\x02user25" {
		t.Fatalf("group 0 %v, group 1 %v", s0.Tablets, s1.Tablets)
	}
	if gs := m.OrderedGroups(); fmt.Sprint(gs) != "[0 1]" {
		t.Fatalf("groups %v", gs)
	}
	for _, bad := range []string{
		`splits = ["b", "a"]`,
		`splits = ["a", ""]`,
		"uniform_splits = 4\nsplits = [\"a\"]",
		"uniform_splits = 101",
		`split_prefix = "user"`,
	} {
		doc := twoGroups + "[[keyspace]]\nname = \"u\"\nkind = \"ordered\"\n" + bad + "\n"
		c, err := ParseConfig([]byte(doc), "c.toml")
		if err == nil {
			_, err = c.Map()
		}
		if err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	// More than btree.MaxTablets tablets in one group: refused.
	mm := &Map{Name: "x", Fabric: "mem", Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{9}, Keyspaces: []Keyspace{{Name: "u", Kind: KindOrdered, ID: 1, Splits: UniformSplits("k", 100)}}}
	if err := mm.Fill(); err == nil || !strings.Contains(err.Error(), "tablets") {
		t.Fatalf("100 tablets in one group: %v", err)
	}
}
