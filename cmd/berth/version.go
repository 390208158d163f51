package main

import "runtime/debug"

// buildVersion is the module version berth was built from ("(devel)" for a
// plain go build), plus the VCS revision when the build recorded one.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}
