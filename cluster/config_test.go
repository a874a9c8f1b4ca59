package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// exampleDir is a directory holding the example config and its secret.
func exampleDir(t testing.TB) string {
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "secret"), []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestExampleConfig(t *testing.T) {
	d := exampleDir(t)
	path := filepath.Join(d, "cluster.toml")
	if err := os.WriteFile(path, []byte(ExampleConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("the example config does not load: %v", err)
	}
	if string(c.SecretBytes) != "0123456789abcdef0123" {
		t.Errorf("secret %q: want the file's bytes without the newline", c.SecretBytes)
	}
	if c.DataDir != "/var/lib/rdmakv" || time.Duration(c.Timing.Heartbeat) != 10*time.Millisecond || time.Duration(c.Timing.ElectionTimeout) != 150*time.Millisecond {
		t.Errorf("data_dir %q timing %+v", c.DataDir, c.Timing)
	}
	m, err := c.Map()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Groups) != 2 || len(m.Groups[1]) != 3 || m.Groups[1][2] != 6 {
		t.Errorf("groups %v", m.Groups)
	}
	if len(m.ClientNodes) != 16 || m.ClientNodes[0] != ClientIDBase || m.Addrs[m.ClientNodes[15]] != "10.0.0.9:7315" {
		t.Errorf("client nodes %v, last at %q", m.ClientNodes, m.Addrs[m.ClientNodes[15]])
	}
	if m.Addrs[5] != "10.0.0.2:7002" || m.Limits.MaxValue != 1<<20 {
		t.Errorf("addr of 5 %q limits %+v", m.Addrs[5], m.Limits)
	}
	g, i, r, err := c.Replica(5)
	if err != nil || g != 1 || i != 1 || r.Control != "10.0.0.2:7082" {
		t.Errorf("Replica(5) = %d %d %+v %v", g, i, r, err)
	}
	if _, _, _, err := c.Replica(9); err == nil || !strings.Contains(err.Error(), "1, 2, 3, 4, 5, 6") {
		t.Errorf("Replica(9): %v", err)
	}
	if got := c.ReplicaDir(5); got != "/var/lib/rdmakv/replica-5" {
		t.Errorf("ReplicaDir %q", got)
	}
}

const shmConfig = `name = "t"
fabric = "shm"
data_dir = "data"

[[group]]
  [[group.replica]]
  id = 1
  [[group.replica]]
  id = 2
  control = "127.0.0.1:7081"
  [[group.replica]]
  id = 3

[[clients]]
count = 4
`

// configMap is the map of config doc (a file /etc/rdmakv/c.toml); an
// error fails the test.
func configMap(t *testing.T, doc string) *Map {
	t.Helper()
	c, err := ParseConfig([]byte(doc), "/etc/rdmakv/c.toml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Map()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKeyspaceConfig: [[keyspace]] blocks become the map's keyspaces,
// numbered in order, with the ordered tree's geometry, and replicas of
// group 0 own the tree's one tablet.
func TestKeyspaceConfig(t *testing.T) {
	doc := shmConfig + `
[[keyspace]]
name = "users"
kind = "ordered"
node_size = "8KiB"
[[keyspace]]
name = "events"
kind = "ordered"
node_size = "8192"
`
	m := configMap(t, doc)
	want := []Keyspace{{Name: "users", Kind: "ordered", ID: 1, NodeSize: 8192}, {Name: "events", Kind: "ordered", ID: 2, NodeSize: 8192}}
	if !reflect.DeepEqual(m.Keyspaces, want) {
		t.Fatalf("keyspaces %+v, want %+v", m.Keyspaces, want)
	}
	tc, ok := m.OrderedTree()
	if !ok || tc.NodeSize != 8192 || tc.MaxKey != m.OrderedMaxKey()+KeyspacePrefix || m.OrderedMaxValue() <= 0 {
		t.Errorf("tree %+v %v, max value %d", tc, ok, m.OrderedMaxValue())
	}
	m.Groups = append(m.Groups, []rdma.NodeID{9})
	s0, ok0 := m.OrderedStore(0)
	s1, ok1 := m.OrderedStore(1)
	if !ok0 || !ok1 || len(s0.Tablets) != 1 || len(s1.Tablets) != 0 {
		t.Errorf("group 0 tablets %v, group 1 %v", s0.Tablets, s1.Tablets)
	}
	if _, err := m.FindKeyspace("nosuch"); err == nil || !strings.Contains(err.Error(), `"events", "users"`) {
		t.Errorf("unknown keyspace: %v", err)
	}
	// The map travels as JSON to clients.
	m.Groups = m.Groups[:1]
	path := filepath.Join(t.TempDir(), "map.json")
	if err := m.Save(path); err != nil {
		t.Fatal(err)
	}
	m2, err := Load(path)
	if err != nil || !reflect.DeepEqual(m2.Keyspaces, want) {
		t.Fatalf("loaded %+v, %v", m2, err)
	}
	// Keyspace ranges never overlap: each is [ID, ID+1).
	a0, a1 := want[0].Range(nil, nil)
	b0, _ := want[1].Range(nil, nil)
	if string(a0) != "\x01" || string(a1) != "\x02" || string(b0) != "\x02" {
		t.Errorf("ranges %q %q %q", a0, a1, b0)
	}
	if _, e := (Keyspace{ID: 255}).Range(nil, nil); e != nil {
		t.Errorf("the last id's range ends at %q, want no bound", e)
	}
}

func TestShmConfig(t *testing.T) {
	c, err := ParseConfig([]byte(shmConfig), "/etc/rdmakv/c.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/etc/rdmakv/data" || c.ShmDir != "/dev/shm" || c.LogLevel != "info" {
		t.Errorf("data_dir %q shm_dir %q log_level %q", c.DataDir, c.ShmDir, c.LogLevel)
	}
	m, err := c.Map()
	if err != nil {
		t.Fatal(err)
	}
	if m.Fabric != "shm" || m.Addrs != nil || len(m.ClientNodes) != 4 || m.Groups[0][1] != rdma.NodeID(2) {
		t.Errorf("map %+v", m)
	}
}

// TestConfigDurability: a config without durability keeps memory mode
// (and the default fsync interval); the example asks for sync with 64 MiB
// of log between snapshots; async is accepted with its interval.
func TestConfigDurability(t *testing.T) {
	d := exampleDir(t)
	path := filepath.Join(d, "cluster.toml")
	c, err := ParseConfig([]byte(ExampleConfig), path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Durability != DurabilitySync || c.Snapshot.LogBytesN != 64<<20 || time.Duration(c.FsyncInterval) != DefaultFsyncInterval {
		t.Errorf("example: durability %q log_bytes %d fsync_interval %v", c.Durability, c.Snapshot.LogBytesN, time.Duration(c.FsyncInterval))
	}
	// The map tells clients the mode (they hold writes on a sync cluster).
	if m, err := c.Map(); err != nil {
		t.Fatal(err)
	} else if m.Durability != DurabilitySync {
		t.Errorf("example's map: durability %q, want sync", m.Durability)
	}
	old := strings.Replace(ExampleConfig, `durability = "sync"`, ``, 1)
	old = strings.Replace(old, `log_bytes = "64MiB"`, ``, 1)
	if c, err = ParseConfig([]byte(old), path); err != nil {
		t.Fatal(err)
	}
	if c.Durability != DurabilityMemory || c.Snapshot.LogBytesN != 0 {
		t.Errorf("no durability field: durability %q log_bytes %d, want memory and 0", c.Durability, c.Snapshot.LogBytesN)
	}
	if m, err := c.Map(); err != nil {
		t.Fatal(err)
	} else if m.Durability != DurabilityMemory {
		t.Errorf("no durability field's map: durability %q, want memory", m.Durability)
	}
	// A map file's durability is one of the modes (or absent).
	for d, ok := range map[string]bool{"": true, DurabilitySync: true, DurabilityAsync: true, DurabilityMemory: true, "fsync": false} {
		m := &Map{Name: "d", Fabric: "mem", Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{9}, Durability: d}
		if err := m.Fill(); (err == nil) != ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("a map with durability %q: Fill %v, want ok %v", d, err, ok)
		}
	}
	as := strings.Replace(ExampleConfig, `durability = "sync"
# fsync_interval = "10ms"`, `durability = "async"
fsync_interval = "5ms"`, 1)
	if c, err = ParseConfig([]byte(as), path); err != nil {
		t.Fatal(err)
	}
	if c.Durability != DurabilityAsync || time.Duration(c.FsyncInterval) != 5*time.Millisecond {
		t.Errorf("async: durability %q fsync_interval %v", c.Durability, time.Duration(c.FsyncInterval))
	}
}

// TestConfigSettings: wal_layout and spare_p default to per-replica and
// auto (the example leaves them commented out) and take their values.
func TestConfigSettings(t *testing.T) {
	path := filepath.Join(exampleDir(t), "cluster.toml")
	c, err := ParseConfig([]byte(ExampleConfig), path)
	if err != nil {
		t.Fatal(err)
	}
	if c.WALLayout != WALPerReplica || c.SpareP != SparePAuto {
		t.Errorf("example: wal_layout %q spare_p %q, want %q and %q", c.WALLayout, c.SpareP, WALPerReplica, SparePAuto)
	}
	doc := strings.Replace(ExampleConfig, `# wal_layout = "per-replica"`, `wal_layout = "per-replica"`, 1)
	doc = strings.Replace(doc, `# spare_p = "auto"`, `spare_p = "off"`, 1)
	if c, err = ParseConfig([]byte(doc), path); err != nil {
		t.Fatal(err)
	}
	if c.WALLayout != WALPerReplica || c.SpareP != SparePOff {
		t.Errorf("set: wal_layout %q spare_p %q, want %q and %q", c.WALLayout, c.SpareP, WALPerReplica, SparePOff)
	}
	for _, s := range []string{WALPerReplica, WALShared} {
		if err := CheckWALLayout(s); err != nil {
			t.Errorf("CheckWALLayout(%q): %v", s, err)
		}
	}
	if err := CheckWALLayout("Shared"); err == nil || err.Error() != `"Shared": want "per-replica" or "shared"` {
		t.Errorf("CheckWALLayout(Shared): %v", err)
	}
	if err := CheckSpareP("no"); err == nil || err.Error() != `"no": want "auto" or "off"` {
		t.Errorf("CheckSpareP(no): %v", err)
	}
}

// TestConfigErrors checks that each kind of bad config is refused with
// the line and the field at fault.
func TestConfigErrors(t *testing.T) {
	d := exampleDir(t)
	os.WriteFile(filepath.Join(d, "short"), []byte("tooshort"), 0o600)
	ex := func(old, new string) string {
		if !strings.Contains(ExampleConfig, old) {
			t.Fatalf("the example has no %q", old)
		}
		return strings.Replace(ExampleConfig, old, new, 1)
	}
	lineOf := func(doc, s string) int {
		i := strings.Index(doc, s)
		return strings.Count(doc[:i], "\n") + 1
	}
	cases := []struct {
		name, doc  string
		field, msg string
		line       int // 0: the line of at
		at         string
	}{
		{"syntax", ex(`name = "rdmakv"`, `name = "rdmakv`), "", "", 0, `name = "rdmakv`},
		{"unknown field", ex(`max_batch = 1024`, `max_batches = 1024`), "limits.max_batches", "unknown field", 0, "max_batches"},
		{"unknown replica field", ex(`id = 5`, `id = 5
  adr = "x"`), "group.replica.adr", "unknown field", 0, `adr = "x"`},
		{"wrong type", ex(`max_key = 1024`, `max_key = "big"`), "limits.max_key", "", 0, `max_key = "big"`},
		{"bad name", ex(`name = "rdmakv"`, `name = "rd mak"`), "name", "want 1 to 64", 0, `name = "rd mak"`},
		{"bad fabric", ex(`fabric = "tcp"`, `fabric = "rdma"`), "fabric", `"rdma"`, 0, `fabric = "rdma"`},
		{"no data dir", ex(`data_dir = "/var/lib/rdmakv"`, ``), "data_dir", "missing", -1, ""},
		{"missing secret file", ex(`secret_file = "secret"`, `secret_file = "nosuch"`), "secret_file", "no such file", 0, `secret_file = "nosuch"`},
		{"short secret", ex(`secret_file = "secret"`, `secret_file = "short"`), "secret_file", "holds 8 bytes", 0, `secret_file = "short"`},
		{"both secrets", ex(`secret_file = "secret"`, `secret_file = "secret"
secret = "0123456789abcdefgh"`), "secret_file", "not both", 0, `secret_file = "secret"`},
		{"bad duration", ex(`heartbeat = "10ms"`, `heartbeat = "10"`), "timing.heartbeat", "unit", 0, `heartbeat = "10"`},
		{"balance interval", ex(`# [ordered]
# balance_interval = "5s"`, `[ordered]
balance_interval = "10ms"`), "ordered.balance_interval", "want 0 (no balancer)", 0, `balance_interval = "10ms"`},
		{"balance interval unit", ex(`# [ordered]
# balance_interval = "5s"`, `[ordered]
balance_interval = "5"`), "ordered.balance_interval", "unit", 0, `balance_interval = "5"`},
		{"balance min writes negative", ex(`# [ordered]
# balance_interval = "5s"
# balance_min_writes = 1000`, `[ordered]
balance_min_writes = -5`), "ordered.balance_min_writes", "-5: want 1 to 1000000000000 writes a round (0: the default, 1000)", 0, `balance_min_writes = -5`},
		{"balance min writes huge", ex(`# [ordered]
# balance_interval = "5s"
# balance_min_writes = 1000`, `[ordered]
balance_min_writes = 2000000000000`), "ordered.balance_min_writes", "want 1 to 1000000000000", 0, `balance_min_writes = 2000000000000`},
		{"balance min writes type", ex(`# [ordered]
# balance_interval = "5s"
# balance_min_writes = 1000`, `[ordered]
balance_min_writes = "1k"`), "ordered.balance_min_writes", "", 0, `balance_min_writes = "1k"`},
		{"balance split keys one", ex(`# [ordered]
# balance_interval = "5s"
# balance_min_writes = 1000
# balance_split_keys = 64`, `[ordered]
balance_split_keys = 1`), "ordered.balance_split_keys", "1: want 2 to 65536 keys (a tablet of fewer than 2 cannot be cut", 0, `balance_split_keys = 1`},
		{"balance split keys huge", ex(`# [ordered]
# balance_interval = "5s"
# balance_min_writes = 1000
# balance_split_keys = 64`, `[ordered]
balance_interval = "1s"
balance_split_keys = 65537`), "ordered.balance_split_keys", "splits by itself past 65536", 0, `balance_split_keys = 65537`},
		{"balance split keys negative", ex(`# [ordered]
# balance_interval = "5s"
# balance_min_writes = 1000
# balance_split_keys = 64`, `[ordered]
balance_min_writes = 10
balance_split_keys = -64`), "ordered.balance_split_keys", "0: the default, 64", 0, `balance_split_keys = -64`},
		{"wal layout", ex(`# wal_layout = "per-replica"`, `wal_layout = "shard"`), "wal_layout", `"shard": want "per-replica"`, 0, `wal_layout = "shard"`},
		{"wal layout shared", ex(`# wal_layout = "per-replica"`, `wal_layout = "shared"`), "wal_layout", "not built for kvserver --config", 0, `wal_layout = "shared"`},
		{"wal layout memory", ex(`durability = "sync"`, `durability = "memory"
wal_layout = "per-replica"`), "wal_layout", "memory mode keeps no log", 0, `wal_layout = "per-replica"`},
		{"spare p", ex(`# spare_p = "auto"`, `spare_p = "on"`), "spare_p", `"on": want "auto" or "off"`, 0, `spare_p = "on"`},
		{"election too short", ex(`election_timeout = "150ms"`, `election_timeout = "20ms"`), "timing.election_timeout", "4 heartbeats", 0, `election_timeout = "20ms"`},
		{"huge value limit", ex(`max_value = 1048576`, `max_value = 1099511627776`), "limits.max_value", "want 0 to", 0, `max_value = 1099511627776`},
		{"slot size", ex(`slot_size = 4096`, `slot_size = 100`), "limits.slot_size", "multiple of 8", 0, `slot_size = 100`},
		{"duplicate id", ex(`id = 5`, `id = 2`), "group[1].replica[1].id", "also group[0].replica[1]", 0, "id = 2\n  addr = \"10.0.0.2:7002\""},
		{"id zero", ex(`id = 4`, `id = 0`), "group[1].replica[0].id", "want 1 to", 0, "id = 0"},
		{"bad addr", ex(`addr = "10.0.0.3:7002"`, `addr = "10.0.0.3"`), "group[1].replica[2].addr", "host:port", 0, `addr = "10.0.0.3"`},
		{"bad port", ex(`addr = "10.0.0.3:7002"`, `addr = "10.0.0.3:70000"`), "group[1].replica[2].addr", "port", 0, `addr = "10.0.0.3:70000"`},
		{"same addr", ex(`addr = "10.0.0.3:7002"`, `addr = "10.0.0.3:7001"`), "group[1].replica[2].addr", "also group[0].replica[2].addr", 0, "addr = \"10.0.0.3:7001\"\n  control = \"10.0.0.3:7082\""},
		{"control clash", ex(`control = "10.0.0.1:7082"`, `control = "10.0.0.1:7001"`), "group[1].replica[0].control", "also group[0].replica[0].addr", 0, `control = "10.0.0.1:7001"`},
		{"even group", ex(`  [[group.replica]]
  id = 6
  addr = "10.0.0.3:7002"
  control = "10.0.0.3:7082"`, ``), "group[1]", "2 replicas", 0, "[[group]]\n  [[group.replica]]\n  id = 4"},
		{"no clients", ex(`[[clients]]
count = 16
listen = "10.0.0.9:7300"`, ``), "clients", "no [[clients]]", -1, ""},
		{"client ports", ex(`listen = "10.0.0.9:7300"`, `listen = "10.0.0.9:65530"`), "clients[0].listen", "past 65535", 0, `listen = "10.0.0.9:65530"`},
		{"slot gap", ex(`# [[slots]]
# range = "0-511"
# group = 0`, `[[slots]]
range = "0-510"
group = 0
[[slots]]
range = "512-1023"
group = 1`), "slots", "hash slot 511", -1, ""},
		{"slot group", ex(`# [[slots]]
# range = "0-511"
# group = 0`, `[[slots]]
range = "0-1023"
group = 2`), "slots[0].group", "groups 0 to 1", 0, "group = 2"},
		{"slot range", ex(`# [[slots]]
# range = "0-511"
# group = 0`, `[[slots]]
range = "0-2000"
group = 0`), "slots[0].range", "within 0-1023", 0, `range = "0-2000"`},
		{"keyspace kind", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"`, `[[keyspace]]
name = "users"
kind = "sorted"`), "keyspace[0].kind", `"sorted"`, 0, `kind = "sorted"`},
		{"keyspace hashed", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"`, `[[keyspace]]
name = "users"
kind = "hashed"`), "keyspace[0].kind", "not built yet", 0, `kind = "hashed"`},
		{"keyspace name", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"`, `[[keyspace]]
name = "us ers"
kind = "ordered"`), "keyspace[0].name", "want 1 to 64", 0, `name = "us ers"`},
		{"keyspace twice", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"`, `[[keyspace]]
name = "users"
kind = "ordered"
[[keyspace]]
name = "users"
kind = "ordered"`), "keyspace[1].name", "also keyspace[0]", 0, "name = \"users\"\nkind = \"ordered\"\n# node"},
		{"keyspace node size", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"
# node_size = "4KiB"`, `[[keyspace]]
name = "users"
kind = "ordered"
node_size = "100B"`), "keyspace[0].node_size", "multiple of 64", 0, `node_size = "100B"`},
		{"keyspace node sizes differ", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"
# node_size = "4KiB"`, `[[keyspace]]
name = "users"
kind = "ordered"
[[keyspace]]
name = "events"
kind = "ordered"
node_size = "8KiB"`), "keyspace[1].node_size", "shares", 0, `node_size = "8KiB"`},
		{"keyspace node too small", ex(`# [[keyspace]]
# name = "users"
# kind = "ordered"
# node_size = "4KiB"`, `[[keyspace]]
name = "users"
kind = "ordered"
node_size = "256B"`), "keyspace[0].node_size", "too small", 0, `node_size = "256B"`},
		{"bad tree", ex(`log_level = "info"`, `log_level = "info"
tree = "nonsense("`), "tree", "", 0, `tree = "nonsense("`},
		{"bad durability", ex(`durability = "sync"`, `durability = "fsync"`), "durability", `"fsync": want "memory", "sync" or "async"`, 0, `durability = "fsync"`},
		{"fsync interval not async", ex(`# fsync_interval = "10ms"`, `fsync_interval = "10ms"`), "fsync_interval", `only for durability "async"`, 0, `fsync_interval = "10ms"`},
		{"fsync interval too long", ex(`durability = "sync"
# fsync_interval = "10ms"`, `durability = "async"
fsync_interval = "1m"`), "fsync_interval", "want 100µs to 10s", 0, `fsync_interval = "1m"`},
		{"bad snapshot size", ex(`log_bytes = "64MiB"`, `log_bytes = "64 parsecs"`), "snapshot.log_bytes", "want a size", 0, `log_bytes = "64 parsecs"`},
		{"small snapshot size", ex(`log_bytes = "64MiB"`, `log_bytes = "4KiB"`), "snapshot.log_bytes", "at least 1MiB", 0, `log_bytes = "4KiB"`},
		{"snapshot in memory mode", ex(`durability = "sync"`, `durability = "memory"`), "snapshot.log_bytes", "memory mode keeps no snapshots", 0, `log_bytes = "64MiB"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(d, "cluster.toml")
			_, err := ParseConfig([]byte(tc.doc), path)
			if err == nil {
				t.Fatalf("accepted")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v: not a ConfigError wrapping ErrInvalid", err)
			}
			want := tc.line
			if want == 0 {
				want = lineOf(tc.doc, tc.at)
			}
			if want > 0 && ce.Line != want {
				t.Errorf("line %d, want %d: %v", ce.Line, want, err)
			}
			if ce.Field != tc.field {
				t.Errorf("field %q, want %q: %v", ce.Field, tc.field, err)
			}
			if !strings.Contains(ce.Msg, tc.msg) {
				t.Errorf("message %q lacks %q", ce.Msg, tc.msg)
			}
			if !strings.HasPrefix(err.Error(), path+":") || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q: want one line starting with the file name", err)
			}
		})
	}
}

// FuzzParseConfig: any bytes give a valid config or a ConfigError naming
// a line within the document; a valid config's map is valid and names
// every replica of the config.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(ExampleConfig))
	f.Add([]byte(shmConfig))
	f.Add([]byte("name = \"x\"\nfabric = \"shm\"\ndata_dir = \"d\"\n[[group]]\n[[group.replica]]\nid = 1\n[[clients]]\ncount = 1\n"))
	f.Add([]byte("[[group]]\n[[group.replica]]\n[[group]]\n[[group.replica]]\nid = 1\n"))
	f.Add([]byte("a.b.c = 1\n[x.y]\nz = [1, {q = 2}]\n"))
	d := f.TempDir()
	os.WriteFile(filepath.Join(d, "secret"), []byte("0123456789abcdef"), 0o600)
	path := filepath.Join(d, "c.toml")
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b, path)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("%v: not a ConfigError", err)
			}
			if ce.Line < 0 || ce.Line > strings.Count(string(b), "\n")+1 {
				t.Fatalf("line %d of a %d-line document: %v", ce.Line, strings.Count(string(b), "\n")+1, err)
			}
			return
		}
		m, err := c.Map()
		if err != nil {
			t.Fatalf("a valid config's map: %v", err)
		}
		for _, g := range c.Groups {
			for _, r := range g.Replicas {
				if _, _, _, err := c.Replica(r.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := m.Fill(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestConfigBalanceLoadOptions: [ordered] balance_min_writes and
// balance_split_keys default to DefaultBalanceMinWrites and
// DefaultBalanceSplitKeys when absent or 0, and are taken as given
// within their bounds (both ends of each range accepted).
func TestConfigBalanceLoadOptions(t *testing.T) {
	path := filepath.Join(exampleDir(t), "cluster.toml")
	section := "# [ordered]\n# balance_interval = \"5s\"\n# balance_min_writes = 1000\n# balance_split_keys = 64"
	if !strings.Contains(ExampleConfig, section) {
		t.Fatalf("the example has no %q", section)
	}
	for _, tc := range []struct {
		ordered          string
		minWrites, split uint64
	}{
		{"", DefaultBalanceMinWrites, DefaultBalanceSplitKeys},
		{"[ordered]\nbalance_min_writes = 0\nbalance_split_keys = 0", DefaultBalanceMinWrites, DefaultBalanceSplitKeys},
		{"[ordered]\nbalance_min_writes = 1\nbalance_split_keys = 2", 1, 2},
		{"[ordered]\nbalance_min_writes = 1000000000000\nbalance_split_keys = 65536", MaxBalanceMinWrites, MaxBalanceSplitKeys},
		{"[ordered]\nbalance_interval = \"0\"\nbalance_min_writes = 250", 250, DefaultBalanceSplitKeys},
		{"[ordered]\nbalance_split_keys = 500", DefaultBalanceMinWrites, 500},
	} {
		c, err := ParseConfig([]byte(strings.Replace(ExampleConfig, section, tc.ordered, 1)), path)
		if err != nil {
			t.Fatalf("%q: %v", tc.ordered, err)
		}
		if c.BalanceMinWrites() != tc.minWrites || c.BalanceSplitKeys() != tc.split {
			t.Errorf("%q: min writes %d, split keys %d; want %d, %d", tc.ordered, c.BalanceMinWrites(), c.BalanceSplitKeys(), tc.minWrites, tc.split)
		}
	}
}

// TestConfigBalanceInterval: [ordered] balance_interval defaults to
// DefaultBalanceInterval when absent, "0" turns the balancer off, and a
// duration is taken as given.
func TestConfigBalanceInterval(t *testing.T) {
	path := filepath.Join(exampleDir(t), "cluster.toml")
	for _, tc := range []struct {
		doc  string
		want time.Duration
	}{
		{ExampleConfig, DefaultBalanceInterval},
		{strings.Replace(ExampleConfig, "# [ordered]\n# balance_interval = \"5s\"", "[ordered]\nbalance_interval = \"0\"", 1), 0},
		{strings.Replace(ExampleConfig, "# [ordered]\n# balance_interval = \"5s\"", "[ordered]\nbalance_interval = \"2m\"", 1), 2 * time.Minute},
	} {
		c, err := ParseConfig([]byte(tc.doc), path)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.BalanceInterval(); got != tc.want {
			t.Errorf("balance interval %v, want %v", got, tc.want)
		}
	}
}
