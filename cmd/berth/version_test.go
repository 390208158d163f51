package main

import (
	"runtime/debug"
	"testing"
)

func TestVersionString(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	info := func(v string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{Main: debug.Module{Version: v}, Settings: settings}, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	tests := []struct {
		name, v, c string
		info       func() (*debug.BuildInfo, bool)
		want       string
	}{
		{"stamped", "v0.3.0-4-g0123456", rev, none, "v0.3.0-4-g0123456 (commit 0123456789ab)"},
		{"stamped dirty", "v0.3.0-dirty", rev + "-dirty", none, "v0.3.0-dirty (commit 0123456789ab-dirty)"},
		{"build info", "", "", info("(devel)", debug.BuildSetting{Key: "vcs.revision", Value: rev}), "devel (commit 0123456789ab)"},
		{"build info dirty", "", "", info("v1.2.3", debug.BuildSetting{Key: "vcs.revision", Value: rev}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "v1.2.3 (commit 0123456789ab-dirty)"},
		{"nothing", "", "", none, "devel (commit unknown)"},
	}
	for _, tt := range tests {
		if got := versionString(tt.v, tt.c, tt.info); got != tt.want {
			t.Errorf("%s: versionString = %q, want %q", tt.name, got, tt.want)
		}
	}
}
