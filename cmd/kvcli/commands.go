package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// A command of kvcli: the same table serves one-shot mode, the shell, its
// help and its tab completion.
type command struct {
	name    string
	args    string // the synopsis after the flags, e.g. "KEY VALUE"
	summary string // one line, for `help`
	help    string // more, for `help NAME`
	flags   []string
	cluster bool // needs a client (everything but help, exit, quit)
	shell   bool // only in the shell (exit, quit)
	run     func(s *session, x *call) int
}

// call is one parsed command line.
type call struct {
	cmd  *command
	args []string
	ctx  context.Context // the session's: Ctrl-C ends it
	opts
}

// opts are the per-command flags; each command registers the ones in its
// flags list, with the session's defaults (the global flags).
type opts struct {
	json        bool
	consistency client.Consistency
	timeout     time.Duration
	file        string
	absent      bool
	version     versionFlag
	interval    time.Duration
	count       int
	limit       int // scan, keys: -1 is the default limit, 0 none
	reverse     bool
	stale       bool
}

// versionFlag is --version N: whether it was given, and N.
type versionFlag struct {
	set bool
	v   uint64
}

func (f *versionFlag) String() string {
	if !f.set {
		return ""
	}
	return strconv.FormatUint(f.v, 10)
}

func (f *versionFlag) Set(s string) error {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("want a version number (0: the key has no value)")
	}
	f.set, f.v = true, v
	return nil
}

// consistencyFlag parses linearizable or stale-ok.
type consistencyFlag struct{ c *client.Consistency }

func (f consistencyFlag) String() string {
	if f.c == nil {
		return ""
	}
	return f.c.String()
}

func (f consistencyFlag) Set(s string) error {
	c, err := parseConsistency(s)
	if err == nil {
		*f.c = c
	}
	return err
}

func parseConsistency(s string) (client.Consistency, error) {
	switch s {
	case "linearizable":
		return client.Linearizable, nil
	case "stale-ok":
		return client.StaleOK, nil
	}
	return 0, fmt.Errorf("want linearizable or stale-ok")
}

// flagHelp describes each per-command flag: its argument name and text.
var flagHelp = map[string][2]string{
	"json":        {"", "print the result as one line of JSON"},
	"consistency": {"MODE", "gets: linearizable (read the leader) or stale-ok (the nearest replica, may lag)"},
	"timeout":     {"D", "bound on the command, retries included (watch: on each get)"},
	"file":        {"F", "read the value from file F instead of the command line"},
	"absent":      {"", "cas: store only if the key has no value (cas --absent KEY NEW)"},
	"version":     {"N", "compare the key's version instead of its value (0: no value)"},
	"interval":    {"D", "watch: time between gets"},
	"count":       {"N", "watch: stop after printing N states (0: until Ctrl-C)"},
	"limit":       {"N", "scan, keys: print at most N pairs (default 100; 0: all)"},
	"reverse":     {"", "scan: in descending key order (with --limit N: the last N of the range)"},
	"stale":       {"", "scan, keys: read the nearest replica (may lag) instead of the leader"},
}

// flagValues are what tab completion offers after a flag.
var flagValues = map[string][]string{
	"consistency": {"linearizable", "stale-ok"},
}

var commands []*command

func init() {
	commands = []*command{
		{name: "get", args: "KEY", cluster: true, flags: []string{"consistency", "json", "timeout"},
			summary: "print KEY's value",
			help: `Prints the value, followed by a newline; --json adds the version and the
applied index of the replica read. A key with no value prints (not found) on
stderr and exits 1. --consistency stale-ok reads the nearest replica, which
may lag behind the leader.`,
			run: runGet},
		{name: "put", args: "KEY VALUE", cluster: true, flags: []string{"file", "json", "timeout"},
			summary: "store VALUE under KEY (VALUE -: stdin; --file F: a file)",
			help: `Stores VALUE under KEY and prints OK. The value is the argument, or stdin
when it is - (one-shot mode only), or the contents of file F with --file F
(then give KEY alone). --json prints the version the put gave the key and
the version it replaced (prev_version, absent if the key had none).`,
			run: runPut},
		{name: "del", args: "KEY", cluster: true, flags: []string{"version", "json", "timeout"},
			summary: "delete KEY (--version N: only if its version is N)",
			help: `Deletes KEY and prints OK (a key with no value is not an error; --json's
prev_version says whether it had one). With --version N the delete happens
only if the key's version is N; otherwise it exits 3 (mismatch).`,
			run: runDel},
		{name: "cas", args: "KEY OLD NEW", cluster: true, flags: []string{"absent", "version", "file", "json", "timeout"},
			summary: "store NEW if KEY's value is OLD (--absent: if it has none; --version N)",
			help: `Compare-and-swap: stores NEW under KEY if the key's value is OLD, and
prints OK; otherwise it writes nothing and exits 3 (mismatch).
  cas KEY OLD NEW            compare the value
  cas --absent KEY NEW       store only if KEY has no value
  cas --version N KEY NEW    compare the version (get --json shows it; 0: no value)
NEW may be - (stdin, one-shot mode only), or given with --file F (then leave
it out).`,
			run: runCAS},
		{name: "batch", args: "OP...", cluster: true, flags: []string{"file", "json", "timeout"},
			summary: "apply puts and deletes atomically: batch put K V put K V del K ...",
			help: `Applies a list of operations at once. Each OP is "put KEY VALUE" or
"del KEY":
  batch put user:1 alice put user:2 bob del user:3
With --file F (or a single argument -, stdin, in one-shot mode) the ops are
read from the file instead, one per line in the same words, quoted as in the
shell; blank lines and lines starting with # are skipped.
Each group applies its share of the batch atomically: no reader sees part of
it in one group. Keys in several groups are applied by each group in the same
order as any other batch they share; once OK is printed every get sees all of
it. --json prints each op's version and each group's entry index.`,
			run: runBatch},
		{name: "status", cluster: true, flags: []string{"json", "timeout"},
			summary: "every replica's state: reachable, leader, epoch, applied index, lag, table size",
			help: `Reads every replica's table header one-sided (the memory gets read; no
server CPU) and prints, per group, its leader and epoch and, per replica:
whether it is reachable (or why not), its role, the epoch it serves, the
epoch it promised, the last entry it applied and when, how many entries it
is behind the most advanced replica, and its index's size. Exits 0 when
every group has a leader confirmed by a majority, 4 otherwise.`,
			run: runStatus},
		{name: "leaders", cluster: true, flags: []string{"json", "timeout"},
			summary: "each group's leader",
			help: `Prints each group's leader (the replica serving linearizable gets) and its
epoch, as status reads it. Exits 0 when every group has a leader confirmed
by a majority, 4 otherwise.`,
			run: runLeaders},
		{name: "watch", args: "KEY", cluster: true, flags: []string{"interval", "count", "consistency", "json", "timeout"},
			summary: "print KEY's value and every change of it, until Ctrl-C",
			help: `Gets KEY every --interval (one-sided reads: cheap for the servers) and
prints its value when it changes, with its version and the time seen:
  12:00:01.250  v65536  hello
  12:00:04.500  v131072 (deleted)
Changes that happen between two gets are not seen. Ctrl-C ends it (exit 0);
--count N ends it after N lines. With --json each line is a JSON object.
Errors (a group without a leader for longer than --timeout) are printed and
the watch goes on.`,
			run: runWatch},
		{name: "scan", args: "FROM [TO]", cluster: true, flags: []string{"limit", "reverse", "stale", "json", "timeout"},
			summary: "an ordered keyspace's pairs with FROM <= key < TO, in key order",
			help: `Prints the pairs of the ordered keyspace chosen with use (or --keyspace)
whose keys are FROM or after and before TO, one a line: KEY, a tab, VALUE
(quoted when they hold tabs, line breaks or unprintable bytes). FROM "" is
the first key; no TO (or "") runs to the last. --reverse prints them in
descending order (with a limit: the last N of the range). Flags may come
after the arguments too: scan a z --limit 10.
At most 100 pairs unless --limit N says otherwise (--limit 0: all of them;
the scan streams, Ctrl-C stops it); when the limit cut the scan short, a
note on stderr says so. --json prints one object a pair, then
{"command":"scan","count":N,"more":BOOL}. Each page of 128 pairs is one
linearizable read of the leader (--stale: of the nearest replica, which may
lag); a write between two pages shows in the later one only.`,
			run: runScan},
		{name: "keys", args: "PREFIX", cluster: true, flags: []string{"limit", "stale", "json", "timeout"},
			summary: "an ordered keyspace's keys starting with PREFIX, in order",
			help: `Prints the keys of the ordered keyspace chosen with use (or --keyspace)
that start with PREFIX ("": every key), one a line: a scan of
[PREFIX, PREFIX+1). At most 100 unless --limit N says otherwise (0: all).`,
			run: runScan},
		{name: "tablets", cluster: true, flags: []string{"json", "timeout"},
			summary: "the ordered keyspaces' tablets: key ranges and the group serving each",
			help: `Reads every group's tablets afresh and prints one a line: its first key, the
key it ends before, its group and its state (serving; frozen while a move
to another group runs: writes to it wait; installing: being moved in).
Keys print as KEYSPACE:KEY; min and max are the ends of the key order.`,
			run: runTablets},
		{name: "move-tablet", args: "FROM GROUP", cluster: true, flags: []string{"json", "timeout"},
			summary: "move the tablet starting at FROM (as tablets prints it) to GROUP",
			help: `Moves a tablet to another group: freezes it (writes to its keys wait),
copies its pairs to GROUP, drops it at its group and has GROUP serve it.
Reads go on until the drop; a get or scan through a stale directory finds
out and reads the new group. If it fails half way (a timeout), run it again
to finish, or abort-move to undo a move that has not dropped yet. A large
tablet may need a longer --timeout.`,
			run: runMoveTablet},
		{name: "abort-move", args: "FROM", cluster: true, flags: []string{"json", "timeout"},
			summary: "undo a tablet move that failed before its drop",
			run:     runAbortMove},
		{name: "split-tablet", args: "FROM", cluster: true, flags: []string{"json", "timeout"},
			summary: "split the tablet starting at FROM (as tablets prints it) at its median key",
			help: `Cuts the tablet whose first key is FROM in two at its median key; both
halves stay in its group (tablets shows them), and can then be moved apart
with move-tablet. It fails, changing nothing, when the tablet is moving,
holds fewer than 2 keys or its group has as many tablets as it can hold.
Run again after a lost answer (a timeout), it finds the tablet split and
prints OK.`,
			run: runSplitTablet},
		{name: "collect", args: "[GROUP]", cluster: true, flags: []string{"json", "timeout"},
			summary: "delete the keys of tablets a group dropped (all groups, or GROUP)",
			help: `A group that moved a tablet away deletes its keys in bounded steps
afterwards (garbage: tablets shows each group's count when it is not 0).
collect has the group (each group, without GROUP) delete them all now, a
bounded number per log entry, and prints how many keys it reclaimed in
each group. The tablet balancer does this every round, so with it on there
is often nothing left (0 keys reclaimed). --json prints one object a group.`,
			run: runCollect},
		{name: "balance", cluster: true, flags: []string{"json", "timeout"},
			summary: "move tablets until no group has 2 more than another",
			help: `Runs the balancing rule until it proposes no move: while the group with
the most tablets has at least 2 more than the group with the fewest, its
last tablet (in key order) moves to that group. Prints the number of
moves. A fresh load of a keyspace without split points makes as many
tablets as groups early (at 4096 keys), so balance spreads it.`,
			run: runBalance},
		{name: "use", args: "[KEYSPACE]", cluster: true, shell: true,
			summary: "act on an ordered keyspace (use alone: back to the default, hashed one)",
			help: `Makes get, put, del, cas, watch, scan and keys act on the ordered keyspace
KEYSPACE (a [[keyspace]] of the cluster's config; the local cluster of
kvserver with no arguments declares one named "ordered"). The prompt shows
it; Tab completes the names. use alone goes back to the default keyspace,
which is hashed (no scans). In one-shot mode, give --keyspace NAME.`,
			run: runUse},
		{name: "help", args: "[COMMAND]",
			summary: "list the commands, or describe one",
			run:     runHelp},
		{name: "exit", shell: true, summary: "leave the shell (also quit, Ctrl-D)", run: runExit},
		{name: "quit", shell: true, summary: "leave the shell", run: runExit},
	}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// commandNames are the names tab completion and help offer in a mode.
func commandNames(shell bool) []string {
	var ns []string
	for _, c := range commands {
		if c.shell && !shell {
			continue
		}
		ns = append(ns, c.name)
	}
	return ns
}

// usageError is a command line kvcli cannot run (exit 2).
type usageError struct {
	cmd     *command // nil: no command known
	msg     string
	unknown string // the name given, when there is no such command
}

// unknownCommand is the error for a command name kvcli does not know.
func unknownCommand(name string) *usageError {
	return &usageError{msg: fmt.Sprintf("unknown command %q", name), unknown: name}
}

// aliases are names other tools give kvcli's commands.
var aliases = map[string]string{
	"set": "put", "write": "put", "read": "get", "delete": "del", "remove": "del", "rm": "del",
	"cput": "cas", "swap": "cas", "mset": "batch", "leader": "leaders", "stat": "status",
	"info": "status", "follow": "watch", "tail": "watch",
}

// suggest is the command a mistyped name most likely meant ("" if none is
// close): a known alias, a command the name starts (or that starts the
// name), or one a typo or two away.
func suggest(name string, shell bool) string {
	name = strings.ToLower(name)
	names := commandNames(shell)
	if a, ok := aliases[name]; ok {
		return a
	}
	best, bestD := "", 2 // one typo in a short name
	if len(name) >= 5 {
		bestD = 3
	}
	for _, n := range names {
		if len(name) >= 3 && (strings.HasPrefix(n, name) || strings.HasPrefix(name, n)) {
			return n
		}
		if d := editDistance(name, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the number of single-letter insertions, deletions,
// substitutions and swaps of two neighbours that turn a into b.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// plural is n and word, with an s unless n is 1 ("1 group", "3 groups").
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func (e *usageError) Error() string { return e.msg }

// synopsis is a command's usage line (without "usage: ").
func (c *command) synopsis(prefix string) string {
	var b strings.Builder
	b.WriteString(prefix + c.name)
	for _, f := range c.flags {
		b.WriteString(" [--" + f)
		if a := flagHelp[f][0]; a != "" {
			if f == "consistency" {
				a = "linearizable|stale-ok"
			}
			b.WriteString(" " + a)
		}
		b.WriteString("]")
	}
	if c.args != "" {
		b.WriteString(" " + c.args)
	}
	return b.String()
}

// parse parses a command's words (its name first) with defaults d.
func parse(words []string, d opts) (*call, error) {
	c := lookup(words[0])
	if c == nil {
		return nil, unknownCommand(words[0])
	}
	x := &call{cmd: c, opts: d}
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, f := range c.flags {
		switch f {
		case "json":
			fs.BoolVar(&x.json, f, d.json, "")
		case "consistency":
			fs.Var(consistencyFlag{&x.consistency}, f, "")
		case "timeout":
			fs.DurationVar(&x.timeout, f, d.timeout, "")
		case "file":
			fs.StringVar(&x.file, f, "", "")
		case "absent":
			fs.BoolVar(&x.absent, f, d.absent, "")
		case "version":
			fs.Var(&x.version, f, "")
		case "interval":
			fs.DurationVar(&x.interval, f, d.interval, "")
		case "count":
			fs.IntVar(&x.count, f, 0, "")
		case "limit":
			fs.IntVar(&x.limit, f, -1, "")
		case "reverse":
			fs.BoolVar(&x.reverse, f, false, "")
		case "stale":
			fs.BoolVar(&x.stale, f, false, "")
		}
	}
	rest := words[1:]
	if c.name == "scan" || c.name == "keys" {
		rest = flagsFirst(rest)
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return x, flag.ErrHelp
		}
		return nil, &usageError{cmd: c, msg: c.name + ": " + err.Error()}
	}
	x.args = fs.Args()
	bad := func(format string, a ...any) (*call, error) {
		return nil, &usageError{cmd: c, msg: fmt.Sprintf(format, a...)}
	}
	if x.timeout <= 0 {
		return bad("%s: --timeout %v: want a positive duration", c.name, x.timeout)
	}
	if x.interval <= 0 {
		return bad("%s: --interval %v: want a positive duration", c.name, x.interval)
	}
	limitSet := false
	fs.Visit(func(f *flag.Flag) { limitSet = limitSet || f.Name == "limit" })
	if limitSet && x.limit < 0 {
		return bad("%s: --limit %d: want 0 (all) or more", c.name, x.limit)
	}
	if x.count < 0 {
		return bad("%s: --count %d: want 0 or more", c.name, x.count)
	}
	// The arguments each command takes.
	n := -1 // -1: the command checks them itself
	switch c.name {
	case "get", "watch", "del":
		n = 1
	case "put":
		n = 2
		if x.file != "" {
			n = 1
		}
	case "cas":
		if x.absent && x.version.set {
			return bad("cas: --absent and --version exclude each other (--version 0 is --absent)")
		}
		n = 3
		if x.absent || x.version.set {
			n = 2
		}
		if x.file != "" {
			n--
		}
	case "keys":
		n = 1
	case "scan":
		if len(x.args) < 1 || len(x.args) > 2 {
			return bad("scan takes FROM [TO] (\"\" FROM: the first key), got %s", plural(len(x.args), "argument"))
		}
	case "use":
		if len(x.args) > 1 {
			return bad("use takes at most 1 argument (a keyspace), got %d", len(x.args))
		}
	case "status", "leaders", "exit", "quit", "tablets", "balance":
		n = 0
	case "move-tablet":
		n = 2
	case "abort-move", "split-tablet":
		n = 1
	case "collect":
		if len(x.args) > 1 {
			return bad("collect takes at most 1 argument (a group), got %d", len(x.args))
		}
	case "help":
		if len(x.args) > 1 {
			return bad("help takes at most 1 argument, got %d", len(x.args))
		}
	case "batch":
		if x.file != "" || len(x.args) == 1 && x.args[0] == "-" {
			if x.file != "" && len(x.args) > 0 {
				return bad("batch --file F takes no other argument, got %d", len(x.args))
			}
			break
		}
		if len(x.args) == 0 {
			return bad("batch takes at least one op (put KEY VALUE, del KEY), got none")
		}
		if _, err := parseOps(x.args); err != nil {
			return bad("batch: %v", err)
		}
	}
	if n == 0 && len(x.args) != 0 {
		return bad("%s takes no arguments, got %d", c.name, len(x.args))
	}
	if n >= 0 && len(x.args) != n {
		return bad("%s takes %s, got %d", c.name, plural(n, "argument"), len(x.args))
	}
	return x, nil
}

// flagsFirst moves the flags found after the arguments (scan a z --limit
// 10) before them, with their values, for the flag package, which stops
// at the first argument. A "--" ends the flags, as it does there.
func flagsFirst(words []string) []string {
	var flags, args []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "--":
			return append(append(flags, "--"), append(args, words[i+1:]...)...)
		case strings.HasPrefix(w, "-") && len(w) > 1:
			flags = append(flags, w)
			name := strings.TrimLeft(w, "-")
			if h, ok := flagHelp[name]; ok && h[0] != "" && !strings.Contains(name, "=") && i+1 < len(words) {
				i++
				flags = append(flags, words[i])
			}
		default:
			args = append(args, w)
		}
	}
	return append(flags, args...)
}

// batchOp is one op of a batch command.
type batchOp struct {
	del        bool
	key, value string
}

// parseOps parses "put K V", "del K" sequences.
func parseOps(words []string) ([]batchOp, error) {
	var ops []batchOp
	for i := 0; i < len(words); {
		switch words[i] {
		case "put":
			if i+2 >= len(words) {
				return nil, fmt.Errorf("op %d: put takes KEY VALUE", len(ops)+1)
			}
			ops = append(ops, batchOp{key: words[i+1], value: words[i+2]})
			i += 3
		case "del":
			if i+1 >= len(words) {
				return nil, fmt.Errorf("op %d: del takes KEY", len(ops)+1)
			}
			ops = append(ops, batchOp{del: true, key: words[i+1]})
			i += 2
		default:
			return nil, fmt.Errorf("op %d: %q: want put KEY VALUE or del KEY", len(ops)+1, words[i])
		}
	}
	return ops, nil
}

// help texts.

func generalHelp(w io.Writer, shell bool, history string) {
	if shell {
		fmt.Fprintln(w, "Commands (help COMMAND for one; flags go before the arguments):")
	} else {
		fmt.Fprintln(w, `usage: kvcli [global flags] [COMMAND [flags] [ARGS]]

With no COMMAND, kvcli runs an interactive shell (or, with stdin not a
terminal, runs the commands it reads from stdin, one per line).

Commands (kvcli help COMMAND for one; flags go before the arguments):`)
	}
	for _, c := range commands {
		if c.shell && !shell {
			continue
		}
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	if shell {
		fmt.Fprintf(w, `
Words are split at blanks; quote with '...' or "..." (backslash escapes in
"..." and outside quotes). Tab completes commands, flags and flag values;
Up/Down and Ctrl-R search the history, kept in %s
(the last %d lines; a line starting with a space is not kept).
Ctrl-C clears the line or interrupts the running command (watch);
Ctrl-D, exit or quit leave.
`, orNone(history), historyLimit)
	} else {
		fmt.Fprint(w, `
Exit codes: 0 done, 1 key not found, 2 usage error, 3 compare-and-swap
mismatch, 4 cluster unavailable, timed out or write outcome unknown,
5 any other error, 130 interrupted (Ctrl-C) before a write was sent.

Global flags (before the command; the command's own flags override them):
`)
	}
}

func orNone(path string) string {
	if path == "" {
		return "(nowhere: history is off)"
	}
	return path
}

func commandHelp(w io.Writer, c *command, prefix string) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.synopsis(prefix), c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", c.help)
	}
	if len(c.flags) > 0 {
		fmt.Fprintln(w, "\nFlags:")
		fl := append([]string(nil), c.flags...)
		sort.Strings(fl)
		for _, f := range fl {
			h := flagHelp[f]
			name := "--" + f
			if h[0] != "" {
				name += " " + h[0]
			}
			fmt.Fprintf(w, "  %-18s %s\n", name, h[1])
		}
	}
}
