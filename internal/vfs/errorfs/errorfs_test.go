package errorfs

import (
	"errors"
	"io"
	"os"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

func TestInjectors(t *testing.T) {
	mem := vfs.NewMem()
	space := ENOSPCAfter(100)
	fs := Wrap(mem, Any(OnNth(OpWrite, 2, ShortWrite(3)), OnPath("*.log", OpSync, syscall.EIO), space))
	f, err := fs.OpenFile("/a.log", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("0123456789"), 0); err != nil {
		t.Fatal(err)
	}
	n, err := f.WriteAt([]byte("abcdef"), 10)
	if n != 3 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write: %d, %v", n, err)
	}
	if b, _ := vfs.ReadFile(mem, "/a.log"); string(b) != "0123456789abc" {
		t.Fatalf("after the short write the file is %q", b)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("sync of *.log: %v", err)
	}
	if _, err := f.WriteAt(make([]byte, 95), 20); !errors.Is(err, syscall.ENOSPC) || space.Fails() != 1 {
		t.Fatalf("write past the space: %v", err)
	}
	space.Free(1000)
	if _, err := f.WriteAt(make([]byte, 95), 20); err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(0, 2000); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("allocate past the space: %v", err)
	}
}
