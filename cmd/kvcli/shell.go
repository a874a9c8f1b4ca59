package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/ergochat/readline"
)

// historyLimit bounds the history file (lines kept).
const historyLimit = 1000

// historyPath is where the shell keeps its history by default:
// $XDG_STATE_HOME/rdmakv/kvcli_history, or ~/.rdmakv_history without
// XDG_STATE_HOME.
func historyPath() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "rdmakv", "kvcli_history")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return filepath.Join(h, ".rdmakv_history")
	}
	return ""
}

// interrupter cancels the command under way when SIGINT arrives (Ctrl-C
// while a command runs: the terminal is not in raw mode then).
type interrupter struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	hits   int // SIGINTs seen
	sigc   chan os.Signal
	done   chan struct{}
}

func newInterrupter(onTerm func()) *interrupter {
	in := &interrupter{sigc: make(chan os.Signal, 4), done: make(chan struct{})}
	signal.Notify(in.sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-in.done:
				return
			case sig := <-in.sigc:
				in.mu.Lock()
				in.hits++
				if in.cancel != nil {
					in.cancel()
				}
				in.mu.Unlock()
				if sig != os.Interrupt && onTerm != nil {
					onTerm()
				}
			}
		}
	}()
	return in
}

// command returns the context of a command and the function that ends it.
func (in *interrupter) command() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	in.mu.Lock()
	in.cancel = cancel
	in.mu.Unlock()
	return ctx, func() {
		in.mu.Lock()
		in.cancel = nil
		in.mu.Unlock()
		cancel()
	}
}

func (in *interrupter) count() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hits
}

func (in *interrupter) interrupted() bool { return in.count() > 0 }

func (in *interrupter) stop() {
	signal.Stop(in.sigc)
	close(in.done)
}

// interactive runs the shell on a terminal.
func (s *session) interactive() int {
	s.mode, s.hints = interactive, true
	if s.history != "" {
		// Created private before the line editor opens it (values are
		// in the history); a history that cannot be kept is not fatal.
		os.MkdirAll(filepath.Dir(s.history), 0o700)
		if f, err := os.OpenFile(s.history, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			fmt.Fprintf(s.stderr, "kvcli: history off: %v\n", err)
			s.history = ""
		} else {
			f.Close()
		}
	}
	cfg := &readline.Config{
		Prompt:                 "kvcli> ",
		HistoryFile:            s.history,
		HistoryLimit:           historyLimit,
		DisableAutoSaveHistory: true,
		AutoComplete:           completer{s: s},
		Stdin:                  s.stdin,
		Stdout:                 s.stdout,
		Stderr:                 s.stderr,
	}
	if s.history == "" {
		cfg.HistoryLimit = -1
	}
	rl, err := readline.NewFromConfig(cfg)
	if err != nil {
		fmt.Fprintf(s.stderr, "kvcli: %v\n", err)
		return exitError
	}
	defer rl.Close()
	in := newInterrupter(func() { rl.Close() })
	defer in.stop()

	// Connect at once, to say where to; a cluster that is not there yet
	// is opened by the first command that needs it.
	s.setPrompt = func() {
		p := "kvcli"
		if s.c != nil {
			p = s.c.Map().Name
		}
		if s.keyspace != "" {
			p += "/" + s.keyspace
		}
		rl.SetPrompt(p + "> ")
	}
	ctx, end := in.command()
	if s.open(ctx, s.defs.timeout, false) == exitOK {
		m := s.c.Map()
		fmt.Fprintf(s.stdout, "kvcli: cluster %q, %s x %s on %s (%s)\n", m.Name, plural(len(m.Groups), "group"), plural(len(m.Groups[0]), "replica"), m.Fabric, s.where())
		if s.keyspace != "" {
			if _, err := m.FindKeyspace(s.keyspace); err != nil {
				fmt.Fprintf(s.stderr, "kvcli: --keyspace: unknown keyspace %q (%s); using the default keyspace\n", s.keyspace, s.declared())
				s.keyspace = ""
			}
		}
		s.setPrompt()
	}
	end()
	fmt.Fprintln(s.stdout, "Type help for the commands, Tab to complete, Ctrl-D or exit to leave.")
	prev := ""
	for !s.exit {
		line, err := rl.ReadLine()
		if errors.Is(err, readline.ErrInterrupt) {
			continue // Ctrl-C: the line is dropped
		}
		if err != nil { // io.EOF: Ctrl-D on an empty line, or Close
			fmt.Fprintln(s.stdout)
			break
		}
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(line, " ") && t != prev {
			rl.SaveToHistory(t)
			prev = t
		}
		words, err := splitWords(line)
		if err != nil {
			fmt.Fprintf(s.stderr, "kvcli: %v\n", err)
			continue
		}
		if len(words) == 0 || strings.HasPrefix(words[0], "#") {
			continue
		}
		ctx, end := in.command()
		hits := in.count()
		s.exec(ctx, words)
		end()
		if in.count() != hits {
			fmt.Fprintln(s.stdout) // after the terminal's ^C
		}
	}
	return exitOK
}

// piped runs the commands read from stdin, one a line, without prompts. It
// stops at the first command that fails, with its exit code, unless
// keepGoing (then it runs every line and exits with the first failure's
// code). Ctrl-C ends the command under way and the run (130).
func (s *session) piped(keepGoing bool) int {
	s.mode, s.hints = piped, true
	in := newInterrupter(nil)
	defer in.stop()
	lines := make(chan string)
	readErr := make(chan error, 1)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(s.stdin)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-quit:
				return
			}
		}
		readErr <- sc.Err()
	}()
	first := exitOK
	n := 0
	for line := range lines {
		n++
		if in.interrupted() {
			return exitInterrupted
		}
		words, err := splitWords(line)
		if err == nil && (len(words) == 0 || strings.HasPrefix(words[0], "#")) {
			continue
		}
		code := exitUsage
		if err != nil {
			fmt.Fprintf(s.stderr, "kvcli: line %d: %v\n", n, err)
		} else {
			ctx, end := in.command()
			code = s.exec(ctx, words)
			end()
			if code != exitOK {
				fmt.Fprintf(s.stderr, "kvcli: line %d: %s: exit %d\n", n, words[0], code)
			}
		}
		if in.interrupted() {
			return exitInterrupted
		}
		if s.exit {
			break
		}
		if code != exitOK && first == exitOK {
			first = code
			if !keepGoing {
				return first
			}
		}
	}
	select {
	case err := <-readErr:
		if err != nil {
			fmt.Fprintf(s.stderr, "kvcli: read stdin: %v\n", err)
			if first == exitOK {
				first = exitError
			}
		}
	default:
	}
	return first
}

// splitWords splits a command line into words as a shell would: blanks
// separate words; '...' is literal; in "..." and outside quotes a
// backslash takes the next character literally.
func splitWords(line string) ([]string, error) {
	words, _, open := scanWords(line)
	if open != 0 {
		return nil, fmt.Errorf("unterminated %c quote", open)
	}
	return words, nil
}

// scanWords splits line into words; partial reports whether the last word
// runs to the end of the line (no blank after it), and open is the quote
// left open at the end (0 if none).
func scanWords(line string) (words []string, partial bool, open rune) {
	var cur strings.Builder
	inWord := false
	esc := false
	for _, r := range line {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case open == '\'':
			if r == '\'' {
				open = 0
			} else {
				cur.WriteRune(r)
			}
		case open == '"':
			switch r {
			case '"':
				open = 0
			case '\\':
				esc = true
			default:
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			open, inWord = r, true
		case r == '\\':
			esc, inWord = true, true
		case r == ' ' || r == '\t' || r == '\n' || r == '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if esc && open == 0 {
		cur.WriteRune('\\')
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, inWord, open
}

// completer completes command names, flags and flag values, batch's op
// words and use's keyspace names (from the map of s's client; s nil: none).
type completer struct{ s *session }

func (c completer) Do(line []rune, pos int) ([][]rune, int) {
	words, partial, open := scanWords(string(line[:pos]))
	if open != 0 {
		return nil, 0
	}
	cur := ""
	if partial {
		cur, words = words[len(words)-1], words[:len(words)-1]
	}
	if strings.ContainsAny(cur, `'"\`) {
		return nil, 0
	}
	cands := candidates(words, cur)
	if len(words) == 1 && words[0] == "use" && c.s != nil {
		cands = c.s.keyspaceNames()
	}
	var out [][]rune
	for _, c := range cands {
		if strings.HasPrefix(c, cur) {
			out = append(out, []rune(c[len(cur):]+" "))
		}
	}
	return out, len([]rune(cur))
}

// candidates are the words that may come after words (cur: the prefix
// typed so far).
func candidates(words []string, cur string) []string {
	if len(words) == 0 {
		return commandNames(true)
	}
	c := lookup(words[0])
	if c == nil {
		return nil
	}
	if c.name == "help" {
		if len(words) == 1 {
			return commandNames(true)
		}
		return nil
	}
	last := words[len(words)-1]
	if strings.HasPrefix(last, "--") || strings.HasPrefix(last, "-") && len(last) > 1 {
		if vs, ok := flagValues[strings.TrimLeft(last, "-")]; ok {
			return vs
		}
	}
	// Positional words so far (flags and their values skipped).
	var pos []string
	for i := 1; i < len(words); i++ {
		w := words[i]
		if len(pos) == 0 && strings.HasPrefix(w, "-") && w != "-" {
			name := strings.TrimLeft(w, "-")
			if h, ok := flagHelp[name]; ok && h[0] != "" && !strings.Contains(name, "=") {
				i++ // the flag's value
			}
			continue
		}
		pos = append(pos, w)
	}
	if strings.HasPrefix(cur, "-") && len(pos) == 0 {
		var fs []string
		for _, f := range c.flags {
			fs = append(fs, "--"+f)
		}
		return fs
	}
	if c.name == "batch" {
		// Where an op word is due: put takes 2 words, del 1.
		for i := 0; i < len(pos); {
			switch pos[i] {
			case "put":
				i += 3
			case "del":
				i += 2
			default:
				return nil
			}
			if i > len(pos) {
				return nil
			}
		}
		return []string{"put", "del"}
	}
	return nil
}
