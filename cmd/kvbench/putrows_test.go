package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// TestKVPutRows: --put-threads N gives the put rows 1 and N (one row for
// 1), a list gives a row at each count in its order, each once; the
// largest count sizes Redis's connections (putThreads).
func TestKVPutRows(t *testing.T) {
	for _, c := range []struct {
		arg  string
		rows []int
	}{
		{"", []int{1, 64}},
		{"64", []int{1, 64}},
		{"8", []int{1, 8}},
		{"1", []int{1}},
		{"1,2,4,8,16,64", []int{1, 2, 4, 8, 16, 64}},
		{"8,1,8", []int{8, 1}},
		{"8,", []int{8}},
	} {
		args := []string{"--embedded"}
		if c.arg != "" {
			args = append(args, "--put-threads", c.arg)
		}
		o, err := parseKVFlags(args, io.Discard)
		if err != nil {
			t.Fatalf("--put-threads %q: %v", c.arg, err)
		}
		if !slices.Equal(o.putRows, c.rows) || o.putThreads != slices.Max(c.rows) {
			t.Errorf("--put-threads %q: rows %v, put threads %d; want %v, %d", c.arg, o.putRows, o.putThreads, c.rows, slices.Max(c.rows))
		}
	}
	for _, arg := range []string{"0", "-1", "x", "4,0", ","} {
		if _, err := parseKVFlags([]string{"--put-threads", arg}, io.Discard); err == nil || !strings.Contains(err.Error(), "--put-threads") {
			t.Errorf("--put-threads %q: err %v, want a --put-threads error", arg, err)
		}
	}
}
