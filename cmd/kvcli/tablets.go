package main

import (
	"fmt"
	"strconv"
	"strings"
)

// Tablets of the ordered keyspaces: list them, move, split or balance
// them, collect the keys of dropped ones
// (docs/btree.md, "Moving a tablet").

// fence prints a tablet fence (an internal key): min for the empty
// one (the start of the key order; max is its end), else KEYSPACE:KEY (the key quoted when it holds unprintable
// bytes), or the bytes in hex for an id no keyspace has.
func (s *session) fence(k []byte) string {
	if len(k) == 0 {
		return "min"
	}
	for _, ks := range s.c.Map().Keyspaces {
		if ks.ID == k[0] {
			key := string(k[1:])
			if strings.ContainsFunc(key, func(r rune) bool { return !strconv.IsPrint(r) || r == ' ' }) {
				key = strconv.Quote(key)
			}
			return ks.Name + ":" + key
		}
	}
	return fmt.Sprintf("0x%x", k)
}

// parseFence is fence's inverse: min (or ""), or KEYSPACE:KEY (KEY
// quoted or not).
func (s *session) parseFence(f string) ([]byte, error) {
	if f == "min" || f == "" {
		return []byte{}, nil
	}
	name, key, ok := strings.Cut(f, ":")
	if !ok {
		return nil, fmt.Errorf("want min or KEYSPACE:KEY (as tablets prints the first column), got %q", f)
	}
	ks, err := s.c.Map().FindKeyspace(name)
	if err != nil {
		return nil, err
	}
	if uq, err := strconv.Unquote(key); err == nil {
		key = uq
	}
	return ks.InternalKey(nil, []byte(key)), nil
}

// tabletLine is what tablets prints with --json, one object a tablet.
type tabletLine struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Group uint32 `json:"group"`
	State string `json:"state"`
	Dest  uint32 `json:"moving_to,omitempty"`
	Gen   uint64 `json:"gen"`
	// Keys and Writes: the tablet's load as its group published it
	// (absent when it could not be read with the tablets).
	Keys   *uint64 `json:"keys,omitempty"`
	Writes *uint64 `json:"writes,omitempty"`
}

func runTablets(s *session, x *call) int {
	ctx, cancel := x.runCtx()
	defer cancel()
	tbs, err := s.c.Tablets(ctx)
	if err != nil {
		return s.report(err)
	}
	for _, tb := range tbs {
		hi := "max"
		if !tb.HighInf {
			hi = s.fence(tb.High)
		}
		l := tabletLine{From: s.fence(tb.Low), To: hi, Group: tb.Group, State: tb.State, Gen: tb.Gen}
		if tb.State == "frozen" {
			l.Dest = tb.To
		}
		if tb.HasLoad {
			l.Keys, l.Writes = &tb.Keys, &tb.Writes
		}
		if x.json {
			s.printJSON(l)
			continue
		}
		st := tb.State
		if tb.State == "frozen" {
			st = fmt.Sprintf("frozen (moving to group %d)", tb.To)
		}
		load := ""
		if tb.HasLoad {
			load = fmt.Sprintf("\t%s, %s", plural(int(tb.Keys), "key"), plural(int(tb.Writes), "write"))
		}
		fmt.Fprintf(s.stdout, "%s\t%s\tgroup %d\t%s%s\n", l.From, l.To, tb.Group, st, load)
	}
	// Each group's garbage (keys of tablets it dropped, not deleted
	// yet) as it published it, when not 0; a group whose count could
	// not be read is left out.
	if gs, err := s.c.GroupGarbage(ctx); err == nil {
		for g, n := range gs {
			if n <= 0 {
				continue
			}
			if x.json {
				s.printJSON(garbageLine{Group: uint32(g), Garbage: uint64(n)})
				continue
			}
			fmt.Fprintf(s.stdout, "group %d\t%s (of dropped tablets; collect deletes them)\n", g, plural(int(n), "garbage key"))
		}
	}
	return exitOK
}

// garbageLine is what tablets prints with --json after the tablets, for
// each group with garbage keys.
type garbageLine struct {
	Group   uint32 `json:"group"`
	Garbage uint64 `json:"garbage"`
}

// parseGroup parses a group id of the cluster (for cmd's usage error).
func (s *session) parseGroup(cmd, arg string) (uint32, error) {
	g, err := strconv.ParseUint(arg, 10, 32)
	if err != nil || int(g) >= len(s.c.Map().Groups) {
		return 0, fmt.Errorf("%s: group %q: want 0..%d", cmd, arg, len(s.c.Map().Groups)-1)
	}
	return uint32(g), nil
}

func runMoveTablet(s *session, x *call) int {
	low, err := s.parseFence(x.args[0])
	if err != nil {
		return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("move-tablet: %v", err)})
	}
	g, err := s.parseGroup("move-tablet", x.args[1])
	if err != nil {
		return s.usage(&usageError{cmd: x.cmd, msg: err.Error()})
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	err = s.c.MoveTablet(ctx, low, g)
	return s.finish(result{Command: "move-tablet", Key: x.args[0]}, err, x.json)
}

func runAbortMove(s *session, x *call) int {
	low, err := s.parseFence(x.args[0])
	if err != nil {
		return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("abort-move: %v", err)})
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	err = s.c.AbortTabletMove(ctx, low)
	return s.finish(result{Command: "abort-move", Key: x.args[0]}, err, x.json)
}

func runSplitTablet(s *session, x *call) int {
	low, err := s.parseFence(x.args[0])
	if err != nil {
		return s.usage(&usageError{cmd: x.cmd, msg: fmt.Sprintf("split-tablet: %v", err)})
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	err = s.c.SplitTablet(ctx, low)
	return s.finish(result{Command: "split-tablet", Key: x.args[0]}, err, x.json)
}

// collectLine is what collect prints with --json, one object a group.
type collectLine struct {
	Command   string `json:"command"`
	Group     uint32 `json:"group"`
	Reclaimed uint64 `json:"reclaimed"`
	Left      uint64 `json:"left"`
	Error     string `json:"error,omitempty"`
}

// runCollect collects the garbage of one group or of each in turn; a
// group that fails is reported and the others are still collected (the
// exit code is the first failure's).
func runCollect(s *session, x *call) int {
	groups := make([]uint32, len(s.c.Map().Groups))
	for g := range groups {
		groups[g] = uint32(g)
	}
	if len(x.args) == 1 {
		g, err := s.parseGroup("collect", x.args[0])
		if err != nil {
			return s.usage(&usageError{cmd: x.cmd, msg: err.Error()})
		}
		groups = []uint32{g}
	}
	ctx, cancel := x.runCtx()
	defer cancel()
	code := exitOK
	for _, g := range groups {
		left, deleted, err := s.c.CollectGarbageCount(ctx, g)
		c := exitOK
		if err != nil {
			c = exitCode(err)
		}
		if code == exitOK {
			code = c
		}
		switch {
		case x.json:
			l := collectLine{Command: "collect", Group: g, Reclaimed: deleted, Left: left}
			if err != nil {
				l.Error = err.Error()
			}
			s.printJSON(l)
		case err != nil:
			fmt.Fprintf(s.stdout, "group %d: %s reclaimed before the error, %d left\n", g, plural(int(deleted), "key"), left)
			s.report(err)
		default:
			fmt.Fprintf(s.stdout, "group %d: %s reclaimed\n", g, plural(int(deleted), "key"))
		}
		if ctx.Err() != nil {
			break // the timeout or Ctrl-C: the other groups would fail alike
		}
	}
	return code
}

func runBalance(s *session, x *call) int {
	ctx, cancel := x.runCtx()
	defer cancel()
	n, err := s.c.Balance(ctx, 0)
	if x.json {
		out := struct {
			Command string `json:"command"`
			Moves   int    `json:"moves"`
			Error   string `json:"error,omitempty"`
		}{Command: "balance", Moves: n}
		code := exitOK
		if err != nil {
			out.Error, code = err.Error(), exitCode(err)
		}
		s.printJSON(out)
		return code
	}
	if err != nil {
		fmt.Fprintf(s.stdout, "%s before the error\n", plural(n, "move"))
		return s.report(err)
	}
	fmt.Fprintf(s.stdout, "%s\n", plural(n, "move"))
	return exitOK
}
