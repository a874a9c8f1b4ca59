package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/rdma"
)

// exampleCluster starts 2 groups of 3 replicas in this process (the mem
// fabric) and opens a client on it. A real application opens its client
// with client.Open(ctx, client.WithMapFile(path)) against running
// kvserver processes instead.
func exampleCluster() (*client.Client, func()) {
	m := &cluster.Map{Name: "example", Fabric: "mem",
		Groups:      [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}},
		ClientNodes: []rdma.NodeID{100}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lc, err := localcluster.Start(ctx, m, broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	node, err := lc.ClientNode(0)
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.Open(ctx, client.WithMap(m), client.WithNode(node))
	if err != nil {
		log.Fatal(err)
	}
	return c, func() { c.Close(); lc.Close() }
}

func Example() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	if _, err := c.Put(ctx, []byte("greeting"), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, []byte("greeting")) // linearizable, one-sided
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", v)
	// Output: hello
}

func ExampleClient_UpdateFields() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	// A record of named fields, stored as one fielded value.
	rec := fielded.Encode(map[string][]byte{"name": []byte("ada"), "city": []byte("london")})
	if _, err := c.Put(ctx, []byte("user/1"), rec); err != nil {
		log.Fatal(err)
	}
	// Set one field, without reading the record: the replicas merge it.
	if _, err := c.UpdateFields(ctx, []byte("user/1"), map[string][]byte{"city": []byte("paris")}); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, []byte("user/1"))
	if err != nil {
		log.Fatal(err)
	}
	fields, err := fielded.Decode(v)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s\n", fields["name"], fields["city"])

	// A value that is not a fielded value is left alone.
	c.Put(ctx, []byte("plain"), []byte("hello"))
	_, err = c.UpdateFields(ctx, []byte("plain"), map[string][]byte{"x": nil})
	fmt.Println(errors.Is(err, client.ErrNotFielded))
	// Output:
	// ada paris
	// true
}

func ExampleClient_Get() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	_, err := c.Get(ctx, []byte("missing"))
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output: true
}

func ExampleClient_GetItem() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	w, _ := c.Put(ctx, []byte("k"), []byte("v1"))
	it, err := c.GetItem(ctx, []byte("k"), client.Linearizable)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(it.Value), it.Version == w.Version)
	// A stale-ok get reads the nearest replica; it may lag, and says by
	// how much at least: it.Applied is the replica's applied entry.
	if it, err := c.GetItem(ctx, []byte("k"), client.StaleOK); err == nil {
		_ = it.Applied
	}
	// Output: v1 true
}

func ExampleClient_Put() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	first, _ := c.Put(ctx, []byte("k"), []byte("one"))
	second, _ := c.Put(ctx, []byte("k"), []byte("two"))
	fmt.Println(first.Prev == 0, second.Prev == first.Version, second.Version > first.Version)
	// Output: true true true
}

func ExampleClient_Delete() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	c.Put(ctx, []byte("k"), []byte("v"))
	d, _ := c.Delete(ctx, []byte("k"))
	_, err := c.Get(ctx, []byte("k"))
	fmt.Println(d.Prev != 0, errors.Is(err, client.ErrNotFound))
	// Output: true true
}

func ExampleClient_CompareAndSwap() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	_, err := c.CompareAndSwap(ctx, []byte("lock"), nil, []byte("owner-1")) // only if absent
	fmt.Println(err)
	_, err = c.CompareAndSwap(ctx, []byte("lock"), nil, []byte("owner-2"))
	fmt.Println(errors.Is(err, client.ErrCASMismatch))
	_, err = c.CompareAndSwap(ctx, []byte("lock"), []byte("owner-1"), []byte("owner-2"))
	fmt.Println(err)
	// Output:
	// <nil>
	// true
	// <nil>
}

func ExampleClient_CompareVersionAndSwap() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	c.Put(ctx, []byte("counter"), []byte("1"))
	// An optimistic update: read the version, write only if it did not change.
	it, _ := c.GetItem(ctx, []byte("counter"), client.Linearizable)
	_, err := c.CompareVersionAndSwap(ctx, []byte("counter"), it.Version, []byte("2"))
	fmt.Println(err)
	_, err = c.CompareVersionAndSwap(ctx, []byte("counter"), it.Version, []byte("3"))
	fmt.Println(errors.Is(err, client.ErrCASMismatch))
	// Output:
	// <nil>
	// true
}

func ExampleClient_Commit() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	c.Put(ctx, []byte("old"), []byte("x"))
	var b client.Batch
	b.Put([]byte("a"), []byte("1")).Put([]byte("b"), []byte("2")).Delete([]byte("old"))
	res, err := c.Commit(ctx, &b) // atomic in each group; keys may span groups
	if err != nil {
		log.Fatal(err)
	}
	va, _ := c.Get(ctx, []byte("a"))
	vb, _ := c.Get(ctx, []byte("b"))
	_, err = c.Get(ctx, []byte("old"))
	fmt.Println(string(va), string(vb), errors.Is(err, client.ErrNotFound), len(res.Versions))
	// Output: 1 2 true 3
}

// CompareAndSwap's old == nil means "the key has no value"; a non-nil
// empty old ([]byte{}) means "the key's value is empty". Get returns a
// found empty value as a non-nil []byte{}, so what Get returned round-trips
// as old; an update that reads first may also compare versions.
func ExampleClient_CompareAndSwap_nilVersusEmpty() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	k := []byte("k")

	_, err := c.CompareAndSwap(ctx, k, []byte{}, []byte("x")) // k has no value, not an empty one
	fmt.Println(errors.Is(err, client.ErrCASMismatch))
	c.Put(ctx, k, []byte{})
	_, err = c.CompareAndSwap(ctx, k, nil, []byte("x")) // k has a value (an empty one)
	fmt.Println(errors.Is(err, client.ErrCASMismatch))

	v, err := c.Get(ctx, k)
	fmt.Println(v != nil, len(v), err)                // found: empty, not nil
	_, err = c.CompareAndSwap(ctx, k, v, []byte("y")) // so it round-trips
	fmt.Println(err)

	it, _ := c.GetItem(ctx, k, client.Linearizable)
	_, err = c.CompareVersionAndSwap(ctx, k, it.Version, []byte("x"))
	fmt.Println(err)
	// Output:
	// true
	// true
	// true 0 <nil>
	// <nil>
	// <nil>
}

// A Batch is built with Put and Delete (they chain); the zero Batch is
// empty and ready. Commit returns each operation's version, in the order
// they were added, and each group's entry index.
func ExampleBatch() {
	c, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	var b client.Batch
	for i := range 3 {
		b.Put(fmt.Appendf(nil, "user:%d", i), []byte("active"))
	}
	b.Delete([]byte("user:old"))
	fmt.Println(b.Len())

	res, err := c.Commit(ctx, &b)
	if err != nil {
		log.Fatal(err) // refused before sending, or (ErrOutcomeUnknown) it may still be applied
	}
	it, _ := c.GetItem(ctx, []byte("user:1"), client.Linearizable)
	fmt.Println(len(res.Versions), it.Version == res.Versions[1], len(res.Groups) >= 1)
	// Output:
	// 4
	// 4 true true
}
