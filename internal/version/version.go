// Package version is what the commands print for --version: the module's
// version and the VCS revision the binary was built from, as the Go
// toolchain recorded them (runtime/debug.ReadBuildInfo).
package version

import (
	"fmt"
	"runtime/debug"
)

// String is cmd's version line, e.g.
//
//	kvcli github.com/rdmakv/rdmakv (devel), commit 0abb62b… (2026-11-26T06:50:00Z), go1.25.1
//
// A binary built by go build or go install in a git checkout names its
// commit (and "with uncommitted changes" if the tree had any); one
// installed with go install MODULE@VERSION names the module version; go
// run, go test and -buildvcs=false record no commit.
func String(cmd string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return cmd + " (built without module information)"
	}
	return format(cmd, bi)
}

func format(cmd string, bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	path := bi.Main.Path
	if path == "" {
		path = bi.Path
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	out := fmt.Sprintf("%s %s %s", cmd, path, v)
	if rev != "" {
		out += ", commit " + rev
		if at != "" {
			out += " (" + at + ")"
		}
		if modified {
			out += " with uncommitted changes"
		}
	} else if v == "(devel)" {
		out += ", no commit recorded"
	}
	return out + ", " + bi.GoVersion
}
