package client

import (
	"context"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv"
)

// CombinerLoad is the messages under way and the writes queued, summed
// over the groups, in c's write combiner.
func CombinerLoad(c *Client) (inflight, queued int) {
	c.comb.mu.Lock()
	defer c.comb.mu.Unlock()
	for g := range c.comb.inflight {
		inflight += c.comb.inflight[g]
		queued += len(c.comb.queued[g])
	}
	return inflight, queued
}

// MulticastOutstanding is the number of messages c's multicast client
// still holds (abandoned ones until their lca ordered them).
func MulticastOutstanding(c *Client) int { return c.mc.Outstanding() }

// SetKeyspaceGroup makes k send to group g (tests: a group that does not
// own the keyspace answers StatusMoved).
func SetKeyspaceGroup(k *Keyspace, g uint32) { k.force = &g }

// SetPlantDir makes c change every directory of tablets it builds with f
// (tests: a gap, a planted bug). Set it before c's first ordered call.
func SetPlantDir(c *Client, f func(*btree.Directory) *btree.Directory) { c.ord.plantDir = f }

// PlantShiftResults plants a bug in c's write combiner: op i of a message
// gets the result of op i+1.
func PlantShiftResults(c *Client) { c.comb.shiftResults = true }

// PlantReuseUnposted plants a bug in c's write combiner: an op given up
// while its message is being encoded returns its key buffer to the pool.
func PlantReuseUnposted(c *Client) { c.comb.reuseUnposted = true }

// PlantClosedAsUnsent plants a bug in c's write combiner: a message whose
// call c's Close ended hands its writes ErrClosed alone (not sent).
func PlantClosedAsUnsent(c *Client) { c.comb.closedAsUnsent = true }

// SetOnPost makes c's combiner call f before it encodes each message
// (outside its lock, on the posting caller's goroutine).
func SetOnPost(c *Client, f func()) { c.comb.onPost = f }

// KeyspaceDirectory is k's client's directory of tablets (read from the
// groups' headers at its first use).
func KeyspaceDirectory(k *Keyspace) (*btree.Directory, error) {
	return k.directory(context.Background())
}

// SetPlantReader makes c call f on the reader of each ordered get and
// scan page before its call (tests: kv.PlantSkipOwnCheck).
func SetPlantReader(c *Client, f func(*kv.OrderedReader)) { c.ord.plantReader = f }

// SetMoveHook makes c call f before each step of a tablet move.
func SetMoveHook(c *Client, f func(step string)) { c.ord.moveHook = f }

// PlantActivateFirst plants a bug in c's tablet moves: the target is
// activated before the source drops the tablet.
func PlantActivateFirst(c *Client) { c.ord.activateFirst = true }

// NearTablets is Tablets read from c's near replicas (stale-ok): what
// they have applied.
func NearTablets(c *Client, ctx context.Context) ([]TabletInfo, error) {
	return c.tablets(ctx, kv.StaleOK)
}

// CombinerGroup is group g's messages under way and writes queued in c's
// write combiner, and whether a caller is posting the group's queue.
func CombinerGroup(c *Client, g uint32) (inflight, queued int, sending bool) {
	c.comb.mu.Lock()
	defer c.comb.mu.Unlock()
	return c.comb.inflight[g], len(c.comb.queued[g]), c.comb.sending[g]
}

// PlantHoldAnyGroup plants a bug in c's write combiner: the hold counts
// the messages in flight of every group, not the write's group's.
func PlantHoldAnyGroup(c *Client) { c.comb.holdAnyGroup = true }

// PlantDropOverflow plants a bug in c's write combiner: a write that does
// not fit in the message being filled is removed from the queue unsent.
func PlantDropOverflow(c *Client) { c.comb.dropOverflow = true }

// CombineBusy says whether c's write combiner uses the busy hold, and
// whether it holds group g now (the group is busy).
func CombineBusy(c *Client, g uint32) (on, busy bool) {
	c.comb.mu.Lock()
	defer c.comb.mu.Unlock()
	return c.comb.busy, c.comb.busyOn[g]
}

// PlantBusyNoFlight plants a bug in c's write combiner: the busy hold
// holds a busy group with nothing of its own in flight.
func PlantBusyNoFlight(c *Client) { c.comb.busyNoFlight = true }

// PlantBusyStuck plants a bug in c's write combiner: a group once busy
// stays busy.
func PlantBusyStuck(c *Client) { c.comb.busyStuck = true }

// CombineHold is c's write-combining hold: the messages of single-key
// writes a group may have in flight before a write queues.
func CombineHold(c *Client) int { return c.comb.hold }

// CombineRounds says whether c's write combiner sends its groups'
// messages in rounds (WithCombineRounds).
func CombineRounds(c *Client) bool { return c.comb.rounds }

// SetCombineRoundWait sets how young another group's message must be to
// hold a group's queue in c's write combiner (roundMax by default).
func SetCombineRoundWait(c *Client, d time.Duration) {
	c.comb.mu.Lock()
	defer c.comb.mu.Unlock()
	c.comb.roundWait = d
}

// PlantRoundForever plants a bug in c's write combiner: a round holds a
// group's queue behind another group's message however old it is.
func PlantRoundForever(c *Client) { c.comb.roundForever = true }

// PlantRoundNone plants a bug in c's write combiner: rounds hold nothing.
func PlantRoundNone(c *Client) { c.comb.roundNone = true }
