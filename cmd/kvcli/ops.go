package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

func runGet(s *session, x *call) int {
	ctx, cancel := x.runCtx()
	defer cancel()
	key := x.args[0]
	out := result{Command: "get", Key: key}
	it, err := s.store().GetItem(ctx, []byte(key), x.consistency)
	if err != nil {
		return s.finish(out, err, x.json)
	}
	out.Value, out.Version, out.Applied = string(it.Value), it.Version, it.Applied
	if x.json {
		s.printJSON(out)
		return exitOK
	}
	s.stdout.Write(append(it.Value, '\n'))
	return exitOK
}

// value is a write's value: the argument, stdin when it is "-" (one-shot
// mode), or --file's contents.
func (s *session) value(x *call, arg string) ([]byte, *usageError) {
	if x.file != "" {
		b, err := os.ReadFile(x.file)
		if err != nil {
			return nil, &usageError{cmd: x.cmd, msg: fmt.Sprintf("%s: read the value: %v", x.cmd.name, err)}
		}
		return b, nil
	}
	if arg != "-" {
		return []byte(arg), nil
	}
	if s.mode != oneShot {
		return nil, &usageError{cmd: x.cmd, msg: x.cmd.name + `: the value "-" reads stdin, which holds the shell's input: use --file F`}
	}
	b, err := io.ReadAll(s.stdin)
	if err != nil {
		return nil, &usageError{cmd: x.cmd, msg: fmt.Sprintf("%s: read the value from stdin: %v", x.cmd.name, err)}
	}
	return b, nil
}

func runPut(s *session, x *call) int {
	arg := ""
	if len(x.args) > 1 {
		arg = x.args[1]
	}
	v, uerr := s.value(x, arg)
	if uerr != nil {
		return s.usage(uerr)
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	w, err := s.store().Put(ctx, []byte(x.args[0]), v)
	return s.finish(result{Command: "put", Key: x.args[0], Version: w.Version, Prev: w.Prev}, err, x.json)
}

func runDel(s *session, x *call) int {
	ctx, cancel := x.runCtx()
	defer cancel()
	var w client.WriteResult
	var err error
	if x.version.set {
		w, err = s.store().CompareAndDelete(ctx, []byte(x.args[0]), x.version.v)
	} else {
		w, err = s.store().Delete(ctx, []byte(x.args[0]))
	}
	return s.finish(result{Command: "del", Key: x.args[0], Version: w.Version, Prev: w.Prev}, err, x.json)
}

func runCAS(s *session, x *call) int {
	key := []byte(x.args[0])
	rest := x.args[1:]
	var old []byte
	if !x.absent && !x.version.set {
		old, rest = []byte(rest[0]), rest[1:]
	}
	arg := ""
	if len(rest) > 0 {
		arg = rest[0]
	}
	nv, uerr := s.value(x, arg)
	if uerr != nil {
		return s.usage(uerr)
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	var w client.WriteResult
	var err error
	if x.version.set {
		w, err = s.store().CompareVersionAndSwap(ctx, key, x.version.v, nv)
	} else {
		w, err = s.store().CompareAndSwap(ctx, key, old, nv) // old nil: --absent
	}
	return s.finish(result{Command: "cas", Key: x.args[0], Version: w.Version, Prev: w.Prev}, err, x.json)
}

// batchResult is what batch prints with --json.
type batchResult struct {
	Command  string            `json:"command"`
	Ops      int               `json:"ops"`
	Versions []uint64          `json:"versions,omitempty"`
	Groups   map[string]uint64 `json:"groups,omitempty"`
	Error    string            `json:"error,omitempty"`
}

func runBatch(s *session, x *call) int {
	var ops []batchOp
	var err error
	switch {
	case x.file != "":
		ops, err = readOps(x.file, nil)
	case len(x.args) == 1 && x.args[0] == "-":
		if s.mode != oneShot {
			return s.usage(&usageError{cmd: x.cmd, msg: `batch: "-" reads stdin, which holds the shell's input: use --file F`})
		}
		ops, err = readOps("stdin", s.stdin)
	default:
		ops, err = parseOps(x.args)
	}
	if s.keyspace != "" {
		return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("batch: not yet on ordered keys (keyspace %q): batches act on the default keyspace only (use alone goes back to it)", s.keyspace)})
	}
	if err == nil && len(ops) == 0 {
		err = errors.New("no ops")
	}
	if err != nil {
		return s.usage(&usageError{cmd: x.cmd, msg: "batch: " + err.Error()})
	}
	var b client.Batch
	for _, op := range ops {
		if op.del {
			b.Delete([]byte(op.key))
		} else {
			b.Put([]byte(op.key), []byte(op.value))
		}
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	r, err := s.c.Commit(ctx, &b)
	out := batchResult{Command: "batch", Ops: len(ops), Versions: r.Versions}
	if len(r.Groups) > 0 {
		out.Groups = map[string]uint64{}
		for g, idx := range r.Groups {
			out.Groups[strconv.FormatUint(uint64(g), 10)] = idx
		}
	}
	if err != nil {
		out.Error = err.Error()
	}
	if x.json {
		s.printJSON(out)
		if err != nil {
			return exitCode(err)
		}
		return exitOK
	}
	if err != nil {
		return s.report(err)
	}
	fmt.Fprintln(s.stdout, "OK")
	return exitOK
}

// readOps reads batch ops from a file (r nil) or from r, one per line.
func readOps(name string, r io.Reader) ([]batchOp, error) {
	var b []byte
	var err error
	if r == nil {
		b, err = os.ReadFile(name)
	} else {
		b, err = io.ReadAll(r)
	}
	if err != nil {
		return nil, err
	}
	var ops []batchOp
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		words, err := splitWords(line)
		if err == nil {
			var o []batchOp
			if o, err = parseOps(words); err == nil && len(o) != 1 {
				err = fmt.Errorf("one op a line, got %d", len(o))
			}
			ops = append(ops, o...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s, line %d: %v", name, n+1, err)
		}
	}
	return ops, nil
}

// watchLine is what watch prints with --json.
type watchLine struct {
	Key     string    `json:"key"`
	Time    time.Time `json:"time"`
	Found   bool      `json:"found"`
	Value   string    `json:"value,omitempty"`
	Version uint64    `json:"version,omitempty"`
	Applied uint64    `json:"applied"`
	Error   string    `json:"error,omitempty"`
}

func runWatch(s *session, x *call) int {
	key := x.args[0]
	var last *watchLine
	var lastApplied uint64
	lastErr := ""
	printed := 0
	t := time.NewTicker(x.interval)
	defer t.Stop()
	for {
		ctx, cancel := x.runCtx()
		it, err := s.store().GetItem(ctx, []byte(key), x.consistency)
		cancel()
		if x.ctx.Err() != nil {
			return exitOK // Ctrl-C: the end of a watch
		}
		now := time.Now()
		switch {
		case err != nil && !errors.Is(err, client.ErrNotFound):
			if err.Error() != lastErr {
				lastErr = err.Error()
				if x.json {
					s.printJSON(watchLine{Key: key, Time: now, Error: lastErr})
				} else {
					fmt.Fprintf(s.stderr, "%s  kvcli: %v (still watching)\n", now.Format(watchTime), err)
				}
			}
		case it.Applied < lastApplied:
			// A stale-ok get that read a replica behind one read
			// before: an older state, not a change.
		default:
			lastErr = ""
			lastApplied = it.Applied
			cur := watchLine{Key: key, Time: now, Found: err == nil, Value: string(it.Value), Version: it.Version, Applied: it.Applied}
			if last != nil && last.Found == cur.Found && last.Version == cur.Version {
				break
			}
			if x.json {
				s.printJSON(cur)
			} else {
				fmt.Fprintf(s.stdout, "%s  %s\n", now.Format(watchTime), describe(last, &cur))
			}
			last = &cur
			printed++
			if x.count > 0 && printed >= x.count {
				return exitOK
			}
		}
		select {
		case <-x.ctx.Done():
			return exitOK
		case <-t.C:
		}
	}
}

const watchTime = "15:04:05.000"

// describe is a watch line's plain text: the version and the value.
func describe(prev, cur *watchLine) string {
	if !cur.Found {
		if prev == nil {
			return "(not found)"
		}
		return "(deleted)"
	}
	v := cur.Value
	if strings.ContainsAny(v, "\n\r\x00") || !isPrintable(v) {
		v = strconv.Quote(v)
	}
	return fmt.Sprintf("v%-8d %s", cur.Version, v)
}

func isPrintable(v string) bool {
	for _, r := range v {
		if !strconv.IsPrint(r) && r != '\t' {
			return false
		}
	}
	return true
}

func runHelp(s *session, x *call) int {
	if len(x.args) == 1 {
		c := lookup(x.args[0])
		if c == nil || c.shell && s.mode == oneShot {
			return s.usage(unknownCommand(x.args[0]))
		}
		commandHelp(s.stdout, c, s.prefix())
		return exitOK
	}
	generalHelp(s.stdout, s.mode != oneShot, s.history)
	if s.mode == oneShot && s.flags != nil {
		var b bytes.Buffer
		s.flags.SetOutput(&b)
		s.flags.PrintDefaults()
		s.stdout.Write(b.Bytes())
	}
	return exitOK
}

func runExit(s *session, x *call) int {
	s.exit = true
	return exitOK
}
