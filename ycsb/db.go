// Package ycsb is the go-ycsb (github.com/pingcap/go-ycsb v1.0.1) binding of
// rdmakv: a DB and BatchDB registered as "rdmakv" (import the package for
// its side effect, or call Open).
//
// A YCSB record (a table, a key, and fields with values) is one rdmakv key,
// "<table>/<key>", whose value holds every field as a fielded value
// (package kv/fielded; EncodeFields). The operations map to the client's calls:
//
//   - Read: a get (the rdmakv.consistency property), decoded, with the
//     requested fields; a missing record is an error wrapping
//     client.ErrNotFound.
//   - Insert: a put of the encoded fields (it replaces a record already
//     there, as go-ycsb's other key-value bindings do).
//   - Update: one write, client.UpdateExistingFields: the replicas merge
//     the given fields into the record when they apply it (kv.OpMerge),
//     keeping its other fields. No read, no compare-and-swap: concurrent
//     updates of one record never lose each other's fields, since each
//     group applies them one after the other. A missing record is an
//     error wrapping client.ErrNotFound (the update does not create it); a
//     value that is not a record, one wrapping ErrMalformed. Workload F's
//     read-modify-write is go-ycsb's Read then this Update.
//   - Delete: a delete (of a missing record too, without error).
//   - Scan (rdmakv.keyspace set): a scan of the ordered keyspace from
//     "<table>/<startkey>" to the table's end, at most count records,
//     each decoded with the requested fields. Without rdmakv.keyspace the
//     default keyspace is hashed and Scan returns ErrScanUnsupported.
//   - BatchInsert and BatchDelete: client.Batch commits, atomic within each
//     group (split into several commits when the batch exceeds the
//     cluster's operations or bytes per request). BatchRead: a get per
//     key. BatchUpdate: an Update per key (each one atomic, the batch not).
//
// Properties (besides go-ycsb's own):
//
//	rdmakv.map          the cluster map file (default client.DefaultMapFile,
//	                    where `kvserver` with no arguments writes it)
//	rdmakv.consistency  linearizable (default) or stale-ok, for reads
//	rdmakv.timeout      bound of each operation, retries included (default 10s)
//	rdmakv.keyspace     an ordered keyspace of the cluster (the embedded
//	                    cluster of kvserver declares "ordered"): every
//	                    operation goes there, and Scan works (workload E)
//	rdmakv.combinehold  the client's write-combining hold
//	                    (client.WithCombineHold; unset: the client's default)
//
// With rdmakv.keyspace, the operations use the client's Keyspace calls:
// Update is one blind write there too (Keyspace.UpdateExistingFields, the
// same merge); the Batch calls, with no ordered batches yet, run one
// operation per key. An
// ordered keyspace's values are at most Map().OrderedMaxValue() bytes
// (about 900 with 4 KiB nodes: YCSB's default 10 fields of 100 bytes need
// a node_size of 8192, or smaller fieldcount/fieldlength).
//
// One DB holds one client.Client, shared by every YCSB thread: a client is
// safe for concurrent use, gets run in parallel and concurrent writes are
// combined, and on an shm cluster every client occupies one of the
// cluster's client slots.
package ycsb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/prop"
	goycsb "github.com/pingcap/go-ycsb/pkg/ycsb"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/kv/fielded"
)

// Property names.
const (
	PropMap         = "rdmakv.map"
	PropConsistency = "rdmakv.consistency"
	PropTimeout     = "rdmakv.timeout"
	PropKeyspace    = "rdmakv.keyspace"
	PropCombineHold = "rdmakv.combinehold"
)

// Defaults.
const (
	DefaultConsistency = "linearizable"
	DefaultTimeout     = 10 * time.Second
)

// ErrScanUnsupported is what Scan returns.
var ErrScanUnsupported = errors.New("rdmakv: scans (YCSB workload E) need an ordered keyspace: set -p rdmakv.keyspace=NAME (the embedded cluster of kvserver declares \"ordered\"); the default keyspace is hashed")

// Name is the name the binding is registered under.
const Name = "rdmakv"

func init() {
	goycsb.RegisterDBCreator(Name, creator{})
}

type creator struct{}

// Create opens a client of the cluster the properties name.
func (creator) Create(p *properties.Properties) (goycsb.DB, error) {
	return Open(context.Background(), p)
}

// Config is the binding's configuration, read from the properties.
type Config struct {
	MapFile     string
	Consistency client.Consistency
	Timeout     time.Duration
	Keyspace    string // "": the default (hashed) keyspace
	// CombineHold is the client's write-combining hold
	// (client.WithCombineHold); -1: the client's default.
	CombineHold int
}

// ParseConfig reads the binding's properties (nil p: the defaults).
func ParseConfig(p *properties.Properties) (Config, error) {
	cfg := Config{MapFile: client.DefaultMapFile, Consistency: client.Linearizable, Timeout: DefaultTimeout, CombineHold: -1}
	if p == nil {
		return cfg, nil
	}
	cfg.MapFile = p.GetString(PropMap, client.DefaultMapFile)
	switch s := p.GetString(PropConsistency, DefaultConsistency); s {
	case "linearizable":
		cfg.Consistency = client.Linearizable
	case "stale-ok":
		cfg.Consistency = client.StaleOK
	default:
		return cfg, fmt.Errorf("rdmakv ycsb: %s=%q: want linearizable or stale-ok", PropConsistency, s)
	}
	cfg.Keyspace = p.GetString(PropKeyspace, "")
	if s, ok := p.Get(PropTimeout); ok {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return cfg, fmt.Errorf("rdmakv ycsb: %s=%q: want a positive duration such as 10s", PropTimeout, s)
		}
		cfg.Timeout = d
	}
	if s, ok := p.Get(PropCombineHold); ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("rdmakv ycsb: %s=%q: want 0 (the whole window) or more", PropCombineHold, s)
		}
		cfg.CombineHold = n
	}
	return cfg, nil
}

// Open opens a client of the cluster the properties name (opts come after
// the ones the properties give: client.WithMap, for one, replaces the map
// file) and returns a DB that closes it.
func Open(ctx context.Context, p *properties.Properties, opts ...client.Option) (*DB, error) {
	cfg, err := ParseConfig(p)
	if err != nil {
		return nil, err
	}
	all := []client.Option{
		client.WithMapFile(cfg.MapFile),
		client.WithConsistency(cfg.Consistency),
		client.WithTimeout(cfg.Timeout),
	}
	if cfg.CombineHold >= 0 {
		all = append(all, client.WithCombineHold(cfg.CombineHold))
	}
	all = append(all, opts...)
	c, err := client.Open(ctx, all...)
	if err != nil {
		return nil, err
	}
	if cfg.Keyspace != "" {
		if _, err := c.Map().FindKeyspace(cfg.Keyspace); err != nil {
			c.Close()
			return nil, fmt.Errorf("rdmakv ycsb: %s: %w: %v", PropKeyspace, client.ErrUnknownKeyspace, err)
		}
		if err := checkRecordSize(p, cfg.Keyspace, c.Map().OrderedMaxValue()); err != nil {
			c.Close()
			return nil, err
		}
	}
	db := New(c, cfg)
	db.own = true
	return db, nil
}

// ErrRecordTooLarge: the workload's records (fieldcount fields of
// fieldlength bytes) do not fit an ordered keyspace's values.
var ErrRecordTooLarge = errors.New("rdmakv ycsb: records too large for the ordered keyspace")

// checkRecordSize fails, before anything runs, when the largest record of
// the workload's properties is larger than an ordered keyspace's values
// (go-ycsb would count every insert as an error, without saying why).
func checkRecordSize(p *properties.Properties, keyspace string, limit int) error {
	if p == nil || limit <= 0 {
		return nil
	}
	n := int(p.GetInt64(prop.FieldCount, prop.FieldCountDefault))
	l := int(p.GetInt64(prop.FieldLength, prop.FieldLengthDefault))
	size := func(l int) int {
		rec := make(map[string][]byte, n)
		for i := range n {
			rec[fmt.Sprintf("field%d", i)] = make([]byte, l)
		}
		return EncodedSize(rec)
	}
	if size(l) <= limit {
		return nil
	}
	fits := 0
	for fits < l && size(fits+1) <= limit {
		fits++
	}
	return fmt.Errorf("%w: %d fields of up to %d bytes take %d bytes, and keyspace %q holds values of at most %d: give -p fieldlength=%d (or fewer fields), or declare the keyspace with a larger node_size",
		ErrRecordTooLarge, n, l, size(l), keyspace, limit, fits)
}

// CheckRecordSize is Open's check, for a DB that New makes on c: it fails
// when the records of p do not fit the values of c's ordered keyspace
// (wrapping ErrRecordTooLarge).
func CheckRecordSize(p *properties.Properties, c *client.Client, keyspace string) error {
	return checkRecordSize(p, keyspace, c.Map().OrderedMaxValue())
}

// New returns a DB on a client the caller opened and closes (Close leaves
// it open). cfg.MapFile is not used.
func New(c *client.Client, cfg Config) *DB {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	l := c.Map().Limits
	db := &DB{c: c, cfg: cfg, maxBatch: l.MaxBatch, maxRequest: kv.DefaultMaxRequest(l.MaxKey, l.MaxValue)}
	if cfg.Keyspace != "" {
		db.ks = c.Keyspace(cfg.Keyspace)
	}
	return db
}

// DB is the binding: a goycsb.DB and goycsb.BatchDB.
type DB struct {
	c          *client.Client
	own        bool
	cfg        Config
	maxBatch   int
	maxRequest int
	ks         *client.Keyspace // rdmakv.keyspace's; nil: the default keyspace
}

var (
	_ goycsb.DB      = (*DB)(nil)
	_ goycsb.BatchDB = (*DB)(nil)
)

// Client is the rdmakv client the DB uses.
func (db *DB) Client() *client.Client { return db.c }

// Close closes the client, if Open opened it.
func (db *DB) Close() error {
	if db.own {
		return db.c.Close()
	}
	return nil
}

// InitThread gives the thread's context its own record decoders (the
// threads share the client): a Read through that context decodes with a
// fielded.Selector of the thread, whose map keys are strings it already
// holds, not a string allocated per field of every record.
func (db *DB) InitThread(ctx context.Context, _, _ int) context.Context {
	return context.WithValue(ctx, threadKey{}, &thread{})
}

// threadKey is the context key of a YCSB thread's *thread.
type threadKey struct{}

// thread is what one YCSB thread keeps between its operations (one
// goroutine uses it: a Selector is not safe for concurrent use).
type thread struct {
	all    *fielded.Selector // every field
	sel    *fielded.Selector // the fields of selFor
	selFor []string
}

// decode decodes record v with the requested fields (all if fields is
// empty): through ctx's thread's selectors when ctx came from InitThread,
// else DecodeSelected.
func decode(ctx context.Context, v []byte, fields []string) (map[string][]byte, error) {
	t, _ := ctx.Value(threadKey{}).(*thread)
	if t == nil {
		return fielded.DecodeSelected(v, fields)
	}
	if len(fields) == 0 {
		if t.all == nil {
			t.all = fielded.NewSelector(nil)
		}
		return t.all.Decode(v)
	}
	if t.sel == nil || !slices.Equal(t.selFor, fields) {
		t.sel, t.selFor = fielded.NewSelector(fields), slices.Clone(fields)
	}
	return t.sel.Decode(v)
}

// CleanupThread does nothing.
func (db *DB) CleanupThread(context.Context) {}

// Key is the rdmakv key of a YCSB record.
func Key(table, key string) []byte {
	b := make([]byte, 0, len(table)+1+len(key))
	b = append(b, table...)
	b = append(b, '/')
	return append(b, key...)
}

// Read returns the record's requested fields (all if fields is empty).
func (db *DB) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	var v []byte
	var err error
	if db.ks != nil {
		v, err = db.ks.Get(ctx, Key(table, key))
	} else {
		v, err = db.c.Get(ctx, Key(table, key))
	}
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", table, key, err)
	}
	m, err := decode(ctx, v, fields)
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", table, key, err)
	}
	return m, nil
}

// Scan returns up to count records of table from startkey on, in key
// order, with the requested fields (all if fields is empty). It needs
// rdmakv.keyspace (ErrScanUnsupported without).
func (db *DB) Scan(ctx context.Context, table, startkey string, count int, fields []string) ([]map[string][]byte, error) {
	if db.ks == nil {
		return nil, ErrScanUnsupported
	}
	if count <= 0 {
		return nil, nil
	}
	out := make([]map[string][]byte, 0, count)
	// One Selector for the scan's records: their maps' keys are its
	// strings, not a string allocated per field of every record.
	sel := fielded.NewSelector(fields)
	for p, err := range db.ks.Scan(ctx, Key(table, startkey), tableEnd(table), client.WithLimit(count)) {
		if err != nil {
			return nil, fmt.Errorf("scan %s/%s: %w", table, startkey, err)
		}
		m, err := sel.Decode(p.Value)
		if err != nil {
			return nil, fmt.Errorf("scan %s/%s: record %q: %w", table, startkey, p.Key, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// tableEnd is the first key after every record of table ("<table>0":
// '0' follows '/').
func tableEnd(table string) []byte {
	b := make([]byte, 0, len(table)+1)
	b = append(b, table...)
	return append(b, '/'+1)
}

// valueErr adds, to a value too large for an ordered keyspace, what to do.
func (db *DB) valueErr(err error) error {
	if db.ks != nil && errors.Is(err, client.ErrValueTooLarge) {
		return fmt.Errorf("%w (an ordered keyspace's values live in its tree's nodes: lower fieldcount or fieldlength, or raise the keyspace's node_size)", err)
	}
	return err
}

// Insert stores the record (replacing one already there).
func (db *DB) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	var err error
	if db.ks != nil {
		_, err = db.ks.Put(ctx, Key(table, key), EncodeFields(values))
	} else {
		_, err = db.c.Put(ctx, Key(table, key), EncodeFields(values))
	}
	if err != nil {
		return fmt.Errorf("insert %s/%s: %w", table, key, db.valueErr(err))
	}
	return nil
}

// Update merges values into the record (see the package comment).
func (db *DB) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	if err := db.update(ctx, Key(table, key), values); err != nil {
		return fmt.Errorf("update %s/%s: %w", table, key, err)
	}
	return nil
}

func (db *DB) update(ctx context.Context, k []byte, values map[string][]byte) error {
	if db.ks != nil {
		return db.updateOrdered(ctx, k, values)
	}
	// One blind write: the replicas merge the fields into the record
	// they hold (kv.OpMerge), in their log's order, so concurrent
	// updates keep each other's fields with no read and no retry.
	_, err := db.c.UpdateExistingFields(ctx, k, values)
	if errors.Is(err, client.ErrNotFielded) {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return err
}

// updateOrdered merges values into the record of an ordered keyspace:
// one blind write, as for hashed keys (client.Keyspace's
// UpdateExistingFields: the replicas of the keyspace's group merge the
// fields when they apply it).
func (db *DB) updateOrdered(ctx context.Context, k []byte, values map[string][]byte) error {
	_, err := db.ks.UpdateExistingFields(ctx, k, values)
	if errors.Is(err, client.ErrNotFielded) {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return db.valueErr(err)
}

// Delete removes the record (a missing record is not an error).
func (db *DB) Delete(ctx context.Context, table, key string) error {
	var err error
	if db.ks != nil {
		_, err = db.ks.Delete(ctx, Key(table, key))
	} else {
		_, err = db.c.Delete(ctx, Key(table, key))
	}
	if err != nil {
		return fmt.Errorf("delete %s/%s: %w", table, key, err)
	}
	return nil
}

// BatchInsert stores the records with client.Batch commits: atomic within
// each group, split where the batch exceeds the cluster's limits.
func (db *DB) BatchInsert(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("batch insert: %d keys, %d records", len(keys), len(values))
	}
	if db.ks != nil { // no batches on ordered keys yet: one put each
		for i, key := range keys {
			if err := db.Insert(ctx, table, key, values[i]); err != nil {
				return err
			}
		}
		return nil
	}
	b := db.newBatcher(ctx, "batch insert")
	for i, key := range keys {
		if err := b.add(kv.Op{Kind: kv.OpPut, Key: Key(table, key), Value: EncodeFields(values[i])}); err != nil {
			return err
		}
	}
	return b.flush()
}

// BatchDelete removes the records with client.Batch commits, as
// BatchInsert.
func (db *DB) BatchDelete(ctx context.Context, table string, keys []string) error {
	if db.ks != nil { // no batches on ordered keys yet: one delete each
		for _, key := range keys {
			if err := db.Delete(ctx, table, key); err != nil {
				return err
			}
		}
		return nil
	}
	b := db.newBatcher(ctx, "batch delete")
	for _, key := range keys {
		if err := b.add(kv.Op{Kind: kv.OpDelete, Key: Key(table, key)}); err != nil {
			return err
		}
	}
	return b.flush()
}

// BatchRead reads every record (a get each); a missing one is an error.
func (db *DB) BatchRead(ctx context.Context, table string, keys []string, fields []string) ([]map[string][]byte, error) {
	out := make([]map[string][]byte, len(keys))
	for i, key := range keys {
		m, err := db.Read(ctx, table, key, fields)
		if err != nil {
			return nil, err
		}
		out[i] = m
	}
	return out, nil
}

// BatchUpdate updates every record, one Update each.
func (db *DB) BatchUpdate(ctx context.Context, table string, keys []string, values []map[string][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("batch update: %d keys, %d records", len(keys), len(values))
	}
	for i, key := range keys {
		if err := db.Update(ctx, table, key, values[i]); err != nil {
			return err
		}
	}
	return nil
}

// batcher gathers ops into client.Batch commits that fit the cluster's
// limits (operations per batch, bytes per request).
type batcher struct {
	db   *DB
	ctx  context.Context
	what string
	ops  []kv.Op
	size int // kv.RequestSize(ops)
}

func (db *DB) newBatcher(ctx context.Context, what string) *batcher {
	return &batcher{db: db, ctx: ctx, what: what}
}

var emptyRequest = kv.RequestSize(nil)

func (b *batcher) add(op kv.Op) error {
	n := kv.RequestSize([]kv.Op{op}) - emptyRequest
	if len(b.ops) > 0 && (len(b.ops)+1 > b.db.maxBatch || b.size+n > b.db.maxRequest) {
		if err := b.flush(); err != nil {
			return err
		}
	}
	if len(b.ops) == 0 {
		b.size = emptyRequest
	}
	b.ops = append(b.ops, op)
	b.size += n
	return nil
}

func (b *batcher) flush() error {
	if len(b.ops) == 0 {
		return nil
	}
	var bt client.Batch
	for _, op := range b.ops {
		if op.Kind == kv.OpPut {
			bt.Put(op.Key, op.Value)
		} else {
			bt.Delete(op.Key)
		}
	}
	n := len(b.ops)
	b.ops = b.ops[:0]
	if _, err := b.db.c.Commit(b.ctx, &bt); err != nil {
		return fmt.Errorf("%s of %d records: %w", b.what, n, err)
	}
	return nil
}
