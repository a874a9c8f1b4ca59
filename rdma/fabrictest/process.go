package fabrictest

import (
	"fmt"
	"os"
	"testing"
)

// Main runs the test binary: when RoleEnv is set, the process is a helper
// started by the suite and plays that role with h; otherwise it runs the
// tests. Call it from TestMain of every fabric's tests.
func Main(m *testing.M, h Harness) {
	if role := os.Getenv(RoleEnv); role != "" {
		os.Exit(runRole(role, h))
	}
	os.Exit(m.Run())
}

func runRole(role string, h Harness) int {
	fmt.Fprintf(os.Stderr, "fabrictest: unknown role %q\n", role)
	return 2
}

func runCrossProcess(t *testing.T, h Harness) {
	t.Skip("not yet")
}
