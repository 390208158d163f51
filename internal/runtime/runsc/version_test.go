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
		{"weird", true}, // unknown: the shim is harmless
	}
	for _, c := range cases {
		if got := probesRmemDefault(c.version); got != c.want {
			t.Errorf("probesRmemDefault(%q) = %v, want %v", c.version, got, c.want)
		}
	}
}
