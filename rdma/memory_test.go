package rdma

import "testing"

func TestAllocFreeOddSizes(t *testing.T) {
	for _, size := range []int{1, 8, 100, 4095, 4096, 4097, 1 << 20} {
		b, err := AllocMemory(size)
		if err != nil {
			t.Fatalf("AllocMemory(%d): %v", size, err)
		}
		if len(b) != size {
			t.Fatalf("AllocMemory(%d): len %d", size, len(b))
		}
		b[size-1] = 1
		if err := FreeMemory(b); err != nil {
			t.Fatalf("FreeMemory after AllocMemory(%d): %v", size, err)
		}
	}
	if _, err := AllocMemory(0); err == nil {
		t.Fatal("AllocMemory(0) succeeded")
	}
}

func TestInBounds(t *testing.T) {
	cases := []struct {
		off  uint64
		n    int
		size int
		want bool
	}{
		{0, 8, 8, true}, {1, 8, 8, false}, {8, 0, 8, true}, {9, 0, 8, false},
		{^uint64(0), 1, 8, false}, {^uint64(0) - 6, 8, 16, false}, {8, 8, 16, true},
	}
	for _, c := range cases {
		if got := InBounds(c.off, c.n, c.size); got != c.want {
			t.Errorf("InBounds(%d,%d,%d)=%v want %v", c.off, c.n, c.size, got, c.want)
		}
	}
}
