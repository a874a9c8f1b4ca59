package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// TestKVSettingsFlags: kv's --wal-layout and --spare-p take kvserver's
// values and pass kvserver's flags through only when given (a kvserver
// built before them, an A/B run's base, still starts without them);
// --wal-layout goes with --embedded and a durable mode; a bad value is
// refused naming the flag.
func TestKVSettingsFlags(t *testing.T) {
	o, err := parseKVFlags([]string{"--embedded", "--durability", "sync", "--wal-layout", "shared", "--spare-p", "off"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := settingArgs(o.walLayout, o.spareP); !slices.Equal(got, []string{"--wal-layout", "shared", "--spare-p", "off"}) {
		t.Errorf("kvserver's flags %q", got)
	}
	if o, err = parseKVFlags([]string{"--embedded"}, io.Discard); err != nil || settingArgs(o.walLayout, o.spareP) != nil {
		t.Errorf("no settings given: %v, %v; want none passed", settingArgs(o.walLayout, o.spareP), err)
	}
	if o, err = parseKVFlags([]string{"--spare-p", "off"}, io.Discard); err != nil || o.spareP != "off" {
		t.Errorf("the child's --spare-p off: %q, %v", o.spareP, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--wal-layout", "shared"}, "--wal-layout goes with --embedded and --durability async or sync"},
		{[]string{"--embedded", "--wal-layout", "shared"}, "--wal-layout goes with --embedded and --durability async or sync"},
		{[]string{"--embedded", "--durability", "sync", "--wal-layout", "one"}, `--wal-layout "one": want "per-replica" or "shared"`},
		{[]string{"--spare-p", "on"}, `--spare-p "on": want "auto" or "off"`},
	} {
		if _, err := parseKVFlags(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kv %v: %v, want %q", c.args, err, c.want)
		}
	}
	if _, err := parseRecoverFlags([]string{"--spare-p", "x"}, io.Discard); err == nil || !strings.Contains(err.Error(), `--spare-p "x": want "auto" or "off"`) {
		t.Errorf("recover --spare-p x: %v", err)
	}
}
