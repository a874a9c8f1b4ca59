package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{GoVersion: "go1.25.1", Path: "github.com/rdmakv/rdmakv/cmd/kvcli",
			Main: debug.Module{Path: "github.com/rdmakv/rdmakv", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0abb62b"},
				{Key: "vcs.time", Value: "2026-11-26T06:50:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"kvcli github.com/rdmakv/rdmakv (devel), commit 0abb62b (2026-11-26T06:50:00Z) with uncommitted changes, go1.25.1"},
		{debug.BuildInfo{GoVersion: "go1.25.1", Main: debug.Module{Path: "github.com/rdmakv/rdmakv", Version: "v1.2.0"}},
			"kvcli github.com/rdmakv/rdmakv v1.2.0, go1.25.1"},
		{debug.BuildInfo{GoVersion: "go1.25.1", Main: debug.Module{Path: "github.com/rdmakv/rdmakv", Version: "(devel)"}},
			"kvcli github.com/rdmakv/rdmakv (devel), no commit recorded, go1.25.1"},
	} {
		if got := format("kvcli", &c.bi); got != c.want {
			t.Errorf("format:\n got %q\nwant %q", got, c.want)
		}
	}
	if s := String("x"); !strings.HasPrefix(s, "x ") {
		t.Errorf("String: %q", s)
	}
}
