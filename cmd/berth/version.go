package main

import "runtime/debug"

// version and commit are stamped at build time by scripts/build.sh:
//
//	go build -ldflags "-X main.version=v0.3.0-4-gabc -X main.commit=abc…" ./cmd/berth
//
// A plain go build leaves them empty, and buildVersion falls back on what
// the Go toolchain recorded (the module version and the VCS revision).
var version, commit string

// buildVersion is "VERSION (commit REV)": the stamped version, or the
// module's ("devel" for a build inside the repository), and the stamped
// commit, or the VCS revision the toolchain recorded ("-dirty" when the
// tree had changes).
func buildVersion() string {
	return versionString(version, commit, readBuildInfo)
}

func readBuildInfo() (*debug.BuildInfo, bool) { return debug.ReadBuildInfo() }

func versionString(v, c string, info func() (*debug.BuildInfo, bool)) string {
	if v == "" || c == "" {
		if bi, ok := info(); ok {
			if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			if c == "" {
				var rev, dirty string
				for _, s := range bi.Settings {
					switch s.Key {
					case "vcs.revision":
						rev = s.Value
					case "vcs.modified":
						if s.Value == "true" {
							dirty = "-dirty"
						}
					}
				}
				if rev != "" {
					c = rev + dirty
				}
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	if c == "" {
		c = "unknown"
	}
	if len(c) > 12 && c[12] != '-' {
		// A full hash: the first 12 hex digits name it unambiguously.
		short := c[:12]
		if len(c) > 40 {
			short += c[40:]
		}
		c = short
	}
	return v + " (commit " + c + ")"
}
