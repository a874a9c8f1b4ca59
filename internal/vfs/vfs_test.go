package vfs

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

func TestOS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := OS.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "f")
	f, err := OS.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(0, 1<<16); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("hello"), 100); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.Stat(); st.Size() != 1<<16 {
		t.Fatalf("size %d after Allocate", st.Size())
	}
	f.Close()
	if err := OS.Rename(name, name+"2"); err != nil {
		t.Fatal(err)
	}
	if err := OS.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	b, err := ReadFile(OS, name+"2")
	if err != nil || len(b) != 1<<16 || string(b[100:105]) != "hello" || b[0] != 0 {
		t.Fatalf("read back %d bytes, %v", len(b), err)
	}
}

func TestMemCrash(t *testing.T) {
	m := NewMem()
	m.MkdirAll("/d", 0o755)
	if err := WriteFile(m, "/d/a", bytes.Repeat([]byte{1}, 3*PageSize)); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/d"); err != nil {
		t.Fatal(err)
	}
	f, _ := m.OpenFile("/d/a", os.O_RDWR, 0)
	f.WriteAt(bytes.Repeat([]byte{2}, 3*PageSize), 0)
	if !m.Unsynced("/d/a") {
		t.Fatal("Unsynced false after a write")
	}
	c := m.Clone()
	c.DropUnsynced()
	if b, _ := ReadFile(c, "/d/a"); !bytes.Equal(b, bytes.Repeat([]byte{1}, 3*PageSize)) {
		t.Fatal("DropUnsynced kept unsynced bytes")
	}
	if b, _ := ReadFile(m, "/d/a"); b[0] != 2 {
		t.Fatal("the clone's crash changed the original")
	}
	m.DropDirty("/d/a")
	if b, _ := ReadFile(m, "/d/a"); b[0] != 1 || m.Unsynced("/d/a") {
		t.Fatal("DropDirty kept the dirty pages")
	}
	// a file created and synced but its directory not: gone at a crash
	WriteFile(m, "/d/b", []byte("x"))
	m.Crash(rand.New(rand.NewPCG(1, 1)))
	if _, err := m.Stat("/d/b"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("unsynced name survived: %v", err)
	}
	if _, err := m.OpenFile("/nodir/x", os.O_CREATE|os.O_RDWR, 0o644); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("create in a missing dir: %v", err)
	}
}
