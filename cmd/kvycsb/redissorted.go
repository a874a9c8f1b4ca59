package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/go-redis/redis/v9"
	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/prop"
	goycsb "github.com/pingcap/go-ycsb/pkg/ycsb"
)

// redisSortedName is the go-ycsb name of the Redis baseline of workload
// E: what a Redis user would write to scan YCSB records, since go-ycsb's
// redis binding cannot.
const redisSortedName = "redis-sorted"

// redisSorted is a go-ycsb DB on one Redis server (redis.mode=single,
// go-ycsb's default). A record is a hash, "<table>/<key>", written and
// read with the commands of go-ycsb's redis binding (redis.datatype=hash:
// HSET of the fields, HMGET of the requested ones), so that reads and
// updates cost what they cost there. Besides, each table has a sorted
// set, "<table>:index" (no record key has that form: theirs have a '/'
// after the table), whose members are the table's keys with score 0, so
// that ZRANGEBYLEX returns them in byte order, the order of rdmakv's
// ordered keyspace:
//
//   - Insert: MULTI, HSET <table>/<key> fields..., ZADD <table>:index 0
//     <key>, EXEC. One round trip, as a plain pipeline would be, and
//     atomic: no other client sees the hash without its index entry or
//     the entry without its hash, and a failed connection leaves neither
//     (a pipeline can stop between the two commands). Redis executes a
//     transaction's commands together, so the cost over a pipeline is
//     the two extra commands' parsing.
//   - Delete: MULTI, DEL <table>/<key>, ZREM <table>:index <key>, EXEC.
//   - Update: HSET of the given fields (the index already has the key).
//   - Read: HMGET of the requested fields; a record with none of them
//     (a missing hash) is an error (go-ycsb's binding returns no fields
//     and no error).
//   - Scan: ZRANGEBYLEX <table>:index [<startkey> + LIMIT 0 <count>
//     (one round trip), then an HGETALL per key, pipelined (a second
//     round trip), each record filtered to the requested fields. A key
//     deleted between the two (its hash gone) is left out.
//
// Two round trips per scan: one Lua script could make it one, but a
// script is not what the baseline (and most Redis users) would
// write.
type redisSorted struct {
	c     *goredis.Client
	knobs redisSortedKnobs // planted bugs, tests only
}

// redisSortedKnobs are the planted bugs of redisSorted's tests; the zero
// value is the correct DB.
type redisSortedKnobs struct {
	// skipIndexAdd: Insert writes the hash without its index entry.
	// Caught by TestRedisSortedPlanted (scans miss inserted records).
	skipIndexAdd bool
	// skipIndexRem: Delete leaves the key in the index. Caught by
	// TestRedisSortedPlanted (a scan returns fewer records than it could,
	// the deleted key taking a place of its LIMIT).
	skipIndexRem bool
}

var _ goycsb.DB = (*redisSorted)(nil)

type redisSortedCreator struct{}

func init() {
	goycsb.RegisterDBCreator(redisSortedName, redisSortedCreator{})
}

// Create connects as go-ycsb's redis binding does in single mode: the
// same redis.* properties and defaults, a pool of threadcount
// connections kept open.
func (redisSortedCreator) Create(p *properties.Properties) (goycsb.DB, error) {
	if m := p.GetString("redis.mode", "single"); m != "single" {
		return nil, fmt.Errorf("%s: redis.mode=%s: only single (its transactions span a record and its table's index, which a cluster may place in different slots)", redisSortedName, m)
	}
	if dt := p.GetString("redis.datatype", "hash"); dt != "hash" {
		return nil, fmt.Errorf("%s: redis.datatype=%s: records are hashes only", redisSortedName, dt)
	}
	o := &goredis.Options{
		Addr:            p.GetString("redis.addr", "localhost:6379"),
		DB:              p.GetInt("redis.db", 0),
		Network:         p.GetString("redis.network", "tcp"),
		Username:        p.GetString("redis.username", ""),
		MaxRetries:      p.GetInt("redis.max_retries", 0),
		MinRetryBackoff: p.GetDuration("redis.min_retry_backoff", 8*time.Millisecond),
		MaxRetryBackoff: p.GetDuration("redis.max_retry_backoff", 512*time.Millisecond),
		DialTimeout:     p.GetDuration("redis.dial_timeout", 5*time.Second),
		ReadTimeout:     p.GetDuration("redis.read_timeout", 3*time.Second),
		PoolSize:        p.GetInt("redis.pool_size", 0),
		ConnMaxLifetime: p.GetDuration("redis.max_conn_age", -1),
		ConnMaxIdleTime: p.GetDuration("redis.idle_timeout", -1),
	}
	o.Password, _ = p.Get("redis.password")
	o.WriteTimeout = p.GetDuration("redis.write_timeout", o.ReadTimeout)
	if o.PoolSize == 0 {
		o.PoolSize = p.GetInt(prop.ThreadCount, 1)
	}
	o.MinIdleConns = p.GetInt("redis.min_idle_conns", o.PoolSize)
	o.MaxIdleConns = p.GetInt("redis.max_idle_conns", o.PoolSize)
	o.PoolTimeout = p.GetDuration("redis.pool_timeout", time.Second+o.ReadTimeout)
	c := goredis.NewClient(o)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", redisSortedName, err)
	}
	if p.GetBool(prop.DropData, prop.DropDataDefault) {
		if err := c.FlushDB(ctx).Err(); err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w", redisSortedName, err)
		}
	}
	return &redisSorted{c: c}, nil
}

func redisRecordKey(table, key string) string { return table + "/" + key }
func redisIndexKey(table string) string       { return table + ":index" }

func (r *redisSorted) Close() error { return r.c.Close() }

func (r *redisSorted) InitThread(ctx context.Context, _, _ int) context.Context { return ctx }

func (r *redisSorted) CleanupThread(context.Context) {}

// errRedisNotFound: a read of a record that is not there.
var errRedisNotFound = errors.New("record not found")

func (r *redisSorted) Read(ctx context.Context, table, key string, fields []string) (map[string][]byte, error) {
	if len(fields) == 0 {
		m, err := r.c.HGetAll(ctx, redisRecordKey(table, key)).Result()
		if err != nil {
			return nil, fmt.Errorf("read %s/%s: %w", table, key, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("read %s/%s: %w", table, key, errRedisNotFound)
		}
		return bytesMap(m, nil), nil
	}
	args := make([]any, 0, len(fields)+2)
	args = append(args, "HMGET", redisRecordKey(table, key))
	for _, f := range fields {
		args = append(args, f)
	}
	vals, err := r.c.Do(ctx, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", table, key, err)
	}
	out := make(map[string][]byte, len(fields))
	for i, v := range vals {
		if s, ok := v.(string); ok && i < len(fields) {
			out[fields[i]] = []byte(s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("read %s/%s: %w", table, key, errRedisNotFound)
	}
	return out, nil
}

// bytesMap is m with []byte values, only fields if given.
func bytesMap(m map[string]string, fields []string) map[string][]byte {
	if len(fields) == 0 {
		out := make(map[string][]byte, len(m))
		for k, v := range m {
			out[k] = []byte(v)
		}
		return out
	}
	out := make(map[string][]byte, len(fields))
	for _, f := range fields {
		if v, ok := m[f]; ok {
			out[f] = []byte(v)
		}
	}
	return out
}

func (r *redisSorted) Scan(ctx context.Context, table, startKey string, count int, fields []string) ([]map[string][]byte, error) {
	if count <= 0 {
		return nil, nil
	}
	keys, err := r.c.ZRangeByLex(ctx, redisIndexKey(table), &goredis.ZRangeBy{Min: "[" + startKey, Max: "+", Count: int64(count)}).Result()
	if err != nil {
		return nil, fmt.Errorf("scan %s/%s: ZRANGEBYLEX: %w", table, startKey, err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := r.c.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HGetAll(ctx, redisRecordKey(table, k))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("scan %s/%s: HGETALL: %w", table, startKey, err)
	}
	out := make([]map[string][]byte, 0, len(keys))
	for _, c := range cmds {
		m := c.Val()
		if len(m) == 0 {
			continue // deleted since the ZRANGEBYLEX
		}
		out = append(out, bytesMap(m, fields))
	}
	return out, nil
}

// hsetArgs is go-ycsb's redis binding's HSET of a record's fields.
func hsetArgs(table, key string, values map[string][]byte) []any {
	args := make([]any, 0, 2*len(values)+2)
	args = append(args, "HSET", redisRecordKey(table, key))
	for f, v := range values {
		args = append(args, f, string(v))
	}
	return args
}

func (r *redisSorted) Update(ctx context.Context, table, key string, values map[string][]byte) error {
	if err := r.c.Do(ctx, hsetArgs(table, key, values)...).Err(); err != nil {
		return fmt.Errorf("update %s/%s: %w", table, key, err)
	}
	return nil
}

func (r *redisSorted) Insert(ctx context.Context, table, key string, values map[string][]byte) error {
	_, err := r.c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Do(ctx, hsetArgs(table, key, values)...)
		if !r.knobs.skipIndexAdd {
			p.ZAdd(ctx, redisIndexKey(table), goredis.Z{Score: 0, Member: key})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("insert %s/%s: %w", table, key, err)
	}
	return nil
}

func (r *redisSorted) Delete(ctx context.Context, table, key string) error {
	_, err := r.c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Del(ctx, redisRecordKey(table, key))
		if !r.knobs.skipIndexRem {
			p.ZRem(ctx, redisIndexKey(table), key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete %s/%s: %w", table, key, err)
	}
	return nil
}

// isRedisDB says whether a --db or dbEnv name is a Redis binding.
func isRedisDB(name string) bool { return strings.HasPrefix(name, "redis") }
