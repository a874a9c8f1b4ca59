// Package freeport hands tests loopback TCP addresses (127.0.0.1) that
// nothing listened on a moment ago, for the servers and processes they
// start. Within one process it never hands out the same port twice: the
// kernel may give a closed ephemeral port out again, and two servers of
// one test on one port fail to start (or worse, one reaches the other).
package freeport

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

var (
	mu   sync.Mutex
	used = map[int]bool{}
)

// Ports returns n distinct loopback ports, free a moment ago; an error
// fails the test.
func Ports(t testing.TB, n int) []int {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	var ps []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ps) < n; tries++ {
		if tries == 100*n+100 {
			t.Fatalf("freeport: %d fresh loopback ports not found in %d tries", n, tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l) // held until every port is chosen: n distinct ones
		p := l.Addr().(*net.TCPAddr).Port
		if !used[p] {
			used[p] = true
			ps = append(ps, p)
		}
	}
	return ps
}

// Addrs is Ports as "127.0.0.1:port" addresses.
func Addrs(t testing.TB, n int) []string {
	t.Helper()
	var as []string
	for _, p := range Ports(t, n) {
		as = append(as, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	return as
}

// Addr is one address of Addrs.
func Addr(t testing.TB) string {
	t.Helper()
	return Addrs(t, 1)[0]
}
