package rdma

import (
	"fmt"
	"time"
)

// DefaultOpTimeout bounds the synchronous helpers below.
const DefaultOpTimeout = 5 * time.Second

// Do posts wr signaled and waits for its completion. It is meant for
// control-plane code and tests on a Conn with no other signaled op
// outstanding: completions of other ops are discarded.
func Do(c Conn, wr WR, timeout time.Duration) (Completion, error) {
	wr.Flags |= Signaled
	if err := c.Post(wr); err != nil {
		return Completion{}, err
	}
	var cs [16]Completion
	deadline := time.Now().Add(timeout)
	for {
		n := c.Poll(cs[:])
		if n == 0 {
			left := time.Until(deadline)
			if left <= 0 {
				return Completion{}, fmt.Errorf("rdma: %s on node %d: no completion after %v: %w", wr.Kind, c.Peer(), timeout, ErrPeerDead)
			}
			n = c.Wait(cs[:], left)
		}
		for _, cp := range cs[:n] {
			if cp.Err != nil {
				return cp, cp.Err
			}
			if cp.ID == wr.ID && cp.Kind == wr.Kind {
				return cp, nil
			}
		}
	}
}

// Write writes buf at (region, off) on c's peer and waits for completion.
func Write(c Conn, region RegionID, off uint64, buf []byte) error {
	_, err := Do(c, WR{Kind: OpWrite, Region: region, Offset: off, Buf: buf}, DefaultOpTimeout)
	return err
}

// Read reads len(buf) bytes at (region, off) on c's peer into buf.
func Read(c Conn, region RegionID, off uint64, buf []byte) error {
	_, err := Do(c, WR{Kind: OpRead, Region: region, Offset: off, Buf: buf}, DefaultOpTimeout)
	return err
}

// CompareAndSwap swaps the word at (region, off) to new if it holds old and
// returns the previous value.
func CompareAndSwap(c Conn, region RegionID, off, old, new uint64) (uint64, error) {
	cp, err := Do(c, WR{Kind: OpCompareAndSwap, Region: region, Offset: off, Compare: old, Value: new}, DefaultOpTimeout)
	return cp.Value, err
}

// FetchAdd adds delta to the word at (region, off) and returns the previous value.
func FetchAdd(c Conn, region RegionID, off, delta uint64) (uint64, error) {
	cp, err := Do(c, WR{Kind: OpFetchAdd, Region: region, Offset: off, Value: delta}, DefaultOpTimeout)
	return cp.Value, err
}
