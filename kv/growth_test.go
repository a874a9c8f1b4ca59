package kv

import (
	"fmt"
	"slices"
	"testing"
)

// TestGrowthQuadruples: the index grows into four times its buckets while
// the new generation stays within QuadGrowthLog, and into twice beyond it
// (QuadGrowthLog -1: always twice); every key stays readable through the
// reader while each generation migrates (MigrateStep 1: many applies
// between a growth's start and its end) and after.
func TestGrowthQuadruples(t *testing.T) {
	for _, tc := range []struct {
		name string
		quad int
		want []int // the index's LogBuckets, in the order they appeared
	}{
		{"quad-to-8", 8, []int{2, 4, 6, 8, 9, 10}},
		{"always-twice", -1, []int{2, 3, 4, 5, 6, 7, 8, 9, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, r := soloTable(t, TableConfig{LogBuckets: 2, MigrateStep: 1, QuadGrowthLog: tc.quad, HeapRegionSize: 1 << 20, MaxValue: 64})
			logs := []int{tb.geometry().LogBuckets}
			// 2^10 buckets x 7 slots x 0.75 = 5376: the last growth (to
			// 2^10) starts before 4000 keys.
			const keys = 4000
			migrating := 0
			for i := range keys {
				k := fmt.Sprintf("key-%d", i)
				if res := put(tb, uint64(i+1), Op{Kind: OpPut, Key: []byte(k), Value: []byte("v" + k)}); res.Status != StatusOK {
					t.Fatalf("put %s: %+v", k, res)
				}
				g := tb.geometry()
				if g.LogBuckets != logs[len(logs)-1] {
					logs = append(logs, g.LogBuckets)
				}
				if g.Migrating {
					migrating++
				}
				if i%5 == 0 {
					j := (i * 7919) % (i + 1) // an earlier key, maybe not migrated yet
					kj := fmt.Sprintf("key-%d", j)
					got, err := r.Get([]byte(kj), Linearizable)
					if err != nil || !got.Found || string(got.Value) != "v"+kj {
						t.Fatalf("after put %d (geometry %+v): get %s: %+v %v", i, g, kj, got, err)
					}
				}
			}
			if !slices.Equal(logs, tc.want) {
				t.Fatalf("grew to log %v, want %v", logs, tc.want)
			}
			if migrating == 0 {
				t.Fatal("no apply saw a migration in progress: the test did not cover reads during one")
			}
			for i := range keys {
				k := fmt.Sprintf("key-%d", i)
				got, err := r.Get([]byte(k), StaleOK)
				if err != nil || !got.Found || string(got.Value) != "v"+k {
					t.Fatalf("at the end: get %s: %+v %v", k, got, err)
				}
			}
			if tb.Len() != keys {
				t.Fatalf("table has %d records, want %d", tb.Len(), keys)
			}
		})
	}
}
