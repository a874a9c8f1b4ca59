package kv

import (
	"fmt"
	"os"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// BenchmarkGet is one reader's one-sided get of a table of 100k records
// (16-byte keys, 100-byte values) on another node of this process, on shm
// (the reader's loads from the table's mapping): the cost of the get path
// itself, without the cluster. kvbench kv measures it against a cluster.
func BenchmarkGet(b *testing.B) {
	dir := b.TempDir()
	name := fmt.Sprintf("kvbench%d", os.Getpid())
	n1, err := shm.Open(1, shm.Options{Dir: dir, Cluster: name})
	if err != nil {
		b.Fatal(err)
	}
	defer n1.Close()
	n2, err := shm.Open(2, shm.Options{Dir: dir, Cluster: name})
	if err != nil {
		b.Fatal(err)
	}
	defer n2.Close()
	tb, err := NewTable(TableConfig{Readers: []rdma.NodeID{2}}, n1)
	if err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	tb.Promise(5)
	tb.SetServing(5)
	const n = 100000
	keys := make([][]byte, n)
	val := make([]byte, 100)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%012d", i))
		tb.Apply(broadcast.Entry{Index: uint64(i + 1), Data: AppendRequest(nil, []Op{{Kind: OpPut, Key: keys[i], Value: val}})})
	}
	for _, mode := range []Consistency{StaleOK, Linearizable} {
		b.Run(mode.String(), func(b *testing.B) {
			r := NewGroupReader(n2, 0, []rdma.NodeID{1}, 0)
			defer r.Close()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				res, err := r.Get(keys[i%n], mode)
				if err != nil || !res.Found {
					b.Fatal(err)
				}
				i += 7919
			}
			b.ReportMetric(float64(r.Reads)/float64(b.N), "reads/get")
		})
	}
}
