package freeport

import (
	"net"
	"testing"
)

// TestDistinctAndFree: the ports of many calls are distinct, and each is
// free when handed out (a listener binds it).
func TestDistinctAndFree(t *testing.T) {
	seen := map[string]bool{}
	addrs := Addrs(t, 20)
	for range 20 {
		addrs = append(addrs, Addr(t))
	}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		l.Close()
	}
	if ps := Ports(t, 3); len(ps) != 3 || ps[0] == 0 {
		t.Fatalf("Ports(3) = %v", ps)
	}
}
