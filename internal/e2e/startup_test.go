package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// refused runs kvserver --config path --id id to its end and checks that
// it exits with a code other than 0 and writes exactly one line on
// stderr, which contains every string of want.
func refused(t *testing.T, bin, path string, id int64, want ...string) {
	t.Helper()
	code, stdout, stderr := runOnce(t, bin, 30*time.Second, "--config", path, "--id", strconv.FormatInt(id, 10))
	line := strings.TrimRight(stderr, "\n")
	switch {
	case code == 0:
		t.Errorf("kvserver --id %d: exit code 0, want an error; stderr:\n%s", id, stderr)
	case line == "" || strings.Contains(line, "\n"):
		t.Errorf("kvserver --id %d: exit code %d and %d lines on stderr, want one line naming the cause:\n%s", id, code, strings.Count(stderr, "\n"), stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("kvserver --id %d: stderr does not name %q:\n%s", id, w, stderr)
		}
	}
	if stdout != "" {
		t.Errorf("kvserver --id %d: refused, yet wrote on stdout: %s", id, stdout)
	}
	t.Logf("exit code %d: %s", code, line)
}

// listen holds addr for the rest of the test.
func listen(t *testing.T, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("hold %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
}

// lockFree reports whether the data dir lock of replica id is free (no
// process holds it): it takes it and lets it go at once.
func lockFree(t *testing.T, c *tcluster, id int64) bool {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(c.cfg.ReplicaDir(id), "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("replica %d's lock file: %v", id, err)
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return true
}

// shmFiles lists the files of the shm dir (of replica id's node if id is
// not 0).
func shmFiles(t *testing.T, c *tcluster, id int64) []string {
	t.Helper()
	es, err := os.ReadDir(c.cfg.ShmDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		if id == 0 || strings.HasPrefix(e.Name(), fmt.Sprintf("rdmakv.%s.%d.", c.cfg.Name, id)) {
			names = append(names, e.Name())
		}
	}
	return names
}

// privateShmSpec is a 1-group shm config whose shm dir is in the test's
// temp dir.
func privateShmSpec(t *testing.T, what string) spec {
	s := loopbackSpec(t, what, "shm", 1)
	s.ShmDir = filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(s.ShmDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStartupErrors checks that kvserver --config FILE --id N refuses to
// start, with an exit code other than 0 and one line on stderr naming the
// cause, when the id is not in the config, when the replica already runs,
// when its control port or its tcp address is in use, when its data dir
// holds another cluster's state, when its members refuse its secret, and
// when the config is malformed (naming the line). And that SIGTERM stops
// a replica with exit code 0, removes its shm files and releases its data
// dir's lock.
func TestStartupErrors(t *testing.T) {
	bin := kvserverBin(t)

	t.Run("unknown-id", func(t *testing.T) {
		c := newCluster(t, privateShmSpec(t, "id"))
		refused(t, bin, c.path, 99, "replica 99 is not in", c.path)
	})

	t.Run("second-process", func(t *testing.T) {
		c := newCluster(t, privateShmSpec(t, "twice"))
		p := c.start(1)
		refused(t, bin, c.path, 1, "replica 1 already runs", fmt.Sprintf("process %d", p.cmd.Process.Pid))
		if p.exited() {
			t.Errorf("the first process of replica 1 exited: %v", p.state)
		}
	})

	t.Run("control-port-in-use", func(t *testing.T) {
		c := newCluster(t, privateShmSpec(t, "ctl"))
		c.start(1)
		_, r := c.replica(2)
		listen(t, r.Control)
		refused(t, bin, c.path, 2, r.Control, "in use")
		// Refused means it did nothing: it joined no election and wrote
		// no stable state.
		if _, err := os.Stat(filepath.Join(c.cfg.ReplicaDir(2), "stable")); err == nil {
			t.Errorf("replica 2 was refused, yet it had started: it wrote its stable state %s", filepath.Join(c.cfg.ReplicaDir(2), "stable"))
		}
	})

	t.Run("tcp-addr-in-use", func(t *testing.T) {
		c := newCluster(t, loopbackSpec(t, "addr", "tcp", 1))
		_, r := c.replica(1)
		listen(t, r.Addr)
		refused(t, bin, c.path, 1, r.Addr, "in use")
	})

	t.Run("data-dir-of-another-cluster", func(t *testing.T) {
		s := privateShmSpec(t, "dir")
		s.Name = "a"
		c := newCluster(t, s)
		c.start(1)
		if code := c.term(1); code != 0 {
			t.Fatalf("replica 1 of cluster a: exit code %d after SIGTERM", code)
		}
		c.spec.Name = "b"
		c.writeConfig()
		refused(t, bin, c.path, 1, c.cfg.ReplicaDir(1), `cluster "a"`, `cluster "b"`)
	})

	t.Run("wrong-secret", func(t *testing.T) {
		c := newCluster(t, loopbackSpec(t, "secret", "tcp", 1))
		c.start(1)
		c.start(2)
		c.waitReady(30*time.Second, 1, 2)
		other := c.spec
		other.SecretFile = writeSecret(t, t.TempDir(), "other-secret")
		path := filepath.Join(c.dir, "other.toml") // the same data_dir
		if err := os.WriteFile(path, []byte(other.TOML()), 0o644); err != nil {
			t.Fatal(err)
		}
		refused(t, bin, path, 3, "cluster secret")
		if ok, why := c.ready(1); !ok {
			t.Errorf("replica 1 not ready after replica 3 was refused: %s", why)
		}
	})

	// A replica that ran before restarts with a wrong secret: it has
	// stable state, so it does not probe its members at start. It must
	// still say what is wrong: exit naming the secret, or at least log it.
	t.Run("wrong-secret-after-restart", func(t *testing.T) {
		c := newCluster(t, loopbackSpec(t, "secret2", "tcp", 1))
		c.startAll()
		c.waitReady(30*time.Second, c.allIDs()...)
		if code := c.term(3); code != 0 {
			t.Fatalf("replica 3: exit code %d after SIGTERM", code)
		}
		c.spec.SecretFile = writeSecret(t, t.TempDir(), "other-secret")
		c.writeConfig()
		p := c.spawn(3)
		deadline := time.Now().Add(5 * time.Second)
		for !p.exited() && !strings.Contains(p.stderr.String(), "cluster secret") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		switch {
		case p.exited() && p.state.ExitCode() != 0 && strings.Contains(p.stderr.String(), "cluster secret"):
			t.Logf("refused: exit code %d: %s", p.state.ExitCode(), strings.TrimSpace(p.stderr.String()))
		case !p.exited() && strings.Contains(p.stderr.String(), "cluster secret"):
			t.Logf("runs and says: %s", p.stderr.String())
		default:
			t.Errorf("replica 3, restarted with another secret than its members', neither exits naming the secret nor logs it within 5s (exited %v, %v); stderr:\n%s",
				p.exited(), p.state, p.stderr.String())
		}
	})

	t.Run("malformed-config", func(t *testing.T) {
		dir := t.TempDir()
		gs := privateShmSpec(t, "bad")
		good := gs.TOML()
		lines := strings.Split(good, "\n")
		lineOf := func(prefix string) int {
			for i, l := range lines {
				if strings.HasPrefix(strings.TrimSpace(l), prefix) {
					return i + 1
				}
			}
			t.Fatalf("no line %q in\n%s", prefix, good)
			return 0
		}
		// set replaces the first line starting with prefix.
		set := func(prefix, with string) string {
			n := lineOf(prefix)
			ls := append([]string(nil), lines...)
			ls[n-1] = with
			return strings.Join(ls, "\n")
		}
		for _, tc := range []struct {
			name, text string
			line       int
			want       string
		}{
			{"syntax", set("fabric", "fabric = "), lineOf("fabric"), ""},
			{"unknown-field", set("data_dir", "data_dri = \"data\""), lineOf("data_dir"), "data_dri"},
			{"bad-duration", set("heartbeat", "heartbeat = \"fast\""), lineOf("heartbeat"), "heartbeat"},
			{"bad-fabric", set("fabric", "fabric = \"rdma\""), lineOf("fabric"), "fabric"},
			{"duplicate-id", set("id = 2", "  id = 1"), lineOf("id = 2"), "id"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				path := filepath.Join(dir, tc.name+".toml")
				if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
					t.Fatal(err)
				}
				want := []string{fmt.Sprintf("%s:%d:", path, tc.line)}
				if tc.want != "" {
					want = append(want, tc.want)
				}
				refused(t, bin, path, 1, want...)
			})
		}
	})

	t.Run("sigterm", func(t *testing.T) {
		c := newCluster(t, privateShmSpec(t, "term"))
		c.startAll()
		ids := c.allIDs()
		c.waitReady(30*time.Second, ids...)
		if len(shmFiles(t, c, 0)) == 0 {
			t.Fatalf("no file in the shm dir %s while 3 replicas run", c.cfg.ShmDir)
		}
		// A follower first, while the others run: its files go, its lock
		// is free, and it starts again from its data dir.
		f := c.followers(0, c.leader(0, 10*time.Second))[0]
		stopped := func(id int64) {
			t.Helper()
			if lockFree(t, c, id) {
				t.Errorf("replica %d runs, yet its data dir's lock is free", id)
			}
			if code := c.term(id); code != 0 {
				t.Errorf("replica %d: exit code %d after SIGTERM, want 0: %s", id, code, tail(c.proc(id).stderr.String(), 2<<10))
			}
			if left := shmFiles(t, c, id); len(left) > 0 {
				t.Errorf("replica %d stopped by SIGTERM left files in the shm dir: %v", id, left)
			}
			if !lockFree(t, c, id) {
				t.Errorf("replica %d stopped by SIGTERM, yet its data dir's lock is held", id)
			}
			if e := c.proc(id).stderr.String(); strings.Contains(e, "level=ERROR") {
				t.Errorf("replica %d logged errors: %s", id, e)
			}
		}
		stopped(f)
		c.start(f)
		c.waitReady(30*time.Second, f)
		if s, err := c.status(f); err != nil || !c.proc(f).logged("start=existing") {
			t.Errorf("replica %d did not restart as the same member after SIGTERM (%+v, %v): %s", f, s, err, c.proc(f).stderr.String())
		}
		for _, id := range ids {
			stopped(id)
		}
		if left := shmFiles(t, c, 0); len(left) > 0 {
			t.Errorf("files left in the shm dir after SIGTERM of every replica: %v", left)
		}
	})
}
