package childproc

import (
	"io"
	"strings"
	"testing"
)

// TestKinds: Serve runs the entry registered for the process's kind, and
// refuses a kind the binary does not serve, naming the ones it does; a
// kind registered twice panics.
func TestKinds(t *testing.T) {
	ran := ""
	Register("test-a", func(io.Reader, io.Writer) error { ran = "a"; return nil })
	Register("test-b", func(io.Reader, io.Writer) error { ran = "b"; return nil })
	t.Setenv(Env, "test-b")
	if err := Serve(); err != nil || ran != "b" {
		t.Fatalf("Serve as test-b: ran %q, err %v", ran, err)
	}
	t.Setenv(Env, "test-c")
	err := Serve()
	if err == nil || !strings.Contains(err.Error(), `"test-c"`) || !strings.Contains(err.Error(), "test-a test-b") {
		t.Fatalf("Serve as an unregistered kind: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a kind registered twice did not panic")
		}
	}()
	Register("test-a", func(io.Reader, io.Writer) error { return nil })
}
