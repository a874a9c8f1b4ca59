// Package planted runs a test's table of planted bugs: the check aimed at
// each plant must fail by its own message, and with no plant it must
// pass (the project's rule: a safety check is proven by the bug it
// catches, and the test says which property failed).
package planted

import (
	"strings"
	"testing"
)

// Case is one run of a planted-bug table: Name is the knob ("none": no
// plant), Want the message of the check that must fail ("": none).
type Case struct{ Name, Want string }

// Run runs check once per case as subtest "planted=NAME": with no plant
// the check must pass (return ""); with one, its error must contain
// the Want of the check aimed at that plant.
func Run(t *testing.T, check func(t *testing.T, knob string) string, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run("planted="+tc.Name, func(t *testing.T) {
			err := check(t, tc.Name)
			if tc.Want == "" {
				if err != "" {
					t.Fatal(err)
				}
				return
			}
			t.Logf("planted %s: %s", tc.Name, err)
			if !strings.Contains(err, tc.Want) {
				t.Fatalf("planted %s: got %q, want the %q check to fail", tc.Name, err, tc.Want)
			}
		})
	}
}
