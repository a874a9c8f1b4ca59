package main

import (
	"bytes"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

var defs = opts{consistency: client.Linearizable, timeout: 10 * time.Second, interval: defaultInterval}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		words []string
		args  []string
		check func(x *call) bool
	}{
		{[]string{"get", "k"}, []string{"k"}, func(x *call) bool { return x.consistency == client.Linearizable && !x.json }},
		{[]string{"get", "--consistency", "stale-ok", "--json", "k"}, []string{"k"}, func(x *call) bool { return x.consistency == client.StaleOK && x.json }},
		{[]string{"put", "k", "v w"}, []string{"k", "v w"}, nil},
		{[]string{"put", "k", "-"}, []string{"k", "-"}, nil},
		{[]string{"put", "--file", "f", "k"}, []string{"k"}, func(x *call) bool { return x.file == "f" }},
		{[]string{"put", "--", "-k", "v"}, []string{"-k", "v"}, nil},
		{[]string{"del", "--version", "7", "k"}, []string{"k"}, func(x *call) bool { return x.version.set && x.version.v == 7 }},
		{[]string{"cas", "k", "old", "new"}, []string{"k", "old", "new"}, nil},
		{[]string{"cas", "--absent", "k", "new"}, []string{"k", "new"}, func(x *call) bool { return x.absent }},
		{[]string{"cas", "--version", "0", "k", "new"}, []string{"k", "new"}, func(x *call) bool { return x.version.set && x.version.v == 0 }},
		{[]string{"cas", "--file", "f", "k", "old"}, []string{"k", "old"}, nil},
		{[]string{"batch", "put", "a", "1", "del", "b", "put", "c", "3"}, []string{"put", "a", "1", "del", "b", "put", "c", "3"}, nil},
		{[]string{"batch", "-"}, []string{"-"}, nil},
		{[]string{"batch", "--file", "ops"}, nil, func(x *call) bool { return x.file == "ops" }},
		{[]string{"status", "--json", "--timeout", "2s"}, nil, func(x *call) bool { return x.json && x.timeout == 2*time.Second }},
		{[]string{"leaders"}, nil, nil},
		{[]string{"watch", "--interval", "20ms", "--count", "3", "k"}, []string{"k"}, func(x *call) bool { return x.interval == 20*time.Millisecond && x.count == 3 }},
		{[]string{"split-tablet", "--json", "ordered:k5"}, []string{"ordered:k5"}, func(x *call) bool { return x.json }},
		{[]string{"collect"}, nil, nil},
		{[]string{"collect", "--json", "--timeout", "3s", "1"}, []string{"1"}, func(x *call) bool { return x.json && x.timeout == 3*time.Second }},
		{[]string{"help"}, nil, nil},
		{[]string{"help", "batch"}, []string{"batch"}, nil},
		{[]string{"exit"}, nil, nil},
	} {
		x, err := parse(c.words, defs)
		if err != nil {
			t.Errorf("%q: %v", c.words, err)
			continue
		}
		if len(x.args) != len(c.args) || len(c.args) > 0 && !reflect.DeepEqual(x.args, c.args) {
			t.Errorf("%q: args %q, want %q", c.words, x.args, c.args)
		}
		if c.check != nil && !c.check(x) {
			t.Errorf("%q: options %+v", c.words, x.opts)
		}
	}
	// The global --absent is cas's default (kvcli --absent cas K NEW).
	if x, err := parse([]string{"cas", "k", "new"}, opts{absent: true, timeout: time.Second, interval: time.Second}); err != nil || !x.absent {
		t.Errorf("cas with the global --absent: %v %+v", err, x)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		words []string
		msg   string
	}{
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"get"}, "get takes 1 argument, got 0"},
		{[]string{"get", "a", "b"}, "get takes 1 argument, got 2"},
		{[]string{"get", "--consistency", "weird", "k"}, `get: invalid value "weird" for flag -consistency: want linearizable or stale-ok`},
		{[]string{"get", "--bogus", "k"}, "get: flag provided but not defined: -bogus"},
		{[]string{"get", "--timeout", "0s", "k"}, "get: --timeout 0s: want a positive duration"},
		{[]string{"put", "k"}, "put takes 2 arguments, got 1"},
		{[]string{"put", "--file", "f", "k", "v"}, "put takes 1 argument, got 2"},
		{[]string{"del", "--version", "x", "k"}, `del: invalid value "x" for flag -version: want a version number (0: the key has no value)`},
		{[]string{"cas", "k", "v"}, "cas takes 3 arguments, got 2"},
		{[]string{"cas", "--absent", "k", "old", "new"}, "cas takes 2 arguments, got 3"},
		{[]string{"cas", "--absent", "--version", "3", "k", "v"}, "cas: --absent and --version exclude each other"},
		{[]string{"batch"}, "batch takes at least one op"},
		{[]string{"batch", "put", "k"}, "batch: op 1: put takes KEY VALUE"},
		{[]string{"batch", "put", "k", "v", "del"}, "batch: op 2: del takes KEY"},
		{[]string{"batch", "get", "k"}, `batch: op 1: "get": want put KEY VALUE or del KEY`},
		{[]string{"batch", "--file", "f", "put", "k", "v"}, "batch --file F takes no other argument"},
		{[]string{"status", "x"}, "status takes no arguments, got 1"},
		{[]string{"watch", "--interval", "-1s", "k"}, "watch: --interval -1s: want a positive duration"},
		{[]string{"watch", "--count", "-1", "k"}, "watch: --count -1: want 0 or more"},
		{[]string{"help", "a", "b"}, "help takes at most 1 argument, got 2"},
		{[]string{"split-tablet"}, "split-tablet takes 1 argument, got 0"},
		{[]string{"split-tablet", "min", "1"}, "split-tablet takes 1 argument, got 2"},
		{[]string{"collect", "0", "1"}, "collect takes at most 1 argument (a group), got 2"},
	} {
		_, err := parse(c.words, defs)
		ue, ok := err.(*usageError)
		if !ok || !strings.HasPrefix(ue.msg, c.msg) {
			t.Errorf("%q: %v, want a usage error %q", c.words, err, c.msg)
			continue
		}
		if c.words[0] != "frob" && ue.cmd == nil || c.words[0] == "frob" && ue.unknown != "frob" {
			t.Errorf("%q: %+v: the error does not name its command", c.words, ue)
		}
	}
}

// runCLI runs kvcli's run with args and stdin (not a terminal), with no
// cluster map (so that nothing reaches a cluster).
func runCLI(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	args = append([]string{"--map", filepath.Join(t.TempDir(), "none.json"), "--history", ""}, args...)
	code = run(args, strings.NewReader(stdin), &o, &e)
	return o.String(), e.String(), code
}

// Argument errors exit 2: in one-shot mode with one line on stderr (the
// usage line follows on a terminal), in the shell with the command's usage
// line.
func TestUsageExitCodes(t *testing.T) {
	for _, c := range []struct {
		stdin string
		args  []string
		lines []string
	}{
		{"", []string{"get"}, []string{"kvcli: get takes 1 argument, got 0"}},
		{"", []string{"frobnicate"}, []string{`kvcli: unknown command "frobnicate" (commands: get, put, del, cas, batch, status, leaders, watch, scan, keys, tablets, move-tablet, abort-move, split-tablet, collect, balance, help)`}},
		{"", []string{"gt", "k"}, []string{`kvcli: unknown command "gt": did you mean "get"? (commands: get, put, del, cas, batch, status, leaders, watch, scan, keys, tablets, move-tablet, abort-move, split-tablet, collect, balance, help)`}},
		{"", []string{"help", "stauts"}, []string{`kvcli: unknown command "stauts": did you mean "status"? (commands: get, put, del, cas, batch, status, leaders, watch, scan, keys, tablets, move-tablet, abort-move, split-tablet, collect, balance, help)`}},
		{"", []string{"status", "x"}, []string{"kvcli: status takes no arguments, got 1"}},
		{"", []string{"cas", "--version", "1", "--absent", "k", "v"}, []string{"kvcli: cas: --absent and --version exclude each other (--version 0 is --absent)"}},
		{"", []string{"exit"}, []string{"kvcli: exit is a shell command (run kvcli with no command for the shell)"}},
		{"", []string{"--consistency", "weird", "get", "k"}, []string{`kvcli: --consistency "weird": want linearizable or stale-ok`}},
		{"", []string{"--map", "a", "--seed", "b:1", "get", "k"}, []string{"kvcli: give one of --map, --config and --seed"}},
		// Commands read from stdin: the usage line follows, and the
		// run stops there.
		{"help batch\nget\nget k\n", nil, []string{
			"kvcli: get takes 1 argument, got 0",
			"usage: get [--consistency linearizable|stale-ok] [--json] [--timeout D] KEY",
			"kvcli: line 2: get: exit 2"}},
		{"batch put k\n", nil, []string{
			"kvcli: batch: op 1: put takes KEY VALUE",
			"usage: batch [--file F] [--json] [--timeout D] OP...",
			"kvcli: line 1: batch: exit 2"}},
		{"frob\n", nil, []string{
			`kvcli: unknown command "frob" (help lists the commands)`,
			"commands: get, put, del, cas, batch, status, leaders, watch, scan, keys, tablets, move-tablet, abort-move, split-tablet, collect, balance, use, help, exit, quit (help COMMAND)",
			"kvcli: line 1: frob: exit 2"}},
		{"qiut\n", nil, []string{
			`kvcli: unknown command "qiut": did you mean "quit"? (help lists the commands)`,
			"commands: get, put, del, cas, batch, status, leaders, watch, scan, keys, tablets, move-tablet, abort-move, split-tablet, collect, balance, use, help, exit, quit (help COMMAND)",
			"kvcli: line 1: qiut: exit 2"}},
		{"get 'open\n", nil, []string{"kvcli: line 1: unterminated ' quote"}},
	} {
		_, stderr, code := runCLI(t, c.stdin, c.args...)
		got := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != exitUsage || !reflect.DeepEqual(got, c.lines) {
			t.Errorf("kvcli %q < %q: exit %d, stderr:\n%s\nwant exit 2 and:\n%s", c.args, c.stdin, code, stderr, strings.Join(c.lines, "\n"))
		}
	}
	// On a terminal, one-shot mode adds the usage line too.
	var e bytes.Buffer
	s := &session{stderr: &e, hints: true, defs: defs}
	if code := s.exec(t.Context(), []string{"put", "k"}); code != exitUsage ||
		e.String() != "kvcli: put takes 2 arguments, got 1\nusage: kvcli put [--file F] [--json] [--timeout D] KEY VALUE\n" {
		t.Errorf("one-shot usage error on a terminal: exit %d:\n%s", code, e.String())
	}
}

func TestHelp(t *testing.T) {
	out, _, code := runCLI(t, "", "help")
	for _, c := range commands {
		if !c.shell && !strings.Contains(out, "\n  "+c.name+" ") {
			t.Errorf("help does not list %s:\n%s", c.name, out)
		}
	}
	if code != exitOK || !strings.Contains(out, "Exit codes:") || !strings.Contains(out, "-consistency") {
		t.Errorf("help: exit %d:\n%s", code, out)
	}
	out, _, code = runCLI(t, "", "help", "batch")
	if code != exitOK || !strings.HasPrefix(out, "usage: kvcli batch [--file F] [--json] [--timeout D] OP...\n") || !strings.Contains(out, "--file F") {
		t.Errorf("help batch: exit %d:\n%s", code, out)
	}
	out, _, code = runCLI(t, "", "watch", "-h")
	if code != exitOK || !strings.HasPrefix(out, "usage: kvcli watch ") {
		t.Errorf("watch -h: exit %d:\n%s", code, out)
	}
	// The shell's help names the history file and the keys.
	out, _, code = runCLI(t, "help\n")
	if code != exitOK || !strings.Contains(out, "(nowhere: history is off)") || !strings.Contains(out, "Ctrl-D") || !strings.Contains(out, "  exit ") {
		t.Errorf("the shell's help: exit %d:\n%s", code, out)
	}
}

// With no cluster, commands that need one exit 4 and say how to start one;
// the shell reading stdin stops there.
func TestNoCluster(t *testing.T) {
	_, stderr, code := runCLI(t, "", "get", "k")
	if code != exitUnavailable || !strings.Contains(stderr, "no cluster map at ") || !strings.Contains(stderr, "go run ./cmd/kvserver") {
		t.Errorf("get with no cluster: exit %d: %s", code, stderr)
	}
	out, stderr, code := runCLI(t, "help get\nget k\nhelp put\n")
	if code != exitUnavailable || !strings.Contains(out, "usage: get") || strings.Contains(out, "usage: put") ||
		!strings.Contains(stderr, "kvcli: line 2: get: exit 4") {
		t.Errorf("piped with no cluster: exit %d:\n%s\n%s", code, out, stderr)
	}
	// --keep-going runs the rest and exits with the first failure's code.
	out, _, code = runCLI(t, "get k\nhelp put\nfrob\n", "--keep-going")
	if code != exitUnavailable || !strings.Contains(out, "usage: put") {
		t.Errorf("--keep-going: exit %d:\n%s", code, out)
	}
	// exit ends the commands read from stdin.
	out, _, code = runCLI(t, "help get\nexit\nhelp put\n")
	if code != exitOK || strings.Contains(out, "usage: put") {
		t.Errorf("exit: exit %d:\n%s", code, out)
	}
}

func TestSplitWords(t *testing.T) {
	for _, c := range []struct {
		line  string
		words []string
	}{
		{"", nil},
		{"  get   k  ", []string{"get", "k"}},
		{`put k "hello world"`, []string{"put", "k", "hello world"}},
		{`put k 'it''s' "a \"q\" \\ b"`, []string{"put", "k", "its", `a "q" \ b`}},
		{`put k\ 1 ''`, []string{"put", "k 1", ""}},
		{"put\tk\tv", []string{"put", "k", "v"}},
		{`put k 'a\b'`, []string{"put", "k", `a\b`}},
	} {
		w, err := splitWords(c.line)
		if err != nil || !reflect.DeepEqual(w, c.words) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", c.line, w, err, c.words)
		}
	}
	for _, bad := range []string{`get 'k`, `put k "v`} {
		if _, err := splitWords(bad); err == nil {
			t.Errorf("splitWords(%q): no error", bad)
		}
	}
}

func TestCompletion(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
		n    int
	}{
		{"sta", []string{"tus "}, 3},
		{"w", []string{"atch "}, 1},
		{"e", []string{"xit "}, 1},
		{"", append([]string(nil), commandNames(true)...), 0},
		{"get --c", []string{"onsistency "}, 3},
		{"get --consistency s", []string{"tale-ok "}, 1},
		{"get --consistency ", []string{"linearizable ", "stale-ok "}, 0},
		{"cas --", []string{"absent ", "version ", "file ", "json ", "timeout "}, 2},
		{"watch --i", []string{"nterval "}, 3},
		{"help bat", []string{"ch "}, 3},
		{"help bal", []string{"ance "}, 3},
		{"spl", []string{"it-tablet "}, 3},
		{"coll", []string{"ect "}, 4},
		{"collect --", []string{"json ", "timeout "}, 2},
		{"batch ", []string{"put ", "del "}, 0},
		{"batch put a 1 d", []string{"el "}, 1},
		{"batch put a ", nil, 0},
		{"batch del a ", []string{"put ", "del "}, 0},
		{"get k", nil, 1},
		{"frob ", nil, 0},
		{`put "a b`, nil, 0},
	} {
		got, n := completer{}.Do([]rune(c.line), len([]rune(c.line)))
		var gs []string
		for _, g := range got {
			gs = append(gs, string(g))
		}
		if c.line == "" {
			for i := range c.want {
				c.want[i] += " "
			}
		}
		if !reflect.DeepEqual(gs, c.want) || len(gs) > 0 && n != c.n {
			t.Errorf("complete %q: %q %d, want %q %d", c.line, gs, n, c.want, c.n)
		}
	}
}

func TestHistoryPath(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/state")
	if p := historyPath(); p != "/state/rdmakv/kvcli_history" {
		t.Errorf("with XDG_STATE_HOME: %s", p)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if p := historyPath(); p != "/home/u/.rdmakv_history" {
		t.Errorf("without XDG_STATE_HOME: %s", p)
	}
}

func TestReadOps(t *testing.T) {
	ops, err := readOps("stdin", strings.NewReader("# a comment\nput a 1\n\n  del b  \nput 'c d' \"e f\"\n"))
	want := []batchOp{{key: "a", value: "1"}, {del: true, key: "b"}, {key: "c d", value: "e f"}}
	if err != nil || !reflect.DeepEqual(ops, want) {
		t.Fatalf("readOps: %+v %v", ops, err)
	}
	for _, bad := range []string{"put a\n", "put a 1 del b\n", "get a\n", "put 'a 1\n"} {
		if _, err := readOps("stdin", strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "stdin, line 1") {
			t.Errorf("readOps(%q): %v", bad, err)
		}
	}
}

// TestUnreachableSeed: a seed whose control port does not answer means the
// cluster is unavailable: exit 4, as documented (it exited 5, "any other
// error").
func TestUnreachableSeed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	var o, e bytes.Buffer
	code := run([]string{"--history", "", "--seed", addr, "--timeout", "5s", "get", "k"}, strings.NewReader(""), &o, &e)
	stderr := e.String()
	if code != exitUnavailable || !strings.Contains(stderr, "seed "+addr+" unreachable") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("get with an unreachable seed: exit %d, stderr %q; want exit %d and one line saying the seed is unreachable", code, stderr, exitUnavailable)
	}
}

// A mistyped command gets the closest one suggested; a name close to none
// gets no suggestion. Shell-only commands are suggested only in the shell.
func TestSuggest(t *testing.T) {
	for _, c := range []struct {
		name  string
		shell bool
		want  string
	}{
		{"gt", false, "get"}, {"GET", false, "get"}, {"pt", false, "put"}, {"dle", false, "del"},
		{"delete", false, "del"}, {"set", false, "put"}, {"rm", false, "del"}, {"stat", false, "status"},
		{"stauts", false, "status"}, {"leader", false, "leaders"}, {"wacth", false, "watch"},
		{"bathc", false, "batch"}, {"hlep", false, "help"}, {"csa", false, "cas"},
		{"quit", false, ""}, {"qiut", true, "quit"}, {"exti", true, "exit"},
		{"frobnicate", false, ""}, {"x", false, ""}, {"zzz", false, ""},
	} {
		if got := suggest(c.name, c.shell); got != c.want {
			t.Errorf("suggest(%q, shell %v) = %q, want %q", c.name, c.shell, got, c.want)
		}
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 groups", 1: "1 group", 2: "2 groups"} {
		if got := plural(n, "group"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestVersionFlag(t *testing.T) {
	out, stderr, code := runCLI(t, "", "--version")
	if code != exitOK || !strings.HasPrefix(out, "kvcli github.com/rdmakv/rdmakv ") || stderr != "" {
		t.Errorf("kvcli --version: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	// cas's own --version N is untouched.
	if x, err := parse([]string{"cas", "--version", "3", "k", "v"}, defs); err != nil || !x.version.set || x.version.v != 3 {
		t.Errorf("cas --version 3: %v %+v", err, x)
	}
}

// A replica whose header has no applied time (client.Status leaves
// AppliedAt zero) has no applied_at in status --json, rather than
// 0001-01-01; one with a time has it.
func TestStatusJSONAppliedAt(t *testing.T) {
	at := time.Date(2026, 11, 26, 7, 0, 0, 0, time.UTC)
	st := client.Status{Name: "t", Fabric: "shm", Groups: []client.GroupStatus{{Leader: 0, Epoch: 1<<32 | 1, Replicas: []client.ReplicaStatus{
		{Node: 1, Reachable: true, Serving: 1<<32 | 1, Applied: 5, AppliedAt: at},
		{Node: 2, Reachable: true, Applied: 5},
	}}}}
	out := toJSON("status", st, true)
	r := out.Groups[0].Replicas
	if r[0].AppliedAt == nil || !r[0].AppliedAt.Equal(at) || r[1].AppliedAt != nil {
		t.Errorf("applied_at: %v, %v; want %v and none", r[0].AppliedAt, r[1].AppliedAt, at)
	}
	if out.Groups[0].Epoch != 1<<32|1 || r[0].Serving != 1<<32|1 {
		t.Errorf("epochs %d %d: want round << 32 | leader", out.Groups[0].Epoch, r[0].Serving)
	}
}

func TestScanArgs(t *testing.T) {
	for _, c := range []struct {
		words []string
		ok    bool
		limit int
	}{
		{[]string{"scan", "a"}, true, -1},
		{[]string{"scan", "--limit", "0", "a", "z"}, true, 0},
		{[]string{"scan", "--limit", "-2", "a"}, false, 0},
		{[]string{"scan"}, false, 0},
		{[]string{"scan", "a", "b", "c"}, false, 0},
		{[]string{"keys"}, false, 0},
		{[]string{"keys", "--limit", "5", "p"}, true, 5},
		{[]string{"use"}, true, 0},
		{[]string{"scan", "a", "z", "--limit", "10"}, true, 10},
		{[]string{"scan", "a", "--limit=7", "--reverse"}, true, 7},
		{[]string{"keys", "p", "--limit", "3"}, true, 3},
		{[]string{"keys", "--", "-p"}, true, -1},
		{[]string{"use", "a", "b"}, false, 0},
	} {
		x, err := parse(c.words, opts{timeout: time.Second, interval: time.Second})
		if (err == nil) != c.ok || err == nil && (c.words[0] != "use" && x.limit != c.limit) {
			t.Errorf("parse %q: %v (limit %v), want ok %v limit %d", c.words, err, x, c.ok, c.limit)
		}
		if err == nil && c.words[0] != "use" {
			// The arguments are what is not a flag or a flag's value.
			var want []string
			for i, w := range c.words[1:] {
				if w == "--" {
					want = append(want, c.words[i+2:]...)
					break
				}
				if !strings.HasPrefix(w, "-") && (i == 0 || c.words[i] != "--limit") {
					want = append(want, w)
				}
			}
			if !reflect.DeepEqual(x.args, want) {
				t.Errorf("parse %q: arguments %q, want %q", c.words, x.args, want)
			}
		}
	}
	for in, want := range map[string]string{"a": "b", "a\xff": "b", "\xff\xff": "", "": "", "ab\xfe": "ab\xff"} {
		if got := string(prefixEnd([]byte(in))); got != want {
			t.Errorf("prefixEnd(%q) = %q, want %q", in, got, want)
		}
	}
	// use completes the map's keyspace names; with no client, none.
	if got, _ := (completer{s: &session{}}).Do([]rune("use o"), 5); len(got) != 0 {
		t.Errorf("use completion without a client: %q", got)
	}
}
