package cluster

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// Config is a cluster config: the TOML file every kvserver process of a
// cluster is started with (kvserver --config FILE --id N). It describes
// the whole cluster, so the same file goes to every host; --id picks the
// replica a process runs. Example (kvserver init writes a commented one):
//
//	name = "prod"
//	fabric = "tcp"
//	secret_file = "secret"
//	data_dir = "/var/lib/rdmakv"
//
//	[[group]]
//	  [[group.replica]]
//	  id = 1
//	  addr = "10.0.0.1:7001"
//	  control = "10.0.0.1:7080"
//	  ...
//
//	[[clients]]
//	count = 16
//	listen = "10.0.0.9:7300"
//
// ParseConfig validates every field and names the file, the line and the
// field of the first error it finds.
type Config struct {
	// Name names the cluster ([A-Za-z0-9_-]{1,64}).
	Name string `toml:"name"`
	// Fabric is "tcp" (hosts) or "shm" (processes of one host).
	Fabric string `toml:"fabric"`
	// ShmDir is the shm fabric's directory (default /dev/shm).
	ShmDir string `toml:"shm_dir"`
	// Secret is the cluster secret of the tcp fabric (at least 16
	// bytes); SecretFile names a file holding it instead (relative paths
	// are relative to the config file). Exactly one is required on tcp.
	Secret     string `toml:"secret"`
	SecretFile string `toml:"secret_file"`
	// DataDir holds each replica's stable state, in DataDir/replica-<id>
	// (relative paths are relative to the config file). Required.
	DataDir string `toml:"data_dir"`
	// Durability is what each replica keeps on disk besides its stable
	// state: "memory" (the default: nothing; a group whose replicas all
	// stop loses its data), "sync" (a write is acknowledged once a
	// majority of its group has it on disk) or "async" (written and
	// fsynced at least every FsyncInterval).
	Durability string `toml:"durability"`
	// FsyncInterval bounds how long an async write waits for its fsync
	// (default 10ms; only with durability "async").
	FsyncInterval Duration `toml:"fsync_interval"`
	// WALLayout is how the durable modes lay out the replicas' logs:
	// "per-replica" (the default: each replica its own log in
	// data_dir/replica-<id>/wal). "shared" (one log per process, one
	// fsync for all its replicas) exists only in the embedded cluster
	// (kvserver --wal-layout shared) and is refused here.
	WALLayout string `toml:"wal_layout"`
	// SpareP is the pollers' spare P: "auto" (the default: while a
	// poller's stream is dense the process raises GOMAXPROCS to its
	// pollers + 1 and the pollers hold their P in short parks) or "off"
	// (never: GOMAXPROCS stays, every park gives the P up).
	SpareP string `toml:"spare_p"`
	// Snapshot tunes the disk snapshots of the durable modes.
	Snapshot SnapshotConfig `toml:"snapshot"`
	// Tree is the overlay tree in tree.Parse's form; empty: a chain.
	Tree string `toml:"tree"`
	// LogLevel is debug, info, warn or error (default info).
	LogLevel string `toml:"log_level"`
	// Timing tunes failure detection.
	Timing Timing `toml:"timing"`
	// Limits bound keys, values and requests.
	Limits Limits `toml:"limits"`
	// Groups are the shards, each a list of replicas.
	Groups []GroupConfig `toml:"group"`
	// Clients are the client slots: on tcp each block's slots listen on
	// consecutive ports from Listen (replicas write replies into client
	// memory, so they dial clients); on shm Listen is empty.
	Clients []ClientBlock `toml:"clients"`
	// Slots assigns hash-slot ranges to groups; empty: spread evenly.
	Slots []SlotRange `toml:"slots"`
	// Keyspaces declare named ordered keyspaces ([[keyspace]]).
	Keyspaces []KeyspaceConfig `toml:"keyspace"`
	// Ordered tunes what the cluster does with the ordered keyspaces'
	// tablets by itself ([ordered]).
	Ordered OrderedConfig `toml:"ordered"`

	// Path is the file the config was read from ("" if parsed from
	// bytes with no name).
	Path string `toml:"-"`
	// SecretBytes is the secret, read from Secret or SecretFile.
	SecretBytes []byte `toml:"-"`
}

// SnapshotConfig tunes disk snapshots ([snapshot]; durable modes only).
type SnapshotConfig struct {
	// LogBytes is how much log a replica writes before it takes a disk
	// snapshot and drops the log below it ("64MiB" if empty).
	LogBytes string `toml:"log_bytes"`
	// LogBytesN is LogBytes in bytes (0: the default).
	LogBytesN int64 `toml:"-"`
}

// OrderedConfig is the [ordered] section.
type OrderedConfig struct {
	// BalanceInterval is the pause between the rounds of the tablet
	// balancer (docs/btree.md, "Who decides"), each of which moves at
	// most one tablet; "0" turns the balancer off. Absent:
	// DefaultBalanceInterval.
	BalanceInterval *Duration `toml:"balance_interval"`
	// BalanceMinWrites is the fewest writes (all groups' tablets
	// together) between two rounds for the balancer's rule by load to
	// decide; with fewer, the rule by count does. 0 or absent:
	// DefaultBalanceMinWrites. A value above any round's writes leaves
	// every round to the rule by count.
	BalanceMinWrites int64 `toml:"balance_min_writes"`
	// BalanceSplitKeys is the fewest keys a hot tablet must hold for the
	// rule by load to split it in its group. 0 or absent:
	// DefaultBalanceSplitKeys.
	BalanceSplitKeys int64 `toml:"balance_split_keys"`
}

// Defaults of [ordered] balance_min_writes and balance_split_keys (and
// of client.BalancerConfig's MinWrites and SplitKeys, and the embedded
// cluster's --balance-min-writes and --balance-split-keys), and their
// bounds: a round's writes are compared with at most
// MaxBalanceMinWrites, and a tablet holds at most btree.DefaultTabletMax
// keys (it splits past that by itself), so a larger split_keys would
// never split.
const (
	DefaultBalanceMinWrites = 1000
	DefaultBalanceSplitKeys = 64
	MaxBalanceMinWrites     = 1_000_000_000_000
	MaxBalanceSplitKeys     = btree.DefaultTabletMax
)

// BalanceMinWrites is the balancer's MinWrites: [ordered]
// balance_min_writes, DefaultBalanceMinWrites if absent or 0.
func (c *Config) BalanceMinWrites() uint64 {
	if c.Ordered.BalanceMinWrites <= 0 {
		return DefaultBalanceMinWrites
	}
	return uint64(c.Ordered.BalanceMinWrites)
}

// BalanceSplitKeys is the balancer's SplitKeys: [ordered]
// balance_split_keys, DefaultBalanceSplitKeys if absent or 0.
func (c *Config) BalanceSplitKeys() uint64 {
	if c.Ordered.BalanceSplitKeys <= 0 {
		return DefaultBalanceSplitKeys
	}
	return uint64(c.Ordered.BalanceSplitKeys)
}

// CheckBalanceMinWrites validates a balancer's MinWrites: 0 (the
// default), or 1 to MaxBalanceMinWrites.
func CheckBalanceMinWrites(n int64) error {
	if n < 0 || n > MaxBalanceMinWrites {
		return fmt.Errorf("%d: want 1 to %d writes a round (0: the default, %d)", n, int64(MaxBalanceMinWrites), DefaultBalanceMinWrites)
	}
	return nil
}

// CheckBalanceSplitKeys validates a balancer's SplitKeys: 0 (the
// default), or 2 (a tablet of fewer keys cannot be cut) to
// MaxBalanceSplitKeys.
func CheckBalanceSplitKeys(n int64) error {
	if n == 1 || n < 0 || n > MaxBalanceSplitKeys {
		return fmt.Errorf("%d: want 2 to %d keys (a tablet of fewer than 2 cannot be cut, and one splits by itself past %d; 0: the default, %d)", n, MaxBalanceSplitKeys, MaxBalanceSplitKeys, DefaultBalanceSplitKeys)
	}
	return nil
}

// DefaultBalanceInterval is [ordered] balance_interval's default (and
// the embedded cluster's --balance-interval).
const DefaultBalanceInterval = 5 * time.Second

// BalanceInterval is the tablet balancer's interval: [ordered]
// balance_interval, DefaultBalanceInterval if absent, 0 if off.
func (c *Config) BalanceInterval() time.Duration {
	if c.Ordered.BalanceInterval == nil {
		return DefaultBalanceInterval
	}
	return time.Duration(*c.Ordered.BalanceInterval)
}

// CheckBalanceInterval validates a balancer interval: 0 (off), or 100ms
// to 24h.
func CheckBalanceInterval(d time.Duration) error {
	if d != 0 && (d < 100*time.Millisecond || d > 24*time.Hour) {
		return fmt.Errorf("%v: want 0 (no balancer) or 100ms to 24h", d)
	}
	return nil
}

// Durability modes (Config.Durability).
const (
	DurabilityMemory = "memory"
	DurabilitySync   = "sync"
	DurabilityAsync  = "async"
	// DefaultFsyncInterval is fsync_interval's default.
	DefaultFsyncInterval = 10 * time.Millisecond
)

// Log layouts (Config.WALLayout, kvserver --wal-layout).
const (
	WALPerReplica = "per-replica" // each replica writes a log of its own
	WALShared     = "shared"      // a process's replicas write one log
)

// CheckWALLayout checks a log layout's name: "per-replica" or "shared".
func CheckWALLayout(s string) error {
	if s != WALPerReplica && s != WALShared {
		return fmt.Errorf("%q: want %q or %q", s, WALPerReplica, WALShared)
	}
	return nil
}

// Spare P settings (Config.SpareP, kvserver --spare-p).
const (
	SparePAuto = "auto" // taken while a poller's stream is dense
	SparePOff  = "off"  // never taken
)

// CheckSpareP checks a spare P setting: "auto" or "off".
func CheckSpareP(s string) error {
	if s != SparePAuto && s != SparePOff {
		return fmt.Errorf("%q: want %q or %q", s, SparePAuto, SparePOff)
	}
	return nil
}

// Timing tunes failure detection. Durations are strings such as "10ms".
type Timing struct {
	// Heartbeat is the leader's heartbeat interval (default 10ms).
	Heartbeat Duration `toml:"heartbeat"`
	// ElectionTimeout is how long followers wait for a silent leader
	// before electing another (default 150ms; at least 4 heartbeats).
	ElectionTimeout Duration `toml:"election_timeout"`
	// PeerTimeout is the fabric's dead-peer detection bound, tcp or shm
	// (default the fabric's, 2s).
	PeerTimeout Duration `toml:"peer_timeout"`
}

// Duration is a time.Duration written as a string ("150ms").
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a number with a unit, such as \"150ms\"", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// GroupConfig is one group (shard).
type GroupConfig struct {
	Replicas []ReplicaEntry `toml:"replica"`
}

// ReplicaEntry is one replica of a group.
type ReplicaEntry struct {
	// ID is the replica's node id, unique in the cluster (1..999999).
	ID int64 `toml:"id"`
	// Addr is its fabric address (tcp: host:port it listens on).
	Addr string `toml:"addr"`
	// Control is its HTTP control port (status, metrics, health);
	// empty: none.
	Control string `toml:"control"`
}

// ClientBlock is a block of client slots.
type ClientBlock struct {
	// Count is the number of slots (processes that may be connected at
	// once through this block).
	Count int `toml:"count"`
	// Listen is the first slot's host:port on tcp; slot j of the block
	// listens on port+j. Empty on shm.
	Listen string `toml:"listen"`
}

// SlotRange assigns hash slots First..Last ("0-511" or "7") to Group.
type SlotRange struct {
	Range string `toml:"range"`
	Group int    `toml:"group"`
}

// KeyspaceConfig declares a named keyspace:
//
//	[[keyspace]]
//	name = "users"
//	kind = "ordered"
//	node_size = "4KiB"   # optional, the default (docs/btree.md: why)
//	splits = ["user3", "user6"]   # optional: split points
//	uniform_splits = 8             # optional, instead: 8 tablets over
//	split_prefix = "user"          #   "user" + decimal digits
//
// Keyspaces are numbered 1, 2, ... in the order declared (the number
// prefixes their internal keys): add new ones at the end. Split points
// cut the keyspace into tablets (key ranges), placed round-robin over the
// groups, so that writes to the keyspace spread over the groups: give
// points that cut the keys written into ranges of similar load. With
// uniform_splits = n the points are split_prefix followed by the two
// digits i*100/n, i = 1..n-1 (keys whose digits after the prefix are
// about uniform: YCSB's).
type KeyspaceConfig struct {
	Name          string   `toml:"name"`
	Kind          string   `toml:"kind"`
	NodeSize      string   `toml:"node_size"`
	Splits        []string `toml:"splits"`
	UniformSplits int      `toml:"uniform_splits"`
	SplitPrefix   string   `toml:"split_prefix"`
}

// splits are the keyspace's split points.
func (ks KeyspaceConfig) splits() []string {
	if ks.UniformSplits > 0 {
		return UniformSplits(ks.SplitPrefix, ks.UniformSplits)
	}
	return ks.Splits
}

// Config limits and defaults.
const (
	// MaxNodeID bounds replica ids in a config; client slots take ids
	// from ClientIDBase.
	MaxNodeID = 999_999
	// ClientIDBase is the node id of the first client slot.
	ClientIDBase = 1_000_000
	// MaxClientSlots bounds a config's client slots.
	MaxClientSlots = 4096
	// DefaultHeartbeat and DefaultElectionTimeout are Timing's defaults.
	DefaultHeartbeat       = 10 * time.Millisecond
	DefaultElectionTimeout = 150 * time.Millisecond
	maxConfigBytes         = 1 << 20
)

// ConfigError is a config file's validation error: where and what.
type ConfigError struct {
	Path  string // the file
	Line  int    // 1-based; 0 when the error has no place in the file
	Field string // the field, e.g. group[1].replica[0].addr
	Msg   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if b.Len() == 0 {
		b.WriteString("config")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		fmt.Fprintf(&b, "%s: ", e.Field)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes every ConfigError an ErrInvalid.
func (e *ConfigError) Unwrap() error { return ErrInvalid }

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	b, err := readLimited(f, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return ParseConfig(b, path)
}

func readLimited(f *os.File, n int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, int64(n)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > n {
		return nil, fmt.Errorf("larger than %d bytes", n)
	}
	return b, nil
}

// ParseConfig parses and validates a config's bytes; path names the file
// in errors and anchors relative paths (data_dir, secret_file). Errors are
// *ConfigError (wrapping ErrInvalid) naming the line and field, or an
// error reading the secret file.
func ParseConfig(data []byte, path string) (*Config, error) {
	var c Config
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, decodeError(err, path, data)
	}
	c.Path = path
	pos := keyLines(data)
	v := validator{c: &c, pos: pos, path: path}
	if err := v.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// decodeError turns go-toml's errors into a ConfigError.
func decodeError(err error, path string, data []byte) error {
	var de *toml.DecodeError
	var sm *toml.StrictMissingError
	switch {
	case errors.As(err, &sm) && len(sm.Errors) > 0:
		e := sm.Errors[0]
		line, _ := e.Position()
		return &ConfigError{Path: path, Line: line, Field: strings.Join(e.Key(), "."), Msg: "unknown field (see kvserver init for the fields a config has)"}
	case errors.As(err, &de):
		line, _ := de.Position()
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		field := strings.Join(de.Key(), ".")
		if field == "" && line > 0 {
			field = fieldAt(data, line)
		}
		return &ConfigError{Path: path, Line: line, Field: field, Msg: msg}
	}
	return &ConfigError{Path: path, Msg: err.Error()}
}

// keyLines maps each key of the document, named as validation errors
// name fields (group[1].replica[0].addr, limits.max_key), to its line.
// Tables ([limits], [[group]]) map to the line of their header.
func keyLines(data []byte) map[string]int {
	pos := map[string]int{}
	var p unstable.Parser
	p.Reset(data)
	counts := map[string]int{}
	table := ""
	keyOf := func(it unstable.Iterator) []string {
		var ks []string
		for it.Next() {
			ks = append(ks, string(it.Node().Data))
		}
		return ks
	}
	// resolve names an array table path with its current indexes:
	// group.replica -> group[2].replica.
	resolve := func(ks []string) string {
		var b strings.Builder
		for i, k := range ks {
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(k)
			if i < len(ks)-1 {
				if n, ok := counts[b.String()]; ok {
					fmt.Fprintf(&b, "[%d]", n-1)
				}
			}
		}
		return b.String()
	}
	for p.NextExpression() {
		e := p.Expression()
		line := p.Shape(e.Raw).Start.Line
		switch e.Kind {
		case unstable.Table:
			table = resolve(keyOf(e.Key()))
			if line == 0 {
				line = lineOfKey(&p, e)
			}
			pos[table] = line
		case unstable.ArrayTable:
			base := resolve(keyOf(e.Key()))
			counts[base]++
			table = fmt.Sprintf("%s[%d]", base, counts[base]-1)
			pos[table] = lineOfKey(&p, e)
		case unstable.KeyValue:
			k := strings.Join(keyOf(e.Key()), ".")
			if table != "" {
				k = table + "." + k
			}
			pos[k] = lineOfKey(&p, e)
		}
	}
	return pos
}

// fieldAt names the key on line (for go-toml's errors that do not).
func fieldAt(data []byte, line int) (field string) {
	defer func() {
		if recover() != nil { // the document parsed already; be safe anyway
			field = ""
		}
	}()
	for k, l := range keyLines(data) {
		if l == line && len(k) > len(field) {
			field = k
		}
	}
	return field
}

func lineOfKey(p *unstable.Parser, e *unstable.Node) int {
	it := e.Key()
	if it.Next() {
		if l := p.Shape(it.Node().Raw).Start.Line; l > 0 {
			return l
		}
	}
	return p.Shape(e.Raw).Start.Line
}

type validator struct {
	c    *Config
	pos  map[string]int
	path string
}

// fail is the error of field f; its line is f's, or its nearest
// enclosing table's.
func (v *validator) fail(f, format string, a ...any) error {
	line := 0
	for k := f; k != ""; {
		if l, ok := v.pos[k]; ok {
			line = l
			break
		}
		i := strings.LastIndexAny(k, ".[")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	return &ConfigError{Path: v.path, Line: line, Field: f, Msg: fmt.Sprintf(format, a...)}
}

func (v *validator) validate() error {
	c := v.c
	if !nameRE.MatchString(c.Name) {
		return v.fail("name", "%q: want 1 to 64 of A-Z a-z 0-9 _ -", c.Name)
	}
	switch c.Fabric {
	case "tcp", "shm":
	case "":
		return v.fail("fabric", "missing: want \"tcp\" (hosts) or \"shm\" (one host)")
	default:
		return v.fail("fabric", "%q: want \"tcp\" (hosts) or \"shm\" (one host)", c.Fabric)
	}
	if c.Fabric == "shm" {
		if c.ShmDir == "" {
			c.ShmDir = "/dev/shm"
		}
	} else if c.ShmDir != "" {
		return v.fail("shm_dir", "only for fabric \"shm\"")
	}
	if c.DataDir == "" {
		return v.fail("data_dir", "missing: each replica keeps its stable state (votes, epochs), and its log and snapshots in the durable modes, in data_dir/replica-<id>")
	}
	c.DataDir = v.rel(c.DataDir)
	switch c.LogLevel {
	case "":
		c.LogLevel = "info"
	case "debug", "info", "warn", "error":
	default:
		return v.fail("log_level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	if err := v.secret(); err != nil {
		return err
	}
	if err := v.timing(); err != nil {
		return err
	}
	if err := CheckBalanceInterval(c.BalanceInterval()); err != nil {
		return v.fail("ordered.balance_interval", "%v", err)
	}
	if err := CheckBalanceMinWrites(c.Ordered.BalanceMinWrites); err != nil {
		return v.fail("ordered.balance_min_writes", "%v", err)
	}
	if err := CheckBalanceSplitKeys(c.Ordered.BalanceSplitKeys); err != nil {
		return v.fail("ordered.balance_split_keys", "%v", err)
	}
	if err := v.durability(); err != nil {
		return err
	}
	if err := v.limits(); err != nil {
		return err
	}
	if err := v.groups(); err != nil {
		return err
	}
	if err := v.clients(); err != nil {
		return err
	}
	if err := v.slots(); err != nil {
		return err
	}
	if err := v.keyspaces(); err != nil {
		return err
	}
	if _, err := c.Map(); err != nil {
		if c.Tree != "" && strings.Contains(err.Error(), "tree") {
			return v.fail("tree", "%v", err)
		}
		return &ConfigError{Path: v.path, Msg: err.Error()}
	}
	return nil
}

func (v *validator) rel(p string) string {
	if p == "" || filepath.IsAbs(p) || v.path == "" {
		return p
	}
	return filepath.Join(filepath.Dir(v.path), p)
}

func (v *validator) secret() error {
	c := v.c
	if c.Fabric == "shm" {
		if c.Secret != "" || c.SecretFile != "" {
			return v.fail(map[bool]string{true: "secret", false: "secret_file"}[c.Secret != ""], "only for fabric \"tcp\" (shm is protected by the permissions of shm_dir)")
		}
		return nil
	}
	switch {
	case c.Secret != "" && c.SecretFile != "":
		return v.fail("secret_file", "give secret or secret_file, not both")
	case c.Secret == "" && c.SecretFile == "":
		return v.fail("secret_file", "missing: the tcp fabric needs a cluster secret of at least %d bytes (secret_file, or secret)", tcp.MinSecret)
	case c.Secret != "":
		c.SecretBytes = []byte(c.Secret)
		if len(c.SecretBytes) < tcp.MinSecret {
			return v.fail("secret", "%d bytes: want at least %d", len(c.SecretBytes), tcp.MinSecret)
		}
		return nil
	}
	c.SecretFile = v.rel(c.SecretFile)
	b, err := os.ReadFile(c.SecretFile)
	if err != nil {
		return v.fail("secret_file", "%v", err)
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) < tcp.MinSecret {
		return v.fail("secret_file", "%s holds %d bytes: want at least %d", c.SecretFile, len(b), tcp.MinSecret)
	}
	c.SecretBytes = b
	return nil
}

func (v *validator) timing() error {
	t := &v.c.Timing
	if t.Heartbeat == 0 {
		t.Heartbeat = Duration(DefaultHeartbeat)
	}
	if t.ElectionTimeout == 0 {
		t.ElectionTimeout = Duration(DefaultElectionTimeout)
	}
	switch {
	case t.Heartbeat < Duration(100*time.Microsecond) || t.Heartbeat > Duration(10*time.Second):
		return v.fail("timing.heartbeat", "%v: want 100µs to 10s", time.Duration(t.Heartbeat))
	case t.ElectionTimeout < 4*t.Heartbeat:
		return v.fail("timing.election_timeout", "%v: want at least 4 heartbeats (%v)", time.Duration(t.ElectionTimeout), 4*time.Duration(t.Heartbeat))
	case t.ElectionTimeout > Duration(time.Minute):
		return v.fail("timing.election_timeout", "%v: want at most 1m", time.Duration(t.ElectionTimeout))
	case t.PeerTimeout < 0 || (t.PeerTimeout != 0 && t.PeerTimeout < Duration(10*time.Millisecond)):
		return v.fail("timing.peer_timeout", "%v: want at least 10ms", time.Duration(t.PeerTimeout))
	}
	return nil
}

func (v *validator) durability() error {
	c := v.c
	switch c.Durability {
	case "":
		c.Durability = DurabilityMemory
	case DurabilityMemory, DurabilitySync, DurabilityAsync:
	default:
		return v.fail("durability", "%q: want \"memory\", \"sync\" or \"async\"", c.Durability)
	}
	switch {
	case c.FsyncInterval != 0 && c.Durability != DurabilityAsync:
		return v.fail("fsync_interval", "only for durability \"async\" (durability is %q)", c.Durability)
	case c.FsyncInterval == 0:
		c.FsyncInterval = Duration(DefaultFsyncInterval)
	case c.FsyncInterval < Duration(100*time.Microsecond) || c.FsyncInterval > Duration(10*time.Second):
		return v.fail("fsync_interval", "%v: want 100µs to 10s", time.Duration(c.FsyncInterval))
	}
	switch {
	case c.WALLayout != "" && c.Durability == DurabilityMemory:
		return v.fail("wal_layout", "only for durability \"sync\" or \"async\" (memory mode keeps no log)")
	case c.WALLayout == "":
		c.WALLayout = WALPerReplica
	case c.WALLayout == WALShared:
		return v.fail("wal_layout", "%q: not built for kvserver --config yet (one log per process is the embedded cluster's: kvserver --wal-layout shared); want %q", c.WALLayout, WALPerReplica)
	case c.WALLayout != WALPerReplica:
		return v.fail("wal_layout", "%q: want %q (\"shared\" is the embedded cluster's only)", c.WALLayout, WALPerReplica)
	}
	if c.SpareP == "" {
		c.SpareP = SparePAuto
	} else if err := CheckSpareP(c.SpareP); err != nil {
		return v.fail("spare_p", "%v", err)
	}
	if c.Snapshot.LogBytes != "" {
		if c.Durability == DurabilityMemory {
			return v.fail("snapshot.log_bytes", "only for durability \"sync\" or \"async\" (memory mode keeps no snapshots on disk)")
		}
		n, err := ParseByteSize(c.Snapshot.LogBytes)
		if err != nil {
			return v.fail("snapshot.log_bytes", "%v", err)
		}
		if n < 1<<20 {
			return v.fail("snapshot.log_bytes", "%s: want at least 1MiB (and at most 1024MiB)", c.Snapshot.LogBytes)
		}
		c.Snapshot.LogBytesN = int64(n)
	}
	return nil
}

// Upper bounds of the limits a config may set.
const (
	maxMaxKey   = 64 << 10
	maxMaxValue = 64 << 20
	maxSlotSize = 1 << 20
	maxBatch    = 1 << 16
)

func (v *validator) limits() error {
	l := &v.c.Limits
	switch {
	case l.MaxKey < 0 || l.MaxKey > maxMaxKey:
		return v.fail("limits.max_key", "%d: want 1 to %d bytes", l.MaxKey, maxMaxKey)
	case l.MaxValue < 0 || l.MaxValue > maxMaxValue:
		return v.fail("limits.max_value", "%d: want 0 to %d bytes", l.MaxValue, maxMaxValue)
	case l.SlotSize != 0 && (l.SlotSize < 256 || l.SlotSize%8 != 0 || l.SlotSize > maxSlotSize):
		return v.fail("limits.slot_size", "%d: want a multiple of 8 from 256 to %d", l.SlotSize, maxSlotSize)
	case l.ClientSlots < 0 || l.ClientSlots > 1024:
		return v.fail("limits.client_slots", "%d: want 1 to 1024 outstanding requests per client", l.ClientSlots)
	case l.MaxBatch < 0 || l.MaxBatch > maxBatch:
		return v.fail("limits.max_batch", "%d: want 1 to %d operations", l.MaxBatch, maxBatch)
	case l.ClientRate < 0 || l.ClientRate > 1e9 || l.ClientRate != l.ClientRate:
		return v.fail("limits.client_rate", "%v: want 0 (no bound) to 1e9 write requests per second per client", l.ClientRate)
	}
	return nil
}

func (v *validator) groups() error {
	c := v.c
	if len(c.Groups) == 0 {
		return v.fail("group", "no [[group]]: a cluster needs at least one group of replicas")
	}
	ids := map[int64]string{}
	addrs := map[string]string{}
	for g, gr := range c.Groups {
		gf := fmt.Sprintf("group[%d]", g)
		if n := len(gr.Replicas); n == 0 || n%2 == 0 {
			return v.fail(gf, "%d replicas: want an odd number (1, 3, 5, ...): a group needs a majority", n)
		}
		for i, r := range gr.Replicas {
			f := fmt.Sprintf("%s.replica[%d]", gf, i)
			if r.ID < 1 || r.ID > MaxNodeID {
				return v.fail(f+".id", "%d: want 1 to %d", r.ID, MaxNodeID)
			}
			if w, ok := ids[r.ID]; ok {
				return v.fail(f+".id", "%d is also %s's id", r.ID, w)
			}
			ids[r.ID] = f
			if c.Fabric == "tcp" {
				if err := checkHostPort(r.Addr); err != nil {
					return v.fail(f+".addr", "%v", err)
				}
				if w, ok := addrs[r.Addr]; ok {
					return v.fail(f+".addr", "%s is also %s's address", r.Addr, w)
				}
				addrs[r.Addr] = f + ".addr"
			} else if r.Addr != "" {
				return v.fail(f+".addr", "only for fabric \"tcp\" (shm replicas are named by id)")
			}
			if r.Control != "" {
				if err := checkHostPort(r.Control); err != nil {
					return v.fail(f+".control", "%v", err)
				}
				if w, ok := addrs[r.Control]; ok {
					return v.fail(f+".control", "%s is also %s", r.Control, w)
				}
				addrs[r.Control] = f + ".control"
			}
		}
	}
	return nil
}

func checkHostPort(a string) error {
	if a == "" {
		return errors.New("missing: want host:port")
	}
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q: want host:port", a)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q: want 1 to 65535", a, p)
	}
	if h == "" {
		return fmt.Errorf("%q: want a host (every member dials it)", a)
	}
	return nil
}

func (v *validator) clients() error {
	c := v.c
	if len(c.Clients) == 0 {
		return v.fail("clients", "no [[clients]]: a cluster needs client slots (count, and listen on tcp)")
	}
	total := 0
	for b, cb := range c.Clients {
		f := fmt.Sprintf("clients[%d]", b)
		if cb.Count < 1 || cb.Count > MaxClientSlots {
			return v.fail(f+".count", "%d: want 1 to %d", cb.Count, MaxClientSlots)
		}
		total += cb.Count
		if c.Fabric == "tcp" {
			if err := checkHostPort(cb.Listen); err != nil {
				return v.fail(f+".listen", "%v", err)
			}
			_, p, _ := net.SplitHostPort(cb.Listen)
			if n, _ := strconv.Atoi(p); n+cb.Count-1 > 65535 {
				return v.fail(f+".listen", "ports %d to %d: past 65535", n, n+cb.Count-1)
			}
		} else if cb.Listen != "" {
			return v.fail(f+".listen", "only for fabric \"tcp\"")
		}
	}
	if total > MaxClientSlots {
		return v.fail("clients", "%d client slots: want at most %d", total, MaxClientSlots)
	}
	return nil
}

func (v *validator) slots() error {
	c := v.c
	if len(c.Slots) == 0 {
		return nil
	}
	owner := make([]int, kv.NumHashSlots)
	for i := range owner {
		owner[i] = -1
	}
	for k, s := range c.Slots {
		f := fmt.Sprintf("slots[%d]", k)
		lo, hi, err := parseRange(s.Range)
		if err != nil {
			return v.fail(f+".range", "%v", err)
		}
		if s.Group < 0 || s.Group >= len(c.Groups) {
			return v.fail(f+".group", "%d: the config has groups 0 to %d", s.Group, len(c.Groups)-1)
		}
		for i := lo; i <= hi; i++ {
			if owner[i] >= 0 {
				return v.fail(f+".range", "hash slot %d is also in slots[%d]", i, owner[i])
			}
			owner[i] = k
		}
	}
	for i, o := range owner {
		if o < 0 {
			return v.fail("slots", "hash slot %d is assigned no group (the ranges must cover 0-%d)", i, kv.NumHashSlots-1)
		}
	}
	return nil
}

func (v *validator) keyspaces() error {
	c := v.c
	if len(c.Keyspaces) > MaxKeyspaces {
		return v.fail("keyspace", "%d keyspaces: want at most %d", len(c.Keyspaces), MaxKeyspaces)
	}
	seen := map[string]int{}
	size := 0
	for k, ks := range c.Keyspaces {
		f := fmt.Sprintf("keyspace[%d]", k)
		if !nameRE.MatchString(ks.Name) {
			return v.fail(f+".name", "%q: want 1 to 64 of A-Z a-z 0-9 _ -", ks.Name)
		}
		if o, ok := seen[ks.Name]; ok {
			return v.fail(f+".name", "%q is also keyspace[%d]'s name", ks.Name, o)
		}
		seen[ks.Name] = k
		switch ks.Kind {
		case KindOrdered:
		case KindHashed:
			return v.fail(f+".kind", "named hashed keyspaces are not built yet: the default keyspace is hashed; want \"ordered\"")
		case "":
			return v.fail(f+".kind", "missing: want \"ordered\"")
		default:
			return v.fail(f+".kind", "%q: want \"ordered\"", ks.Kind)
		}
		n := btree.DefaultConfig.NodeSize
		if ks.NodeSize != "" {
			var err error
			if n, err = ParseByteSize(ks.NodeSize); err != nil {
				return v.fail(f+".node_size", "%v", err)
			}
			if err := (btree.Config{NodeSize: n, MaxKey: 1}).Validate(); err != nil {
				return v.fail(f+".node_size", "%s: want a multiple of 64 from %d to %d bytes", ks.NodeSize, btree.MinNodeSize, btree.MaxNodeSize)
			}
		}
		switch {
		case ks.UniformSplits != 0 && len(ks.Splits) > 0:
			return v.fail(f+".uniform_splits", "give splits or uniform_splits, not both")
		case ks.UniformSplits < 0 || ks.UniformSplits > 100:
			return v.fail(f+".uniform_splits", "%d: want 1 to 100 tablets", ks.UniformSplits)
		case ks.SplitPrefix != "" && ks.UniformSplits == 0:
			return v.fail(f+".split_prefix", "goes with uniform_splits")
		}
		for j, sp := range ks.splits() {
			if sp == "" || j > 0 && sp <= ks.splits()[j-1] {
				return v.fail(f+".splits", "%q: want non-empty split points in increasing order", sp)
			}
		}
		if k > 0 && n != size {
			return v.fail(f+".node_size", "%d bytes: every ordered keyspace shares the groups' tree, and keyspace[0]'s nodes are %d bytes", n, size)
		}
		size = n
	}
	if len(c.Keyspaces) > 0 {
		m := Map{Limits: c.Limits, Keyspaces: []Keyspace{{NodeSize: size}}}
		cfg, _ := m.OrderedTree()
		if err := cfg.Validate(); err != nil {
			return v.fail("keyspace[0].node_size", "%d bytes: too small for ordered keys of %d bytes (limits.max_key, capped at %d)", size, m.OrderedMaxKey(), DefaultOrderedMaxKey)
		}
	}
	return nil
}

func parseRange(s string) (lo, hi int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || lo < 0 || hi < lo || hi >= kv.NumHashSlots {
		return 0, 0, fmt.Errorf("%q: want \"first-last\" or \"slot\" within 0-%d", s, kv.NumHashSlots-1)
	}
	return lo, hi, nil
}

// Map is the cluster map the config describes (clients use it; the
// secret is not part of it).
func (c *Config) Map() (*Map, error) {
	m := &Map{Name: c.Name, Fabric: c.Fabric, ShmDir: c.ShmDir, Tree: c.Tree, Limits: c.Limits, Durability: c.Durability}
	if c.Fabric == "tcp" {
		m.Addrs = map[rdma.NodeID]string{}
	}
	for _, g := range c.Groups {
		var ms []rdma.NodeID
		for _, r := range g.Replicas {
			ms = append(ms, rdma.NodeID(r.ID))
			if m.Addrs != nil {
				m.Addrs[rdma.NodeID(r.ID)] = r.Addr
			}
		}
		m.Groups = append(m.Groups, ms)
	}
	id := rdma.NodeID(ClientIDBase)
	for _, cb := range c.Clients {
		host, port := "", 0
		if cb.Listen != "" {
			var p string
			host, p, _ = net.SplitHostPort(cb.Listen)
			port, _ = strconv.Atoi(p)
		}
		for j := range cb.Count {
			m.ClientNodes = append(m.ClientNodes, id)
			if m.Addrs != nil {
				m.Addrs[id] = net.JoinHostPort(host, strconv.Itoa(port+j))
			}
			id++
		}
	}
	if len(c.Slots) > 0 {
		m.Slots = make([]uint32, kv.NumHashSlots)
		for _, s := range c.Slots {
			lo, hi, err := parseRange(s.Range)
			if err != nil {
				return nil, err
			}
			for i := lo; i <= hi; i++ {
				m.Slots[i] = uint32(s.Group)
			}
		}
	}
	for k, ks := range c.Keyspaces {
		n := 0
		if ks.NodeSize != "" {
			var err error
			if n, err = ParseByteSize(ks.NodeSize); err != nil {
				return nil, err
			}
		}
		m.Keyspaces = append(m.Keyspaces, Keyspace{Name: ks.Name, Kind: ks.Kind, ID: uint8(k + 1), NodeSize: n, Splits: ks.splits()})
	}
	if err := m.Fill(); err != nil {
		return nil, err
	}
	return m, nil
}

// Replica finds replica id: its group, its index in the group and its
// entry.
func (c *Config) Replica(id int64) (g, i int, r ReplicaEntry, err error) {
	var all []string
	for g, gr := range c.Groups {
		for i, r := range gr.Replicas {
			if r.ID == id {
				return g, i, r, nil
			}
			all = append(all, strconv.FormatInt(r.ID, 10))
		}
	}
	sort.Strings(all)
	return 0, 0, ReplicaEntry{}, fmt.Errorf("replica %d is not in %s (its replicas: %s)", id, c.where(), strings.Join(all, ", "))
}

func (c *Config) where() string {
	if c.Path == "" {
		return "the config"
	}
	return c.Path
}

// ReplicaDir is replica id's state directory.
func (c *Config) ReplicaDir(id int64) string {
	return filepath.Join(c.DataDir, fmt.Sprintf("replica-%d", id))
}

// ExampleConfig is the commented config `kvserver init` writes.
//
//go:embed example.toml
var ExampleConfig string
