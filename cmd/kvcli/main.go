// Command kvcli reads and writes an rdmakv cluster from the command line.
//
//	kvcli put KEY VALUE     store VALUE (VALUE "-" reads it from stdin)
//	kvcli get KEY           print the value
//	kvcli del KEY           delete
//	kvcli cas KEY OLD NEW   store NEW if the value is OLD (--absent: if there is none)
//
// With no --map, kvcli uses the map of the local cluster that kvserver
// started with no arguments. Exit codes: 0 done, 1 key not found, 2 usage
// error, 3 compare-and-swap mismatch, 4 cluster unavailable or timed out,
// 5 any other error. The interactive shell is not built yet.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// Exit codes.
const (
	exitOK          = 0
	exitNotFound    = 1
	exitUsage       = 2
	exitMismatch    = 3
	exitUnavailable = 4
	exitError       = 5
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: kvcli [flags] COMMAND [ARGS]

Commands:
  put KEY VALUE     store VALUE under KEY (VALUE "-": read it from stdin)
  get KEY           print KEY's value
  del KEY           delete KEY
  cas KEY OLD NEW   store NEW if KEY's value is OLD (with --absent: if KEY has none; then give KEY NEW)

Exit codes: 0 done, 1 key not found, 2 usage error, 3 compare-and-swap
mismatch, 4 cluster unavailable or timed out, 5 any other error.

Flags:
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvcli", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	mapFile := fs.String("map", client.DefaultMapFile, "the cluster map (kvserver with no arguments writes it here)")
	consistency := fs.String("consistency", "linearizable", "gets: linearizable or stale-ok")
	asJSON := fs.Bool("json", false, "print results as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on each command, retries included")
	absent := fs.Bool("absent", false, "cas: the key must have no value (cas KEY NEW)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	var mode client.Consistency
	switch *consistency {
	case "linearizable":
		mode = client.Linearizable
	case "stale-ok":
		mode = client.StaleOK
	default:
		fmt.Fprintf(stderr, "kvcli: --consistency %q: want linearizable or stale-ok\n", *consistency)
		return exitUsage
	}
	a := fs.Args()
	want := map[string]int{"put": 2, "get": 1, "del": 1, "cas": 3}
	if len(a) == 0 {
		fs.Usage()
		return exitUsage
	}
	n, ok := want[a[0]]
	if a[0] == "cas" && *absent {
		n = 2
	}
	if !ok || len(a)-1 != n {
		if !ok {
			fmt.Fprintf(stderr, "kvcli: unknown command %q (put, get, del, cas)\n", a[0])
		} else {
			fmt.Fprintf(stderr, "kvcli: %s takes %d arguments, got %d\n", a[0], n, len(a)-1)
		}
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := client.Open(ctx, client.WithMapFile(*mapFile), client.WithTimeout(*timeout))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(stderr, "kvcli: no cluster map at %s: start a local cluster with `go run ./cmd/kvserver`, or give --map\n", *mapFile)
			return exitUnavailable
		}
		return report(stderr, err)
	}
	defer c.Close()
	out := result{Command: a[0], Key: a[1]}
	switch a[0] {
	case "get":
		it, err := c.GetItem(ctx, []byte(a[1]), mode)
		if err != nil {
			return finish(stdout, stderr, out, err, *asJSON)
		}
		out.Value, out.Version, out.Applied = string(it.Value), it.Version, it.Applied
		if *asJSON {
			return finish(stdout, stderr, out, nil, true)
		}
		fmt.Fprintf(stdout, "%s\n", it.Value)
		return exitOK
	case "put":
		v := []byte(a[2])
		if a[2] == "-" {
			if v, err = io.ReadAll(stdin); err != nil {
				return report(stderr, fmt.Errorf("read the value from stdin: %w", err))
			}
		}
		w, err := c.Put(ctx, []byte(a[1]), v)
		out.Version, out.Prev = w.Version, w.Prev
		return finish(stdout, stderr, out, err, *asJSON)
	case "del":
		w, err := c.Delete(ctx, []byte(a[1]))
		out.Version, out.Prev = w.Version, w.Prev
		return finish(stdout, stderr, out, err, *asJSON)
	default: // cas
		var old, nv []byte
		if *absent {
			nv = []byte(a[2])
		} else {
			old, nv = []byte(a[2]), []byte(a[3])
		}
		w, err := c.CompareAndSwap(ctx, []byte(a[1]), old, nv)
		out.Version, out.Prev = w.Version, w.Prev
		return finish(stdout, stderr, out, err, *asJSON)
	}
}

type result struct {
	Command string `json:"command"`
	Key     string `json:"key"`
	Value   string `json:"value,omitempty"`
	Version uint64 `json:"version,omitempty"`
	Prev    uint64 `json:"prev_version,omitempty"`
	Applied uint64 `json:"applied,omitempty"`
	Error   string `json:"error,omitempty"`
}

func finish(stdout, stderr io.Writer, out result, err error, asJSON bool) int {
	code := exitOK
	if err != nil {
		code = code0(err)
		out.Error = err.Error()
	}
	if asJSON {
		json.NewEncoder(stdout).Encode(out)
		return code
	}
	if err != nil {
		return report(stderr, err)
	}
	if out.Command != "get" {
		fmt.Fprintln(stdout, "OK")
	}
	return code
}

func code0(err error) int {
	switch {
	case errors.Is(err, client.ErrNotFound):
		return exitNotFound
	case errors.Is(err, client.ErrCASMismatch):
		return exitMismatch
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, client.ErrOutcomeUnknown):
		return exitUnavailable
	case errors.Is(err, client.ErrEmptyKey), errors.Is(err, client.ErrKeyTooLarge), errors.Is(err, client.ErrValueTooLarge):
		return exitUsage
	}
	return exitError
}

func report(stderr io.Writer, err error) int {
	switch code := code0(err); code {
	case exitNotFound:
		fmt.Fprintln(stderr, "(not found)")
		return code
	default:
		fmt.Fprintf(stderr, "kvcli: %v\n", err)
		return code
	}
}
