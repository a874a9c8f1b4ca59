package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runArgs(args ...string) (string, string, int) {
	var o, e bytes.Buffer
	code := run(args, &o, &e)
	return o.String(), e.String(), code
}

// kvserver init --shm writes a one-host config that kvserver check
// accepts: fabric shm, no addresses or secret, 2 groups x 3 replicas.
func TestInitShm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.toml")
	out, errOut, code := runArgs("init", "--shm", path)
	if code != 0 || !strings.Contains(out, "wrote "+path) || !strings.Contains(out, "kvserver --config "+path+" --id <N>") {
		t.Fatalf("init --shm: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = runArgs("check", "--config", path)
	if code != 0 {
		t.Fatalf("check of init --shm's config: exit %d, stderr %q", code, errOut)
	}
	if !strings.Contains(out, "fabric shm, 2 groups, 16 client slots") || strings.Count(out, "\n  group ") != 6 || strings.Contains(out, " addr ") ||
		!strings.Contains(out, "durability sync: a write is acknowledged once a majority of its group has it on disk") {
		t.Errorf("check of init --shm's config:\n%s", out)
	}
	// And the same text on stdout with -; the default stays tcp.
	b, _ := os.ReadFile(path)
	if out, _, code := runArgs("init", "--shm", "-"); code != 0 || out != string(b) {
		t.Errorf("init --shm -: exit %d, not the file's text", code)
	}
	if out, _, code := runArgs("init", "-"); code != 0 || !strings.Contains(out, `fabric = "tcp"`) {
		t.Errorf("init -: exit %d:\n%s", code, out)
	}
}

// TestInitKeyspaceExample: the [[keyspace]] example init writes, once
// uncommented, is a valid config whose check lists the keyspace.
func TestInitKeyspaceExample(t *testing.T) {
	out, errOut, code := runArgs("init", "--shm", "-")
	if code != 0 {
		t.Fatalf("init --shm -: exit %d: %s", code, errOut)
	}
	for _, l := range []string{"[[keyspace]]", `name = "users"`, `kind = "ordered"`, `node_size = "4KiB"`} {
		if !strings.Contains(out, "# "+l) {
			t.Fatalf("init's config has no commented %q", l)
		}
		out = strings.Replace(out, "# "+l, l, 1)
	}
	path := filepath.Join(t.TempDir(), "cluster.toml")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runArgs("check", "--config", path)
	if code != 0 || !strings.Contains(out, `keyspace "users": ordered (id 1), nodes of 4096 bytes`) {
		t.Fatalf("check: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// Counts read as English: "1 group", "1 client slot".
func TestCheckSingular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.toml")
	cfg := "name = \"one\"\nfabric = \"shm\"\ndata_dir = \"data\"\n[[group]]\n  [[group.replica]]\n  id = 1\n[[clients]]\ncount = 1\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runArgs("check", "--config", path)
	// No durability field: memory mode, and check says what that loses.
	if code != 0 || !strings.Contains(out, "fabric shm, 1 group, 1 client slot, ") || !strings.Contains(out, "durability memory: ") || !strings.Contains(out, "loses its data") {
		t.Errorf("check: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestVersionFlag(t *testing.T) {
	for _, a := range []string{"--version", "-version", "version"} {
		out, _, code := runArgs(a)
		if code != 0 || !strings.HasPrefix(out, "kvserver github.com/rdmakv/rdmakv ") {
			t.Errorf("kvserver %s: exit %d, %q", a, code, out)
		}
	}
}
