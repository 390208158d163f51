package runsc

import "testing"

func TestProbesRmemDefault(t *testing.T) {
	cases := []struct {
		version string
		want    bool
	}{
		{"0.0~20221219.0", true}, // Debian bookworm
		{"0.0~20240729.0", true},
		{"release-20240801.0", false},
		{"release-20260817.0", false},
		{"go-20260701204157-69c2d17aea96", false}, // scripts/runsc-bin.sh
		{"go-2026", true},
		{"weird", true}, // unknown: the shim is harmless
		{"", true},
	}
	for _, c := range cases {
		if got := probesRmemDefault(c.version); got != c.want {
			t.Errorf("probesRmemDefault(%q) = %v, want %v", c.version, got, c.want)
		}
	}
}

func TestHasSystrap(t *testing.T) {
	cases := []struct {
		version string
		want    bool
	}{
		{"0.0~20221219.0", false}, // Debian bookworm: ptrace and kvm only
		{"release-20230605.0", true},
		{"release-20260817.0", true},
		{"go-20260701204157-69c2d17aea96", true},
		{"go-20221219x", false},
		{"release-2023060", false},
		{"weird", false},
	}
	for _, c := range cases {
		if got := hasSystrap(c.version); got != c.want {
			t.Errorf("hasSystrap(%q) = %v, want %v", c.version, got, c.want)
		}
	}
}

func FuzzVersionDate(f *testing.F) {
	for _, s := range []string{"0.0~20221219.0", "release-20260817.0", "go-20260701204157-69c2d17aea96", "", "go-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d := versionDate(v)
		if d == "" {
			return
		}
		if len(d) != 8 {
			t.Fatalf("versionDate(%q) = %q: not 8 digits", v, d)
		}
		for _, c := range d {
			if c < '0' || c > '9' {
				t.Fatalf("versionDate(%q) = %q: not digits", v, d)
			}
		}
	})
}

func TestHasFlag(t *testing.T) {
	// Excerpts of `runsc flags`: the current runsc's, and Debian's
	// 20221219, which has no --allow-suid.
	current := []byte("  -allow-packet-socket-write\n    \tallows writes...\n  -allow-suid\n    \tallows ID elevation when executing binaries with the SUID/SGID bits set.\n  -alsologtostderr\n")
	old := []byte("  -EXPERIMENTAL-afxdp\n    \tEXPERIMENTAL. Use an AF_XDP socket to receive packets.\n  -TESTONLY-allow-packet-endpoint-write\n    \tallow-suid is not a flag here\n")
	cases := []struct {
		out  []byte
		name string
		want bool
	}{
		{current, "allow-suid", true},
		{current, "allow", false},
		{old, "allow-suid", false},
		{nil, "allow-suid", false},
	}
	for _, c := range cases {
		if got := hasFlag(c.out, c.name); got != c.want {
			t.Errorf("hasFlag(%q, %q) = %v, want %v", c.out, c.name, got, c.want)
		}
	}
}
