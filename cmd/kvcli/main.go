// Command kvcli reads and writes an rdmakv cluster from the command line:
// one command per run, or an interactive shell.
//
//	kvcli put KEY VALUE     store VALUE (VALUE "-" reads it from stdin, --file F a file)
//	kvcli get KEY           print the value
//	kvcli del KEY           delete
//	kvcli cas KEY OLD NEW   store NEW if the value is OLD (--absent: if there is none; --version N)
//	kvcli batch put K V del K ...   several puts and deletes, atomically
//	kvcli status            every replica's state; leaders: each group's leader
//	kvcli watch KEY         print the key's value at every change, until Ctrl-C
//	kvcli --keyspace NAME scan FROM [TO]   an ordered keyspace's pairs in key order (keys PREFIX: its keys)
//	kvcli                   the interactive shell (history, tab completion, help)
//
// With no --map, kvcli uses the map of the local cluster that kvserver
// started with no arguments. Exit codes: 0 done, 1 key not found, 2 usage
// or config error (a wrong cluster secret), 3 compare-and-swap mismatch, 4
// cluster unavailable, timed out or write outcome unknown, 5 any other
// error, 130 interrupted. docs/kvcli.md is the user guide.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/version"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// Exit codes.
const (
	exitOK          = 0
	exitNotFound    = 1
	exitUsage       = 2
	exitMismatch    = 3
	exitUnavailable = 4
	exitError       = 5
	exitInterrupted = 130
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// mode is how kvcli reads its commands.
type mode uint8

const (
	oneShot     mode = iota // the command line's
	interactive             // a shell on a terminal
	piped                   // a shell reading stdin, no prompts
)

// session is what commands run with: the streams, the defaults from the
// global flags, and the client (opened at the first command that needs
// it, and kept by the shell).
type session struct {
	mode           mode
	stdin          io.Reader
	stdout, stderr io.Writer
	// hints: print the command's usage line after an argument error
	// (the shell; one-shot mode when stderr is a terminal).
	hints   bool
	mapFile string
	config  string // --config: the cluster's TOML config
	seed    string // --seed: a replica's control port
	secret  string // --secret-file
	history string
	defs    opts
	flags   *flag.FlagSet // the global flags (help prints them)
	c       *client.Client
	exit    bool // exit or quit ran
	// keyspace is the ordered keyspace get, put, del, cas, watch, scan
	// and keys act on (use, --keyspace); "": the default, hashed one.
	keyspace string
	// setPrompt shows the keyspace in the shell's prompt (nil: no shell).
	setPrompt func()
}

const defaultInterval = 500 * time.Millisecond

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	s := &session{stdin: stdin, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("kvcli", flag.ContinueOnError)
	s.flags = fs
	fs.SetOutput(stderr)
	fs.Usage = func() {
		generalHelp(stderr, false, "")
		fs.PrintDefaults()
	}
	fs.StringVar(&s.mapFile, "map", client.DefaultMapFile, "the cluster map (kvserver with no arguments writes it here)")
	fs.StringVar(&s.config, "config", "", "connect with the cluster's config (the TOML file its kvserver processes run from) instead of a map")
	fs.StringVar(&s.seed, "seed", "", "connect by fetching the map from a replica's control port (HOST:PORT) instead of a map file")
	fs.StringVar(&s.secret, "secret-file", "", "with --seed on a tcp cluster: the file holding the cluster secret")
	consistency := fs.String("consistency", "linearizable", "gets: linearizable or stale-ok")
	fs.BoolVar(&s.defs.json, "json", false, "print results as JSON")
	fs.DurationVar(&s.defs.timeout, "timeout", 10*time.Second, "bound on each command, retries included")
	fs.BoolVar(&s.defs.absent, "absent", false, "cas: the key must have no value (cas KEY NEW)")
	fs.DurationVar(&s.defs.interval, "interval", defaultInterval, "watch: time between gets")
	fs.StringVar(&s.keyspace, "keyspace", "", "act on this ordered keyspace (scan and keys need one; default: the hashed keyspace)")
	fs.StringVar(&s.history, "history", historyPath(), "the shell's history file (empty: keep none)")
	showVersion := fs.Bool("version", false, "print kvcli's version (module version, commit) and exit")
	keepGoing := fs.Bool("keep-going", false, "commands read from stdin: run every line even after one failed (the exit code is the first failure's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.String("kvcli"))
		return exitOK
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if n := btoi(given["map"]) + btoi(s.config != "") + btoi(s.seed != ""); n > 1 {
		fmt.Fprintln(stderr, "kvcli: give one of --map, --config and --seed")
		return exitUsage
	}
	var err error
	if s.defs.consistency, err = parseConsistency(*consistency); err != nil {
		fmt.Fprintf(stderr, "kvcli: --consistency %q: want linearizable or stale-ok\n", *consistency)
		return exitUsage
	}
	if s.defs.timeout <= 0 || s.defs.interval <= 0 {
		fmt.Fprintf(stderr, "kvcli: --timeout %v --interval %v: want positive durations\n", s.defs.timeout, s.defs.interval)
		return exitUsage
	}
	defer s.close()
	if fs.NArg() == 0 {
		if isTerminal(stdin) {
			return s.interactive()
		}
		return s.piped(*keepGoing)
	}
	s.hints = isTerminal(stderr)
	// One command. Ctrl-C (or SIGTERM) ends it: watch's normal end; a
	// get or a write not sent yet gives up (130), a write under way
	// reports its outcome unknown (4).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return s.exec(ctx, fs.Args())
}

// exec runs one command line (its words).
func (s *session) exec(ctx context.Context, words []string) int {
	x, err := parse(words, s.defs)
	if errors.Is(err, flag.ErrHelp) {
		commandHelp(s.stdout, x.cmd, s.prefix())
		return exitOK
	}
	if err != nil {
		return s.usage(err.(*usageError))
	}
	if x.cmd.shell && s.mode == oneShot {
		return s.usage(&usageError{msg: fmt.Sprintf("%s is a shell command (run kvcli with no command for the shell)", x.cmd.name)})
	}
	if x.cmd.cluster && s.c == nil {
		// status and leaders read the replicas' headers: they need no
		// group to have a leader, and report the groups that have none.
		degraded := x.cmd.name == "status" || x.cmd.name == "leaders"
		if code := s.open(ctx, x.timeout, degraded); code != exitOK {
			return code
		}
	}
	if x.cmd.cluster && x.cmd.name != "status" && x.cmd.name != "leaders" && x.cmd.name != "use" {
		if code := s.checkKeyspace(x); code != exitOK {
			return code
		}
	}
	x.ctx = ctx
	code := x.cmd.run(s, x)
	if code == exitUnavailable && s.mode != oneShot {
		// The cluster may have gone (or come back): the shell's next
		// command opens a new client.
		s.close()
	}
	return code
}

// runCtx is the context a command's cluster calls run under: the
// session's (which Ctrl-C ends) with the command's timeout.
func (x *call) runCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(x.ctx, x.timeout)
}

func (s *session) prefix() string {
	if s.mode == oneShot {
		return "kvcli "
	}
	return ""
}

// usage reports an argument error: one line, then (hints) the usage line
// of the command, and exits 2.
func (s *session) usage(e *usageError) int {
	shell := s.mode != oneShot
	if e.unknown != "" {
		msg := e.msg
		if n := suggest(e.unknown, shell); n != "" {
			msg += fmt.Sprintf(": did you mean %q?", n)
		}
		if !shell {
			// One line, every command in it: the usage line would repeat it.
			fmt.Fprintf(s.stderr, "kvcli: %s (commands: %s)\n", msg, strings.Join(commandNames(false), ", "))
			return exitUsage
		}
		fmt.Fprintf(s.stderr, "kvcli: %s (help lists the commands)\n", msg)
	} else {
		fmt.Fprintf(s.stderr, "kvcli: %s\n", e.msg)
	}
	if s.hints {
		if e.cmd != nil {
			fmt.Fprintf(s.stderr, "usage: %s\n", e.cmd.synopsis(s.prefix()))
		} else {
			fmt.Fprintf(s.stderr, "commands: %s (%shelp COMMAND)\n", strings.Join(commandNames(shell), ", "), s.prefix())
		}
	}
	return exitUsage
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// where names the cluster kvcli connects to.
func (s *session) where() string {
	switch {
	case s.config != "":
		return "config " + s.config
	case s.seed != "":
		return "seed " + s.seed
	}
	return "map " + s.mapFile
}

// open opens the session's client.
func (s *session) open(ctx context.Context, timeout time.Duration, degraded bool) int {
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	o := []client.Option{client.WithTimeout(timeout)}
	if degraded {
		o = append(o, client.WithDegradedOpen())
	}
	switch {
	case s.config != "":
		o = append(o, client.WithConfigFile(s.config))
	case s.seed != "":
		o = append(o, client.WithSeed(s.seed))
	default:
		o = append(o, client.WithMapFile(s.mapFile))
	}
	if s.secret != "" {
		b, err := os.ReadFile(s.secret)
		if err != nil {
			fmt.Fprintf(s.stderr, "kvcli: --secret-file: %v\n", err)
			return exitUsage
		}
		o = append(o, client.WithSecret(bytes.TrimRight(b, "\r\n")))
	}
	c, err := client.Open(octx, o...)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && s.config == "" && s.seed == "" {
			fmt.Fprintf(s.stderr, "kvcli: no cluster map at %s: start a local cluster with `go run ./cmd/kvserver`, or give --map\n", s.mapFile)
			return exitUnavailable
		}
		if errors.Is(err, tcp.ErrAuth) && s.secret != "" {
			err = fmt.Errorf("%w (the secret of --secret-file %s)", err, s.secret)
		}
		return s.report(err)
	}
	s.c = c
	return exitOK
}

func (s *session) close() {
	if s.c != nil {
		s.c.Close()
		s.c = nil
	}
}

// result is what single-key commands print with --json.
type result struct {
	Command string `json:"command"`
	Key     string `json:"key"`
	Value   string `json:"value,omitempty"`
	Version uint64 `json:"version,omitempty"`
	Prev    uint64 `json:"prev_version,omitempty"`
	Applied uint64 `json:"applied,omitempty"`
	Error   string `json:"error,omitempty"`
}

// finish prints a command's outcome: JSON (the error included) on stdout,
// or OK on stdout / the error on stderr.
func (s *session) finish(out result, err error, asJSON bool) int {
	code := exitOK
	if err != nil {
		code = exitCode(err)
		out.Error = err.Error()
	}
	if asJSON {
		s.printJSON(out)
		return code
	}
	if err != nil {
		return s.report(err)
	}
	if out.Command != "get" {
		fmt.Fprintln(s.stdout, "OK")
	}
	return code
}

func (s *session) printJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = fmt.Appendf(nil, `{"error":%q}`, err.Error())
	}
	s.stdout.Write(append(b, '\n'))
}

// exitCode is the exit code of a command that failed with err.
func exitCode(err error) int {
	switch {
	case errors.Is(err, client.ErrNotFound):
		return exitNotFound
	case errors.Is(err, client.ErrCASMismatch):
		return exitMismatch
	case errors.Is(err, client.ErrOutcomeUnknown):
		return exitUnavailable
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return exitUnavailable
	case errors.Is(err, client.ErrUnknownKeyspace):
		return exitUsage
	case errors.Is(err, client.ErrEmptyKey), errors.Is(err, client.ErrKeyTooLarge),
		errors.Is(err, client.ErrValueTooLarge), errors.Is(err, client.ErrBatchTooLarge):
		return exitUsage
	case errors.Is(err, tcp.ErrAuth), errors.Is(err, tcp.ErrVersion):
		return exitUsage // the config is wrong: retrying cannot help
	}
	return exitError
}

// report prints err on stderr and returns its exit code.
func (s *session) report(err error) int {
	code := exitCode(err)
	switch code {
	case exitNotFound:
		fmt.Fprintln(s.stderr, "(not found)")
	case exitInterrupted:
		fmt.Fprintln(s.stderr, "kvcli: interrupted")
	default:
		fmt.Fprintf(s.stderr, "kvcli: %v\n", err)
	}
	return code
}

// isTerminal reports whether f is a terminal.
func isTerminal(f any) bool {
	fd, ok := f.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(fd.Fd()), unix.TCGETS)
	return err == nil
}
