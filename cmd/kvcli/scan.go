package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/rdmakv/rdmakv/client"
)

// store is what get, put, del, cas and watch act on: the client (the
// default, hashed keyspace) or an ordered keyspace chosen with use or
// --keyspace.
type store interface {
	GetItem(ctx context.Context, key []byte, mode client.Consistency) (client.Item, error)
	Put(ctx context.Context, key, value []byte) (client.WriteResult, error)
	Delete(ctx context.Context, key []byte) (client.WriteResult, error)
	CompareAndSwap(ctx context.Context, key, old, value []byte) (client.WriteResult, error)
	CompareVersionAndSwap(ctx context.Context, key []byte, version uint64, value []byte) (client.WriteResult, error)
	CompareAndDelete(ctx context.Context, key []byte, version uint64) (client.WriteResult, error)
}

var (
	_ store = (*client.Client)(nil)
	_ store = (*client.Keyspace)(nil)
)

// store is the keyspace the session's commands act on.
func (s *session) store() store {
	if s.keyspace == "" {
		return s.c
	}
	return s.c.Keyspace(s.keyspace)
}

// keyspaceNames are the ordered keyspaces of the cluster's map (none
// before the client is open).
func (s *session) keyspaceNames() []string {
	if s.c == nil {
		return nil
	}
	var ns []string
	for _, ks := range s.c.Map().Keyspaces {
		ns = append(ns, ks.Name)
	}
	return ns
}

// declared lists the ordered keyspaces for an error message.
func (s *session) declared() string {
	ns := s.keyspaceNames()
	if len(ns) == 0 {
		return "this cluster declares none: add a [[keyspace]] of kind \"ordered\" to its kvserver config"
	}
	return "this cluster's: " + strings.Join(ns, ", ")
}

// checkKeyspace fails (exit 2, naming the declared keyspaces) unless the
// cluster declares the session's keyspace.
func (s *session) checkKeyspace(x *call) int {
	if s.keyspace == "" {
		return exitOK
	}
	if _, err := s.c.Map().FindKeyspace(s.keyspace); err != nil {
		return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("unknown keyspace %q (%s)", s.keyspace, s.declared())})
	}
	return exitOK
}

func runUse(s *session, x *call) int {
	if len(x.args) == 0 {
		s.keyspace = ""
		fmt.Fprintln(s.stdout, "using the default (hashed) keyspace")
	} else {
		if _, err := s.c.Map().FindKeyspace(x.args[0]); err != nil {
			return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("use: unknown keyspace %q (%s)", x.args[0], s.declared())})
		}
		s.keyspace = x.args[0]
		fmt.Fprintf(s.stdout, "using ordered keyspace %q (scan and keys work here; use alone goes back)\n", s.keyspace)
	}
	if s.setPrompt != nil {
		s.setPrompt()
	}
	return exitOK
}

// defaultScanLimit bounds scan and keys unless --limit says otherwise, so
// that a scan of a large keyspace does not flood the terminal.
const defaultScanLimit = 100

// scanLine is what scan and keys print with --json, one line a pair.
type scanLine struct {
	Key     string `json:"key"`
	Value   string `json:"value,omitempty"`
	Version uint64 `json:"version,omitempty"`
}

// scanEnd is the last line scan and keys print with --json.
type scanEnd struct {
	Command string `json:"command"`
	Count   int    `json:"count"`
	More    bool   `json:"more"` // the limit stopped it: the range holds more
	Error   string `json:"error,omitempty"`
}

func runScan(s *session, x *call) int {
	var start, end []byte
	if x.cmd.name == "keys" {
		start = []byte(x.args[0])
		end = prefixEnd(start)
		if len(start) == 0 {
			start = nil
		}
	} else {
		if x.args[0] != "" {
			start = []byte(x.args[0])
		}
		if len(x.args) > 1 && x.args[1] != "" {
			end = []byte(x.args[1])
		}
	}
	if s.keyspace == "" {
		return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("%s needs an ordered keyspace (the default one is hashed, its keys have no order): `use NAME` in the shell or --keyspace NAME (%s)", x.cmd.name, s.declared())})
	}
	if code := s.checkKeyspace(x); code != exitOK {
		return code
	}
	limit := x.limit
	if limit < 0 {
		limit = defaultScanLimit
	}
	opts := []client.ScanOption{}
	if limit > 0 {
		opts = append(opts, client.WithLimit(limit+1)) // one more: whether the range holds more
	}
	if x.reverse {
		opts = append(opts, client.Reverse())
	}
	if x.stale {
		opts = append(opts, client.WithScanConsistency(client.StaleOK))
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	n, more := 0, false
	var err error
	for p, e := range s.c.Keyspace(s.keyspace).Scan(ctx, start, end, opts...) {
		if e != nil {
			err = e
			break
		}
		if limit > 0 && n == limit {
			more = true
			break
		}
		n++
		switch {
		case x.json && x.cmd.name == "keys":
			s.printJSON(scanLine{Key: string(p.Key)})
		case x.json:
			s.printJSON(scanLine{Key: string(p.Key), Value: string(p.Value), Version: p.Version})
		case x.cmd.name == "keys":
			fmt.Fprintln(s.stdout, printable(string(p.Key)))
		default:
			fmt.Fprintf(s.stdout, "%s\t%s\n", printable(string(p.Key)), printable(string(p.Value)))
		}
	}
	if x.json {
		out := scanEnd{Command: x.cmd.name, Count: n, More: more}
		if err != nil {
			out.Error = err.Error()
		}
		s.printJSON(out)
	}
	if err != nil {
		if x.json {
			return exitCode(err)
		}
		return s.report(err)
	}
	if !x.json {
		switch {
		case more && x.limit < 0:
			fmt.Fprintf(s.stderr, "(%d shown, the default limit; there are more: --limit N for more, --limit 0 for all)\n", n)
		case more:
			fmt.Fprintf(s.stderr, "(%d shown, --limit %d; there are more)\n", n, limit)
		case n == 0:
			fmt.Fprintln(s.stderr, "(none)")
		}
	}
	return exitOK
}

// printable quotes s if it holds line breaks, tabs or unprintable bytes.
func printable(v string) string {
	if strings.ContainsAny(v, "\n\r\t\x00") || !isPrintable(v) {
		return strconv.Quote(v)
	}
	return v
}

// prefixEnd is the first key after every key starting with prefix (nil:
// none, the prefix is empty or all 0xff).
func prefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
