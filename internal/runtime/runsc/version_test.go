package runsc

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

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

// Excerpts of `runsc help checkpoint` and `runsc help restore`: the
// current runsc's (go-20260701204157-69c2d17aea96) and Debian's 20221219.
var (
	currentCheckpointHelp = []byte("checkpoint [flags] <container id> - save current state of container.\n  -compression value\n    \tcompress checkpoint image on disk. Values: none|flate-best-speed. (default none)\n  -direct\n    \tuse O_DIRECT for writing checkpoint pages file\n  -exclude-committed-zero-pages\n    \texclude committed zero-filled pages from checkpoint\n  -image-path string\n    \tdirectory path to saved container image\n  -leave-running\n    \trestart the container after checkpointing\n")
	currentRestoreHelp    = []byte("restore [flags] <container id> - restore saved state of container.\n  -background\n    \tallow image loading to continue after restore exits (requires uncompressed checkpoint)\n  -bundle string\n    \tpath to the root of the bundle directory, defaults to the current directory\n  -detach\n    \tdetach from the container's process\n  -direct\n    \tuse O_DIRECT for reading checkpoint pages file\n")
	debianCheckpointHelp  = []byte("checkpoint [flags] <container id> - save current state of container.\n  -image-path string\n    \tdirectory path to saved container image\n  -leave-running\n    \trestart the container after checkpointing\n  -work-path string\n    \tignored\n")
	debianRestoreHelp     = []byte("restore [flags] <container id> - restore saved state of container.\n  -bundle string\n    \tpath to the root of the bundle directory, defaults to the current directory\n  -detach\n    \tdetach from the container's process\n  -image-path string\n    \tdirectory path to saved container image\n")
)

func TestImageIOIn(t *testing.T) {
	// A restore --background without a checkpoint --compression could
	// not be sure to get an uncompressed image; --direct is used only
	// where both commands have it.
	noCompression := []byte("  -exclude-committed-zero-pages\n    \texclude committed zero-filled pages from checkpoint\n")
	restoreOnlyDirect := []byte("  -direct\n    \tuse O_DIRECT for reading checkpoint pages file\n")
	cases := []struct {
		name       string
		checkpoint []byte
		restore    []byte
		want       imageIO
	}{
		{"current", currentCheckpointHelp, currentRestoreHelp, imageIO{background: true, direct: true}},
		{"debian", debianCheckpointHelp, debianRestoreHelp, imageIO{}},
		{"background without compression", noCompression, currentRestoreHelp, imageIO{}},
		{"compression without background", currentCheckpointHelp, debianRestoreHelp, imageIO{}},
		{"direct on restore only", debianCheckpointHelp, restoreOnlyDirect, imageIO{}},
		{"empty", nil, nil, imageIO{}},
	}
	for _, c := range cases {
		if got := imageIOIn(c.checkpoint, c.restore); got != c.want {
			t.Errorf("%s: imageIOIn = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestImageFlags asks the runsc builds on this host: Debian's has
// neither background restore nor direct image I/O, so it keeps the
// commands it always got.
func TestImageFlags(t *testing.T) {
	const debian = "/usr/bin/runsc"
	if _, err := os.Stat(debian); err != nil {
		t.Skip("Debian's runsc not installed")
	}
	got, err := imageFlags(t.Context(), debian)
	if err != nil || got != (imageIO{}) {
		t.Errorf("imageFlags(%s) = %+v, %v; want none, nil", debian, got, err)
	}
	if bin, err := exec.LookPath("runsc"); err == nil && bin != debian {
		got, err := imageFlags(t.Context(), bin)
		if err != nil {
			t.Fatalf("imageFlags(%s) = %v", bin, err)
		}
		t.Logf("%s: %+v", bin, got)
	}
}

func TestImageFlagsMissingBinary(t *testing.T) {
	if _, err := imageFlags(t.Context(), "/nonexistent/runsc"); err == nil {
		t.Error("imageFlags(/nonexistent/runsc) = nil error, want one")
	}
}

// TestPlatformCache: the kvm trial's choice is kept per runsc binary for
// this boot and read back; another binary, or a record of another boot,
// is no answer.
func TestPlatformCache(t *testing.T) {
	if bootID() == "" {
		t.Skip("no boot ID on this host")
	}
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	a, b := platformKey("/usr/bin/runsc", "release-20250101.0"), platformKey("/opt/runsc", "release-20250101.0")
	if a == b {
		t.Fatal("two binaries share a key")
	}
	if _, _, ok := cachedPlatform(dir, a); ok {
		t.Fatal("a choice read from an empty cache")
	}
	cachePlatform(dir, a, PlatformSystrap, "trial sandbox on kvm did not finish\nwithin 20s", log)
	if p, why, ok := cachedPlatform(dir, a); !ok || p != PlatformSystrap || why != "trial sandbox on kvm did not finish within 20s" {
		t.Errorf("cached = %q, %q, %v", p, why, ok)
	}
	if _, _, ok := cachedPlatform(dir, b); ok {
		t.Error("another binary's choice read")
	}
	if err := os.WriteFile(filepath.Join(dir, b), []byte("another-boot\nkvm\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := cachedPlatform(dir, b); ok {
		t.Error("another boot's choice read")
	}
}
