package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// --embedded: the replicas are the real kvserver binary in its embedded
// mode (no --config: every replica of groups x 3 on shm in one process,
// what `make run` starts), and the client opens the map file kvserver
// writes, as a user's program does (client.Open with WithMapFile).

// kvserverPkg is the package --embedded builds when --kvserver is not
// given.
const kvserverPkg = "github.com/rdmakv/rdmakv/cmd/kvserver"

// buildKVServer builds kvserver into dir with the go command (from the
// module kvbench runs in: `go run ./cmd/kvbench` in the repository) and
// returns its path.
func buildKVServer(dir string) (string, error) {
	bin := filepath.Join(dir, "kvserver")
	out, err := exec.Command("go", "build", "-o", bin, kvserverPkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v: %s (give a built binary with --kvserver)", kvserverPkg, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// kvserverProc is a running embedded kvserver.
type kvserverProc struct {
	cmd     *exec.Cmd
	mapFile string
	dataDir string        // a durable mode's data ("": memory); close removes it
	control string        // its control port's address ("": none known)
	exited  chan struct{} // closed once its stdout ended
}

// startKVServer runs bin as an embedded cluster of groups x 3 replicas
// named name, with its shm files in shmDir and its map (and the map's
// lock) in shmDir too, and waits until it says it is up. durability is
// kvserver's --durability (memory, sync, async); a durable mode keeps
// its data in a fresh directory under the temporary directory ($TMPDIR:
// put it on the disk to be measured), which close removes. extra are
// more of kvserver's flags (settingArgs).
func startKVServer(bin, shmDir, name string, groups int, et time.Duration, durability string, extra ...string) (*kvserverProc, error) {
	mapFile := filepath.Join(shmDir, name+".map.json")
	// A control port on loopback: its /status gives the pollers' spin and
	// park counts per op (kvPollerCost).
	control, err := freeControl()
	if err != nil {
		return nil, err
	}
	args := []string{"--groups", strconv.Itoa(groups), "--replicas", "3", "--name", name,
		"--map", mapFile, "--shm-dir", shmDir, "--control", control, "--election-timeout", et.String()}
	dataDir := ""
	if durability == "" || durability == "memory" {
		args = append(args, "--memory")
	} else {
		if dataDir, err = os.MkdirTemp("", "kvbench-data-"); err != nil {
			return nil, err
		}
		args = append(args, "--durability", durability, "--data-dir", filepath.Join(dataDir, "data"))
	}
	p, err := runKVServer(bin, mapFile, dataDir, append(args, extra...), 60*time.Second)
	if err != nil && dataDir != "" {
		os.RemoveAll(dataDir)
	}
	if p != nil {
		p.control = control
	}
	return p, err
}

// settingArgs are kvserver's --wal-layout and --spare-p flags for the
// values given ("": the flag is not passed, so that a kvserver built
// before the flags, an A/B run's base, still starts).
func settingArgs(walLayout, spareP string) []string {
	var args []string
	if walLayout != "" {
		args = append(args, "--wal-layout", walLayout)
	}
	if spareP != "" {
		args = append(args, "--spare-p", spareP)
	}
	return args
}

// kvserverHasFlag reports whether kvserver binary bin knows flag name
// (its --help lists "-name"): kvbench measures older kvservers too.
func kvserverHasFlag(bin, name string) bool {
	out := kvserverHelp(bin)
	return bytes.Contains(out, []byte("  -"+name+" ")) || bytes.Contains(out, []byte("  -"+name+"\n"))
}

// helpKey names one kvserver binary: its path, and its file's size and
// modification time, so that a binary rebuilt in place is asked again.
type helpKey struct {
	path  string
	size  int64
	mtime int64
}

// helpCache holds each kvserver binary's --help output (helpKey ->
// []byte): kvbench recover starts kvserver several times a run, and each
// start ran kvserver --help anew.
var helpCache sync.Map

// kvserverHelp is kvserver binary bin's --help output, run once a binary
// (helpCache); a binary it cannot stat is asked every time.
func kvserverHelp(bin string) []byte {
	fi, err := os.Stat(bin)
	if err != nil {
		out, _ := exec.Command(bin, "--help").CombinedOutput()
		return out
	}
	k := helpKey{bin, fi.Size(), fi.ModTime().UnixNano()}
	if out, ok := helpCache.Load(k); ok {
		return out.([]byte)
	}
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	helpCache.Store(k, out)
	return out
}

// runKVServer starts bin with args and waits until it is up, at most
// upWithin.
func runKVServer(bin, mapFile, dataDir string, args []string, upWithin time.Duration) (*kvserverProc, error) {
	cmd := exec.Command(bin, args...)
	if err := childCmd(cmd); err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &kvserverProc{cmd: cmd, mapFile: mapFile, dataDir: dataDir, exited: make(chan struct{})}
	up := make(chan string, 1)
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), " is up in ") {
				up <- sc.Text()
				break
			}
		}
		select {
		case up <- "": // it ended before it was up
		default:
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case line := <-up:
		if line == "" {
			p.kill()
			return nil, fmt.Errorf("%s exited before its cluster was up", bin)
		}
	case <-time.After(upWithin):
		p.kill()
		return nil, fmt.Errorf("%s: its cluster was not up in %v", bin, upWithin)
	case <-runCtx.Done():
		p.kill()
		return nil, errStopping
	}
	return p, nil
}

func (p *kvserverProc) pid() int { return p.cmd.Process.Pid }

// sigintWait is how long close waits for kvserver to exit after its
// SIGINT: a clean stop flushes every replica's log and abandons a disk
// snapshot's save under way after 1 s (5 s for a diff's install), its
// replicas stopped at once (issue 19: it took over 10 s at load with the
// replicas stopped one after another, and the wait was raised to 60 s).
const sigintWait = 10 * time.Second

// close stops kvserver as Ctrl-C does (SIGINT: it removes its shm files,
// map and lock), killing it if it has not exited in sigintWait.
func (p *kvserverProc) close() error {
	if p.dataDir != "" {
		defer os.RemoveAll(p.dataDir)
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() {
		<-p.exited
		done <- p.cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("kvserver: %w", err)
		}
		return nil
	case <-time.After(sigintWait):
		p.cmd.Process.Kill()
		<-done
		return fmt.Errorf("kvserver (pid %d) did not exit within %v of its SIGINT, where a clean stop takes a few seconds: killed (a stop that hangs: its stderr above says how far it got)", p.pid(), sigintWait)
	}
}

func (p *kvserverProc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
	p.cmd.Wait()
}
