package broadcast

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Epoch is the paper's epoch = (round, ldr) (Acuerdo Fig. 1 l.3) packed in
// one word: round<<32 | leader. Epochs are ordered by round, then leader,
// which is the order of the packed uint64.
type Epoch uint64

// MakeEpoch packs (round, leader) into an Epoch.
func MakeEpoch(round uint32, leader rdma.NodeID) Epoch {
	return Epoch(uint64(round)<<32 | uint64(leader))
}

// Round is the epoch's round number.
func (e Epoch) Round() uint32 { return uint32(e >> 32) }

// Leader is the node that leads the epoch.
func (e Epoch) Leader() rdma.NodeID { return rdma.NodeID(uint32(e)) }

// String formats the epoch as the paper does: (round,leader).
func (e Epoch) String() string { return fmt.Sprintf("(%d,%d)", e.Round(), e.Leader()) }

// newBiggerEpoch is Acuerdo Fig. 7 l.102: the smallest epoch led by self
// that is bigger than both a and b.
func newBiggerEpoch(a, b Epoch, self rdma.NodeID) Epoch {
	mx := max(a, b)
	if e := MakeEpoch(mx.Round(), self); e > mx {
		return e
	}
	return MakeEpoch(mx.Round()+1, self)
}

// MsgHdr is the paper's msghdr = (e, cnt) (Acuerdo Fig. 1 l.4): a message's
// position in the total order, by epoch then count. The zero MsgHdr is below
// every message.
type MsgHdr struct {
	E   Epoch
	Cnt uint64
}

// Less orders headers by epoch, then count.
func (h MsgHdr) Less(o MsgHdr) bool { return h.E < o.E || (h.E == o.E && h.Cnt < o.Cnt) }

// IsZero reports whether h is the zero header (nothing).
func (h MsgHdr) IsZero() bool { return h == MsgHdr{} }

// String formats the header as the paper does: ((round,leader),cnt).
func (h MsgHdr) String() string { return fmt.Sprintf("(%v,%d)", h.E, h.Cnt) }

func maxHdr(a, b MsgHdr) MsgHdr {
	if a.Less(b) {
		return b
	}
	return a
}

func minHdr(a, b MsgHdr) MsgHdr {
	if b.Less(a) {
		return b
	}
	return a
}

// Vote is the paper's vote = (e_new, acpt) (Acuerdo Fig. 1 l.6): the epoch a
// node wants to join and its candidate's last accepted header, ordered by
// epoch then header.
type Vote struct {
	ENew Epoch
	Acpt MsgHdr
	// Forced marks an operator's forced vote (Replica.ForceLead): members
	// catching up may join it. Less ignores it; a member that joins copies
	// it.
	Forced bool
}

// Less orders votes by epoch, then accepted header.
func (v Vote) Less(o Vote) bool { return v.ENew < o.ENew || (v.ENew == o.ENew && v.Acpt.Less(o.Acpt)) }

// String formats the vote.
func (v Vote) String() string {
	if v.Forced {
		return fmt.Sprintf("<%v,%v,forced>", v.ENew, v.Acpt)
	}
	return fmt.Sprintf("<%v,%v>", v.ENew, v.Acpt)
}

// Role is the paper's Role (Acuerdo Fig. 1 l.17).
type Role uint8

// Roles.
const (
	Electing Role = iota
	Follower
	Leader
)

// String returns the role's name.
func (r Role) String() string {
	switch r {
	case Electing:
		return "electing"
	case Follower:
		return "follower"
	case Leader:
		return "leader"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Entry is one committed entry, as FSM.Apply receives it.
type Entry struct {
	// Index is the entry's position in the total order: 1, 2, ... on
	// every replica.
	Index uint64
	// Hdr is the entry's header: Hdr.E is the epoch whose leader ordered
	// it (broadcast it, Acuerdo Fig. 4), Hdr.Cnt its count in that
	// epoch. Every replica delivers an entry with the same header.
	Hdr MsgHdr
	// Data is the proposed (or appended) bytes. It is valid only during
	// Apply: copy what you keep.
	Data []byte
	// Key is the key of a keyed proposal (ProposeKeyed), zero otherwise.
	// An entry whose key the keyed table shows as delivered already is
	// not applied (its index is skipped).
	Key Key
}

// FSM is the application state machine that committed entries are
// delivered to, in the spirit of hashicorp/raft's FSM. The replica calls it
// from Poll only, so it needs no locking against the replica.
type FSM interface {
	// Apply delivers the committed entry e (e.Index 1, 2, ... in the
	// total order) and returns its result. The result must be a
	// deterministic function of the entries applied so far (every
	// replica computes the same one, and none is sent on the wire): the
	// replica where the entry was proposed resolves its Proposal with the
	// result its own FSM returned (Proposal.Reply, the ProposeFunc
	// callback). The replica copies the result, or hands it to the
	// proposal's callback, before it calls the FSM again, so the FSM may
	// return memory it reuses; a nil result costs nothing. e.Data must
	// not be kept after Apply returns unless copied.
	Apply(e Entry) []byte
	// Snapshot captures the state after every entry applied so far, at
	// this point in time, without serialising it: it is called from Poll
	// and must be quick (the leader's heartbeats and commits wait for it).
	// The replica serialises the capture off the polling goroutine
	// (FSMSnapshot.Persist), or serves it from the FSM's registered memory
	// (RegionSnapshot). BytesSnapshot wraps a small state's copy.
	Snapshot() (FSMSnapshot, error)
	// Restore replaces the state with a snapshot's bytes (what Persist
	// wrote), which the FSM may keep; the next Apply follows the
	// snapshot's index.
	Restore(snapshot []byte) error
}

// Config configures a Replica. Zero fields take the documented defaults.
type Config struct {
	// Self is this replica's node id; it must be in Members.
	Self rdma.NodeID
	// Members is the group, n = 2f+1 node ids, the same list on every member.
	Members []rdma.NodeID
	// RegionBase is the first region id the group uses; it uses
	// RegionBase .. RegionBase+n+4 (SST, one incoming ring per member, and
	// two slots of a snapshot's meta and state regions). Several groups
	// on one node (one replica each, e.g. polled by one poller)
	// need disjoint ranges: the repository's one scheme for region ids is
	// package rdma/regions, whose regions.Broadcast(g) is group g's
	// RegionBase. Default 0x1000 (DefaultRegionBase: one group per node,
	// in regions' reserved range).
	RegionBase rdma.RegionID
	// RingSize is the byte size of each incoming ring (a multiple of 8).
	// Default 1 MiB.
	RingSize int
	// MaxRecord bounds one ring record's payload (rounded down to a
	// multiple of 8, in [256, RingSize/4]). It sets the proposal limit:
	// a proposal's data may have up to MaxRecord-64 bytes
	// (Replica.MaxProposal), so that it fits, with its headers, in every
	// record that carries it: a message or forwarded proposal (16 bytes of
	// metadata) and a diff part (a 24-byte part header and a 40-byte entry
	// header). Diffs larger than one record go in several parts.
	// Default RingSize/8.
	MaxRecord int
	// HeartbeatInterval is how often a member pushes its CommitSST row with
	// a new heartbeat (Acuerdo Fig. 6 l.93). Default 1 ms.
	HeartbeatInterval time.Duration
	// ElectionTimeout is how long a follower waits for its leader's
	// heartbeat (and a leader for a majority) before electing; also the
	// base of the randomised vote timeout. Default 20 ms.
	ElectionTimeout time.Duration
	// MaxLogEntries bounds the committed entries kept in the Log for
	// catch-up; a member further behind gets a snapshot. Default 65536.
	MaxLogEntries int
	// MaxCatchUpLogEntries bounds the committed entries the Log keeps, past
	// MaxLogEntries, for a member that is behind but makes progress: one
	// catching up by snapshot needs the entries committed while it fetches
	// and installs it (a large state takes a while to transfer), and then
	// reads them. A member that makes no progress for an election timeout
	// (down, partitioned, stopped) does not hold the Log. Default 8 x
	// MaxLogEntries.
	MaxCatchUpLogEntries int
	// MaxSnapshot bounds the snapshot this replica fetches from a leader
	// (its FSM state plus a small table); a larger one is refused, so a
	// replica behind the pruned log stays behind rather than allocate it.
	// Default 4 GiB.
	MaxSnapshot int
	// MaxUncommitted bounds the leader's uncommitted entries; beyond it new
	// proposals wait (back pressure). Default 16384.
	MaxUncommitted int
	// MaxKeyedClients bounds the keyed table (ProposeKeyed): the clients
	// whose last delivered Seq every replica remembers; a new client
	// evicts the one whose last delivery is the oldest. It must be the
	// same on every member. Default 65536.
	MaxKeyedClients int
	// MaxPending bounds proposals waiting at this replica for a leader;
	// beyond it Propose fails with ErrBusy. Default 65536.
	MaxPending int
	// ProposeTimeout is how long a proposal may wait without being
	// handed to a leader before it fails with ErrTimeout. Default 2 s.
	ProposeTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// attempts to reconnect a broken Conn. Defaults 1 ms and 100 ms.
	ReconnectMin, ReconnectMax time.Duration
	// Start says how a replica that finds no stable state starts (see
	// StartMode). The zero value, StartExisting, refuses: a member that
	// ran before and lost its stable state must not come back as a full
	// voter with an empty log.
	Start StartMode
	// RejoinIncarnation is the incarnation a StartRejoin replica takes
	// (its old one is lost with the stable state): it must be above any
	// incarnation this member had, e.g. the Unix time in nanoseconds.
	// Required with StartRejoin.
	RejoinIncarnation uint64
	// Seed seeds the replica's randomness (election timeouts). Replicas of
	// a group should use different seeds; 0 derives one from Self.
	Seed uint64
	// PersistInline runs FSMSnapshot.Persist on the polling goroutine
	// instead of a goroutine of its own: for the simulator, whose runs
	// must not depend on goroutine scheduling. A large state then makes
	// one Poll as long as its serialisation.
	PersistInline bool
	// Trace, if set, receives one line per protocol event (votes, role
	// changes, diffs), for tests and debugging.
	Trace func(format string, args ...any)
	// OnEvent, if set, is called from Poll at protocol milestones (role
	// changes, an epoch's diff committed), e.g. to time elections.
	OnEvent func(Event)
	// OnPromise, if set, is called from the polling goroutine with this
	// member's E_new each time it changes (at start, when it votes, when
	// it rejoins, when it accepts a diff), after E_new is saved and
	// before anything this member writes publishes it. E_new only grows
	// within a member's stable state. A member that shows E_new == E has
	// not voted for any later epoch, so f+1 members showing E prove that
	// no leader of a later epoch was elected yet (quorum intersection):
	// kv publishes the value in the table header that clients read to
	// confirm a leader's reads (docs/kv.md, "Linearizable gets").
	OnPromise func(Epoch)
	// Durability is what the replica keeps on disk besides its stable
	// state (docs/broadcast.md, "Durability"). Memory, the default, keeps
	// nothing: the protocol is exactly the in-memory one. Sync writes
	// every accepted entry, diff and commit point to WAL and acknowledges
	// (AcceptSST) only what is synced. Async writes the same records but
	// acknowledges what it accepted; the disk trails by at most about
	// 2 x FsyncInterval (back-pressure), and a member restarted from its
	// log votes only in a recovery election (durable.go).
	Durability Durability
	// FsyncInterval (Async) is the longest a record waits before its
	// batch is written and synced (the replica flushes the writer when
	// its oldest unsynced record is this old, whatever the writer's own
	// interval), and half the back-pressure threshold: while the oldest
	// unsynced record is older than 2 x FsyncInterval the replica accepts
	// nothing new (a follower leaves records in its ring, a leader's
	// AppendRoom is 0 and proposals wait). Default 10 ms.
	FsyncInterval time.Duration
	// WAL is the log Sync and Async write (required with them, nil with Memory):
	// a *wal.Writer opened on the log Recover read, or a *wal.Stream of a
	// process's shared log (wal.Mux), polled from Poll.
	WAL WAL
	// Recovery is what Recover made of the log at start (nil: an empty
	// log). New replays it: the Log, Accepted, E_cur and the commit
	// point, delivering the committed entries to the FSM before New
	// returns. (Async: a restarted member then waits, catching up, for a
	// recovery election or a leader's diff.)
	Recovery *Recovery
	// Snapshots, required with Sync and Async, is where the replica keeps disk
	// snapshots (snapstore.go). It shares WAL's device (wal.Share).
	// Every member captures its FSM at its commit point once the log
	// grew SnapshotLogBytes since the last capture, persists it off Poll,
	// writes it through Snapshots, and then drops the log's whole
	// segments below the snapshot. A snapshot a diff installs is saved
	// here too (the log only names it).
	Snapshots *SnapStore
	// SnapshotLogBytes is how much log (bytes of synced batches) triggers
	// a disk snapshot; 64 MiB if zero.
	SnapshotLogBytes int64
	// SaveGate, if set, is shared by the replicas of a process: one of
	// them at a time captures and saves a periodic disk snapshot
	// (savegate.go). nil: each replica saves when its log says.
	SaveGate *SaveGate
	// CaptureReady, if set, is asked before a periodic disk snapshot's
	// capture (polling goroutine): false holds the capture back to a
	// later Poll (kv's Table.SnapshotReady: while the buffer its index
	// copy needs is being faulted in off the poller). It must turn true
	// within bounded work, or the log grows without a snapshot.
	CaptureReady func() bool
	// StatClock, if set, times the disk snapshot work done in Poll
	// (SnapWork) for the operator's figures; nothing the protocol
	// decides reads it (the simulator leaves it nil).
	StatClock func() time.Duration
	// StatCPUClock, if set, is the polling thread's CPU time, read
	// around each disk snapshot capture (SnapWork.CaptureCPU): the
	// capture's own work, without the time the thread waited for a
	// processor. Operator's figures only, like StatClock.
	StatCPUClock func() time.Duration
	// StatRunDelay, if set, is the time the polling thread has waited
	// on the OS's run queue (runnable, not running), read around each
	// capture after StatCPUClock (SnapWork.CaptureRunDelay): of a
	// capture's wall time, what neither its CPU nor this is, the thread
	// slept (a page fault waiting, or the goroutine waiting for Go's
	// scheduler). Operator's figures only.
	StatRunDelay func() time.Duration
}

// Durability says what a replica keeps on disk (Config.Durability).
type Durability uint8

const (
	// Memory keeps nothing but the stable state: a restarted member
	// catches up from the group and does not vote until then.
	Memory Durability = iota
	// Async: the log trails what is acknowledged by at most about
	// 2 x FsyncInterval; a whole-group crash may lose the entries
	// committed in that window, a restarted member votes only in a
	// recovery election (docs/broadcast.md, "Durability").
	Async
	// Sync: an acknowledgement (AcceptSST) covers only synced records, so
	// a member restarted from its disk is a full voter at once.
	Sync
)

func (d Durability) String() string {
	switch d {
	case Memory:
		return "memory"
	case Async:
		return "async"
	case Sync:
		return "sync"
	}
	return fmt.Sprintf("durability(%d)", uint8(d))
}

// StartMode says how New treats a replica whose Stable holds no state (or
// holds a corrupt one).
type StartMode uint8

// Start modes.
const (
	// StartExisting: the replica must find its stable state; without it
	// New fails with ErrNoStableState, and with a corrupt one with the
	// Stable's error (ErrCorrupt for FileStable). A member that voted
	// before and forgot it could vote twice in an epoch, and one that
	// comes back as a full voter with an empty log can make the group
	// lose committed entries.
	StartExisting StartMode = iota
	// StartNew: a member of a new group, starting for the first time:
	// without stable state it starts as a full voter. With stable state
	// it restarts as usual.
	StartNew
	// StartRejoin: the member lost its stable state (a lost or corrupt
	// disk) and rejoins its group as a catching-up member: with a new
	// incarnation (Config.RejoinIncarnation), it first learns from the
	// rows of a majority of the other members the highest epoch any of
	// them promised or joined, takes it as its E_new (so that no promise
	// it forgot can be broken: every candidate that counted its vote had
	// the votes of a majority, which that majority intersects), and votes
	// and counts as accepting only after a leader's diff caught it up.
	// With stable state it restarts as usual.
	StartRejoin
)

// String returns the mode's name.
func (m StartMode) String() string {
	switch m {
	case StartExisting:
		return "existing"
	case StartNew:
		return "new"
	case StartRejoin:
		return "rejoin"
	}
	return fmt.Sprintf("start(%d)", uint8(m))
}

// EventKind names a protocol milestone.
type EventKind uint8

// Milestones reported to Config.OnEvent.
const (
	// EventElecting: the replica became ELECTING (Acuerdo Fig. 7 l.97).
	EventElecting EventKind = iota + 1
	// EventLeader: the replica won Epoch (Fig. 7 l.117).
	EventLeader
	// EventFollower: the replica accepted Epoch's diff (Fig. 5 l.60).
	EventFollower
	// EventEpochCommitted: Epoch's diff committed here (Fig. 6 l.83): the
	// new epoch's first commit, after which proposals flow again.
	EventEpochCommitted
	// EventRecovered (Async): the replica won a recovery election (its
	// group's members restarted from their disks): Lost entries, at
	// least, that some member saw committed are on no disk of the
	// members it heard; Index is where the group goes on from (the
	// entries its log holds). Log it: it is the "N entries lost" line.
	EventRecovered
	// EventDiskFull (Sync, Async): the replica's log found its disk full
	// (Err says which file): it takes no new entry (rings wait, a leader
	// refuses with ErrDiskFull) and retries the write on its own until
	// space returns; nothing is lost and the replica keeps serving reads.
	// Reported once per episode.
	EventDiskFull
	// EventDiskSpace: the write that found the disk full succeeded: the
	// replica takes entries again (the end of an EventDiskFull episode).
	EventDiskSpace
)

// Event is one protocol milestone.
type Event struct {
	Kind  EventKind
	Epoch Epoch // the epoch concerned (E_cur, or the epoch won)
	// EventRecovered only: a lower bound of the committed entries lost,
	// and the index the group goes on from.
	Lost, Index uint64
	// EventDiskFull only: the log's error (wal.ErrDiskFull and the file).
	Err error
}

// Defaults.
const (
	DefaultRegionBase        rdma.RegionID = 0x1000
	DefaultRingSize                        = 1 << 20
	DefaultHeartbeatInterval               = time.Millisecond
	DefaultElectionTimeout                 = 20 * time.Millisecond
	DefaultMaxLogEntries                   = 1 << 16
	DefaultMaxUncommitted                  = 1 << 14
	DefaultMaxSnapshot                     = 4 << 30
	DefaultMaxPending                      = 1 << 16
	DefaultMaxKeyedClients                 = 1 << 16
	DefaultProposeTimeout                  = 2 * time.Second
	DefaultReconnectMin                    = time.Millisecond
	DefaultReconnectMax                    = 100 * time.Millisecond
	DefaultFsyncInterval                   = 10 * time.Millisecond
)

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if len(c.Members) == 0 {
		return c, fmt.Errorf("broadcast: config: no members: %w", ErrConfig)
	}
	if len(c.Members) > 255 {
		return c, fmt.Errorf("broadcast: config: %d members, at most 255: %w", len(c.Members), ErrConfig)
	}
	seen := map[rdma.NodeID]bool{}
	for _, m := range c.Members {
		if seen[m] {
			return c, fmt.Errorf("broadcast: config: member %d listed twice: %w", m, ErrConfig)
		}
		seen[m] = true
	}
	if !seen[c.Self] {
		return c, fmt.Errorf("broadcast: config: self %d not in members %v: %w", c.Self, c.Members, ErrConfig)
	}
	if c.RegionBase == 0 {
		c.RegionBase = DefaultRegionBase
	}
	if c.RingSize == 0 {
		c.RingSize = DefaultRingSize
	}
	if c.RingSize%8 != 0 || c.RingSize < 4096 {
		return c, fmt.Errorf("broadcast: config: ring size %d must be a multiple of 8 and >= 4096: %w", c.RingSize, ErrConfig)
	}
	if c.MaxRecord == 0 {
		c.MaxRecord = c.RingSize / 8
	}
	if c.MaxRecord < 256 || c.MaxRecord > c.RingSize/4 {
		return c, fmt.Errorf("broadcast: config: max record %d must be in [256, ring size/4]: %w", c.MaxRecord, ErrConfig)
	}
	c.MaxRecord &^= 7
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.ElectionTimeout < 2*c.HeartbeatInterval {
		return c, fmt.Errorf("broadcast: config: election timeout %v must be at least twice the heartbeat interval %v: %w", c.ElectionTimeout, c.HeartbeatInterval, ErrConfig)
	}
	if c.FsyncInterval == 0 {
		c.FsyncInterval = DefaultFsyncInterval
	}
	if c.SnapshotLogBytes <= 0 {
		c.SnapshotLogBytes = 64 << 20
	}
	if c.MaxLogEntries == 0 {
		c.MaxLogEntries = DefaultMaxLogEntries
	}
	if c.MaxCatchUpLogEntries == 0 {
		c.MaxCatchUpLogEntries = 8 * c.MaxLogEntries
	}
	if c.MaxCatchUpLogEntries < c.MaxLogEntries {
		return c, fmt.Errorf("broadcast: config: MaxCatchUpLogEntries %d below MaxLogEntries %d: %w", c.MaxCatchUpLogEntries, c.MaxLogEntries, ErrConfig)
	}
	if c.MaxUncommitted == 0 {
		c.MaxUncommitted = DefaultMaxUncommitted
	}
	if c.MaxSnapshot == 0 {
		c.MaxSnapshot = DefaultMaxSnapshot
	}
	if c.MaxSnapshot < 0 {
		return c, fmt.Errorf("broadcast: config: max snapshot %d is negative: %w", c.MaxSnapshot, ErrConfig)
	}
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.MaxKeyedClients == 0 {
		c.MaxKeyedClients = DefaultMaxKeyedClients
	}
	if c.MaxKeyedClients < 0 {
		return c, fmt.Errorf("broadcast: config: max keyed clients %d is negative: %w", c.MaxKeyedClients, ErrConfig)
	}
	if c.ProposeTimeout == 0 {
		c.ProposeTimeout = DefaultProposeTimeout
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	if c.Seed == 0 {
		c.Seed = uint64(c.Self)*0x9e3779b97f4a7c15 + 1
	}
	if c.Start > StartRejoin {
		return c, fmt.Errorf("broadcast: config: start mode %d unknown: %w", c.Start, ErrConfig)
	}
	switch {
	case c.Durability > Sync:
		return c, fmt.Errorf("broadcast: config: durability %d unknown: %w", c.Durability, ErrConfig)
	case c.Durability != Memory && c.WAL == nil:
		return c, fmt.Errorf("broadcast: config: durability %v needs a WAL: %w", c.Durability, ErrConfig)
	case c.Durability != Memory && c.Snapshots == nil:
		return c, fmt.Errorf("broadcast: config: durability %v needs Snapshots (a network snapshot a diff installs is saved there): %w", c.Durability, ErrConfig)
	case c.FsyncInterval < 0:
		return c, fmt.Errorf("broadcast: config: fsync interval %v is negative: %w", c.FsyncInterval, ErrConfig)
	case c.Durability == Memory && (c.WAL != nil || c.Recovery != nil || c.Snapshots != nil):
		return c, fmt.Errorf("broadcast: config: a WAL or a Recovery with durability memory: %w", ErrConfig)
	}
	if c.Start == StartRejoin && c.RejoinIncarnation == 0 {
		return c, fmt.Errorf("broadcast: config: start mode rejoin needs a RejoinIncarnation above any this member had: %w", ErrConfig)
	}
	return c, nil
}

// Sentinel errors.
var (
	// ErrConfig: the Config is invalid.
	ErrConfig = errors.New("broadcast: invalid config")
	// ErrBusy: too many proposals are waiting; this one was not delivered
	// and will not be, so retrying later is safe.
	ErrBusy = errors.New("broadcast: too many pending proposals")
	// ErrTimeout: the proposal found no leader within ProposeTimeout; it was
	// not delivered and will not be, so retrying is safe.
	ErrTimeout = errors.New("broadcast: proposal timed out without a leader")
	// ErrDiskFull (Sync, Async): the proposal or Append was refused
	// because the group cannot log it: this leader's log found its disk
	// full (wal.ErrDiskFull), or too few members' logs can write for a
	// majority to hold it. It was not delivered and will not be;
	// retrying once space returns is safe (docs/broadcast.md, "A full
	// disk").
	ErrDiskFull = errors.New("broadcast: disk full: the group's logs cannot take new entries")
	// ErrTooLarge: the proposal's data is larger than MaxProposal.
	ErrTooLarge = errors.New("broadcast: proposal larger than the record limit")
	// ErrInvalidKey: ProposeKeyed was given a Key with a zero Client or
	// Seq; the proposal was not submitted.
	ErrInvalidKey = errors.New("broadcast: keyed proposal needs a nonzero Client and Seq")
	// ErrDuplicate: a keyed proposal was delivered, but its Key's Seq is
	// below the last Seq already delivered for its Client, so the FSM did
	// not apply it (and never will: retrying does not help).
	ErrDuplicate = errors.New("broadcast: keyed proposal older than its client's last delivered one")
	// ErrNotLeader: Append was called while the replica does not lead an
	// epoch whose diff committed here (Leading is false).
	ErrNotLeader = errors.New("broadcast: not the leader of a committed epoch")
	// ErrNoStableState: the replica found no stable state and Config.Start
	// is StartExisting (see StartMode).
	ErrNoStableState = errors.New("broadcast: no stable state")
	// ErrStopped: the replica was closed. The proposal's outcome is
	// unknown: it may still be delivered by the rest of the group.
	ErrStopped = errors.New("broadcast: replica stopped")
	// ErrForceRefused is ForceLead's refusal (the error says why); the
	// replica's state did not change.
	ErrForceRefused = errors.New("broadcast: force-lead refused")
)
