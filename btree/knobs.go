package btree

// testingKnobs are the package's test hooks and planted bugs; the zero
// value is production behaviour. Tests set them on a Tree or a Cache
// before use.
type testingKnobs struct {
	// noVersionFloor: an ingest does not raise the versions issued after
	// it above the moved keys' (a CAS can match a version from another
	// group: TestMoveVersionsNeverRepeat).
	noVersionFloor bool
	// onWrite runs after every node write (tests capture the states a
	// concurrent reader may see between writes).
	onWrite func()
	// linkBeforeNode plants a bug: a split writes the node that now links
	// to the new node before the new node exists, so a reader that moves
	// right finds no node there.
	linkBeforeNode bool
	// noInPlace makes every change go through a whole image (decode,
	// change, encode, copy): the reference the in-place path is held to.
	noInPlace bool
	// inPlaceOldStamp plants a bug: a leaf changed in place keeps its
	// old stamp, so a scan that read the applied index before the change
	// accepts the changed leaf as a state as of that index (what readers
	// validate was not updated with the node).
	inPlaceOldStamp bool
	// keepDescentMemo keeps the writer's last descent across node writes
	// (a split or a new root leaves it pointing at the wrong leaf).
	keepDescentMemo bool
	// noInnerMemo makes the writer search its inner nodes in place
	// (Node.ChildFor) instead of in their memos (innermemo.go): the
	// benchmarks' comparison.
	noInnerMemo bool
	// memoKeepOnWrite (planted) keeps an inner node's memo across a
	// write of its slot: the descent then follows the node's old keys
	// (TestInnerMemo catches it).
	memoKeepOnWrite bool
	// memoAddAnyKey (planted): a separator added to an inner node
	// after its last key keeps the node's memo even when it lacks the
	// prefix the memo skips (TestInnerMemo catches it).
	memoAddAnyKey bool
	// memoPrefixFromFirst (planted): an inner node's memo skips the
	// prefix of all its keys, the first included, as before branch bt3
	// (the root's first key is empty: no prefix, every search of the
	// root ends in the node's bisection; TestInnerMemoWords catches it).
	memoPrefixFromFirst bool
	// memoLowIgnored (planted): a key below the memo's prefix is below
	// every key, even at or past a first key that lacks the prefix
	// (TestInnerMemo catches it).
	memoLowIgnored bool
	// unwrittenAll (planted): every install takes its slot for a new
	// one's first write, and leaves the node it overwrites in the usage
	// (TestUsageMatchesWalk catches it).
	unwrittenAll bool
	// noBlindPut makes a blind put (one unconditional put) look its key
	// up before the put, as every other write request does: the
	// reference its result is held to.
	noBlindPut bool
	// blindNoPrev plants a bug: a blind put's result leaves Prev 0 (the
	// lookup that filled it is skipped and the put's own report of the
	// version it replaced is not used), so an overwrite looks like an
	// insert to the client.
	blindNoPrev bool
	// noPrefetch turns the batch's prefetch off (prefetch.go): the
	// reference its results and bytes are held to.
	noPrefetch bool
	// prefetchIgnoreShape plants a bug: a path kept by prefetch is taken
	// even after a split changed the tree's shape, so a key whose leaf
	// split since goes into the old leaf, outside its fences.
	prefetchIgnoreShape bool
	// prefetchSkipFence plants a bug: a kept leaf is taken after a split
	// without checking that its fences still hold the key.
	prefetchSkipFence bool
	// halfSplits splits every node at half its bytes, the last of its
	// level too (the comparison for splitAt's RightFill).
	halfSplits bool

	// On an Arena:
	// onPopulate replaces the madvise of a window of new slots
	// [from, to) (populate.go): tests see the windows.
	onPopulate func(from, to uint32)
	// populateBehind plants a bug: the window alloc populates when it
	// hands out a new slot ends at that slot, so every slot is handed out
	// (and first written) before its page is populated: the cost the
	// window is for is paid anyway.
	populateBehind bool
	// populatePastChunk plants a bug: the window is not clipped at the
	// end of its chunk, so the madvise covers memory past the chunk (the
	// next chunk's region, or none: an error that turns populating off).
	populatePastChunk bool
	// prefaultOnce plants a bug: the faulter (SetPrefault) is asked for
	// the slots past the first new one only, not past each later one, so
	// splits after the first lookahead write fresh pages on the writer.
	prefaultOnce bool
	// prefaultTouchZero plants a bug: the faulter touches a page with a
	// plain store of zero instead of an atomic add of zero, so a touch
	// that lands on a node the writer wrote (it fell behind the writer,
	// or was asked for used slots) changes its bytes.
	prefaultTouchZero bool

	// On a Cache:
	// skipFence answers from a leaf without checking that its fences
	// hold the key (the client trusts its cached pointer).
	skipFence bool
	// staleCacheAfterSplit answers from a leaf reached through a cached
	// parent that predates the leaf's split, without moving right: the
	// low fence is checked, the high fence a split lowered is not, so a
	// key the split moved to the new right leaf reads as absent.
	staleCacheAfterSplit bool
	// skipContiguity accepts a leaf whose low fence is not the previous
	// leaf's high fence (Sherman's issue 18: a scan that reads the leaves
	// a stale parent lists misses the keys a split moved).
	skipContiguity bool
	// keepStaleParent plants a slowdown, not a wrong answer: a scan
	// whose first leaf, named by a cached parent, no longer holds the
	// scan's start (a split moved it right) keeps that parent and walks
	// right links, and a descent that moved right keeps the cached node
	// it started from. Inserts at the right end split the last leaf
	// again and again, so every later scan there walks a chain of right
	// links that grows with each split (issue 18: YCSB E's collapse).
	keepStaleParent bool
	// skipStamp accepts leaves written after the scan's applied index, so
	// one scan mixes states of the tree from different moments.
	skipStamp bool

	// On a Directory:
	// skipDirGap lets a scan that meets a range no tablet holds skip to
	// the next tablet (the keys of the missing range are silently left
	// out) instead of failing with ErrDirGap.
	skipDirGap bool

	// On a Store:
	// skipOwnerCheck applies writes to keys the group owns no tablet
	// of (a misrouted write, or one sent with a stale directory): the
	// write is lost to readers of the owner.
	skipOwnerCheck bool
	// splitGap splits a tablet into [low, mid) and [mid+0x00, high):
	// the key mid belongs to no tablet after the split (its writes are
	// refused, StatusMoved, and readers route it nowhere).
	splitGap bool
	// writeDuringMove applies writes to a frozen tablet (a move under
	// way): the mover has read the tablet's entries already, so such a
	// write is acknowledged but lost when the tablet's new group takes
	// over.
	writeDuringMove bool
	// dropKeepsKeys: a drop (CtlDrop) removes the tablet from the
	// group's list but leaves its keys in the tree; when the tablet
	// moves back, the ingest puts its pairs over them, and keys deleted
	// meanwhile elsewhere come back (the kv simulator's moves).
	dropKeepsKeys bool
	// noOwnBump: a drop and an activation leave the ownership version
	// as it was, so a reader whose directory predates a move reads the
	// group the tablet left and is not told (the kv simulator's moves).
	noOwnBump bool
	// dropBeforePublish: a drop deletes the tablet's keys before the
	// header says the ownership version changed, so a reader that checks
	// the version around its node reads may meet leaves without the
	// keys under the old version (and answer "not found").
	dropBeforePublish bool
	// gcKeepsRange: an ingest of a tablet coming back over garbage
	// (garbage.go) deletes the garbage keys in its range but leaves the
	// range in the garbage list, so later collects delete the pairs
	// the tablet took in (Store.CheckKeys: a garbage range overlaps a
	// tablet; TestDropMoveBack).
	gcKeepsRange bool
	// gcNotPublished: a change of the garbage key count alone does not
	// republish the load area, so a group whose garbage a CtlCollect
	// deleted keeps showing the old count (until a write or a tablet
	// change), and a balancer keeps sending it collections
	// (TestCtlCollect).
	gcNotPublished bool
	// gcIgnoresBudget: CtlCollect deletes every garbage key in its
	// apply, not GarbageStep of them (TestCtlCollect).
	gcIgnoresBudget bool
	// keyByKey deletes garbage keys one Delete each (a descent and a
	// leaf write per key) instead of one write per leaf: the reference
	// Tree.deleteKeys is compared with, not a bug.
	keyByKey bool
	// ingestOverLeftover: an abort at a move's source leaves the
	// tablet's generation as it was, and an ingest takes its pairs into
	// an installing tablet left of an aborted move (the target's abort
	// never ran) when the next move has the same generation: keys
	// deleted at the source between the two moves come back at the
	// target (the kv simulator's moves).
	ingestOverLeftover bool
	// freeAtOnce releases an unlinked node's slot in the apply that
	// unlinked it, without the grace of FreeAfter entries.
	freeAtOnce bool
	// persistLive: a snapshot capture's Persist reads every node from
	// the arena, ignoring the images the writer saved for it, so the
	// section mixes the state at capture with later changes.
	persistLive bool
	// splitCopiesWrites: a tablet split gives both halves the tablet's
	// write count (Tablet.Writes), so the group's tablets report more
	// writes than it applied, and a balancer reads load where there is
	// none.
	splitCopiesWrites bool
	// splitResendRefused: a CtlSplit sent again after its answer was
	// lost (the tablet is split already) is refused (StatusCondFailed)
	// instead of answered OK, so the client reports a split that
	// happened as failed (TestStoreCtlSplitResent).
	splitResendRefused bool
	// shiftMultiResults applies a multi request's ops in a rotated order
	// and hands op i the result of op i+1 (a replica that mixes up whose
	// result is whose: each caller learns a neighbour's outcome).
	shiftMultiResults bool
}

// PlantSkipOwnerCheck plants the skipOwnerCheck bug in s (tests of other
// packages only: the kv simulator's mutant).
func PlantSkipOwnerCheck(s *Store) { s.knobs.skipOwnerCheck = true }

// PlantWriteDuringMove plants the writeDuringMove bug in s (tests of
// other packages: the client's move test).
func PlantWriteDuringMove(s *Store) { s.knobs.writeDuringMove = true }

// PlantShiftMultiResults plants the shiftMultiResults bug in s (tests of
// other packages: the client's combining test).
func PlantShiftMultiResults(s *Store) { s.knobs.shiftMultiResults = true }

// PlantPersistLive plants the persistLive bug in s (tests of other
// packages: kv's capture of its ordered part).
func PlantPersistLive(s *Store) { s.knobs.persistLive = true }

// PlantNoVersionFloor plants the noVersionFloor bug in s (tests of other
// packages: the kv simulator's moves).
func PlantNoVersionFloor(s *Store) { s.knobs.noVersionFloor = true }

// PlantDropKeepsKeys plants the dropKeepsKeys bug in s (tests of other
// packages: the kv simulator's moves).
func PlantDropKeepsKeys(s *Store) { s.knobs.dropKeepsKeys = true }

// PlantGCKeepsRange plants the gcKeepsRange bug in s (tests of other
// packages: the kv simulator's moves).
func PlantGCKeepsRange(s *Store) { s.knobs.gcKeepsRange = true }

// PlantNoOwnBump plants the noOwnBump bug in s (tests of other packages:
// the kv simulator's moves).
func PlantNoOwnBump(s *Store) { s.knobs.noOwnBump = true }

// PlantDropBeforePublish plants the dropBeforePublish bug in s (tests
// of other packages: a reader between a drop's node writes).
func PlantDropBeforePublish(s *Store) { s.knobs.dropBeforePublish = true }

// PlantIngestOverLeftover plants the ingestOverLeftover bug in s (tests
// of other packages: the kv simulator's moves).
func PlantIngestOverLeftover(s *Store) { s.knobs.ingestOverLeftover = true }

// SetOnWrite makes s call f after each node write of its tree (nil:
// none; tests of other packages read the published state between the
// writes of one apply).
func SetOnWrite(s *Store, f func()) { s.t.knobs.onWrite = f }
