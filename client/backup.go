package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
)

// BackupMarker multicasts the marker of backup id to every group of the
// cluster (`kvserver backup` calls it; docs/operations.md "Backup and
// restore") and returns the index at which each group applied it: the
// groups deliver it in one order consistent across groups, so those
// indices are a consistent cut of the cluster. Replicas applying it after
// expires (a replica replaying its log) do not capture their state.
func (c *Client) BackupMarker(ctx context.Context, id uint64, expires time.Time) (map[uint32]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	dst := c.tree.All()
	o, err := c.multicast(ctx, dst, kv.AppendBackup(nil, id, expires.UnixNano()))
	if err != nil {
		switch {
		case errors.Is(err, multicast.ErrClosed) || c.isClosed():
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
		}
		return nil, err
	}
	out := map[uint32]uint64{}
	for _, rp := range o.Replies {
		res, err := kv.DecodeResult(rp.Result)
		if err != nil {
			return nil, fmt.Errorf("rdmakv: group %d's reply to the backup marker: %w", rp.Group, err)
		}
		if res.Status != kv.StatusOK {
			return nil, fmt.Errorf("rdmakv: group %d refused the backup marker (status %d): does it run an older kvserver?", rp.Group, res.Status)
		}
		out[uint32(rp.Group)] = rp.Index
	}
	for _, g := range dst.Groups() {
		if _, ok := out[uint32(g)]; !ok {
			return nil, fmt.Errorf("rdmakv: no reply from group %d to the backup marker", g)
		}
	}
	return out, nil
}
