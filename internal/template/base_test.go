package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// fakeDebootstrap writes a stand-in for debootstrap that lays out a tiny
// root (or, with hang, starts and then waits forever) and counts its runs.
func fakeDebootstrap(t *testing.T, hang bool) (path, counter string) {
	t.Helper()
	dir := t.TempDir()
	counter = filepath.Join(dir, "runs")
	script := `#!/bin/sh
set -e
echo run >> ` + counter + `
target="$4"
echo "I: Retrieving InRelease"
mkdir -p "$target/proc" "$target/etc/skel" "$target/usr/bin" "$target/dev" "$target/var/cache/apt/archives" "$target/var/lib/apt/lists/partial" "$target/home" "$target/root"
printf 'root:x:0:0:root:/root:/bin/bash\n' > "$target/etc/passwd"
printf 'root:x:0:\nshadow:x:42:\n' > "$target/etc/group"
printf 'root:*:19000:0:99999:7:::\n' > "$target/etc/shadow"
printf 'root:*::\n' > "$target/etc/gshadow"
chgrp 42 "$target/etc/shadow"; chmod 640 "$target/etc/shadow"
echo 'PS1=x' > "$target/etc/skel/.bashrc"
echo '#!/bin/sh' > "$target/usr/bin/bash"; chmod 755 "$target/usr/bin/bash"
echo deb > "$target/var/cache/apt/archives/bash_5.2_amd64.deb"
echo list > "$target/var/lib/apt/lists/deb.debian.org_Packages"
echo 'nameserver 192.0.2.1' > "$target/etc/resolv.conf"
mknod "$target/dev/null" c 1 3
`
	if hang {
		script += "echo I: Validating\nexec sleep 300\n"
	}
	path = filepath.Join(dir, "debootstrap")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, counter
}

// fakeChroot stands in for chroot running apt in the tree: it logs its
// arguments (and checks /proc is mounted there) into the tree.
func fakeChroot(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "chroot")
	script := "#!/bin/sh\nset -e\ntest -e \"$1/proc/self\"\necho \"$@\" >> \"$1/apt.log\"\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func runs(t *testing.T, counter string) int {
	t.Helper()
	b, err := os.ReadFile(counter)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

func TestBuildBaseWithFakeDebootstrap(t *testing.T) {
	requireRoot(t)
	ctx := t.Context()
	deboot, counter := fakeDebootstrap(t, false)
	cache := t.TempDir()
	newStore := func() *Store {
		s, err := New(Config{DataDir: t.TempDir(), CacheDir: cache, UIDBase: testUIDBase, DebootstrapPath: deboot, ChrootPath: fakeChroot(t)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var log syncBuffer
	tpl, err := newStore().Build(ctx, "base", &log)
	if err != nil {
		t.Fatalf("Build(base): %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "I: Retrieving InRelease") {
		t.Errorf("build log lacks debootstrap output:\n%s", log.String())
	}
	root := tpl.Layers[0]
	// apt ran in the tree (with /proc) for what debootstrap cannot resolve.
	if b, _ := os.ReadFile(filepath.Join(root, "apt.log")); !strings.Contains(string(b), "apt-get update\n") || !strings.Contains(string(b), "apt-get install -y --no-install-recommends npm\n") {
		t.Errorf("apt in the tree: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/sudoers.d/user")); string(b) != "user ALL=(ALL:ALL) NOPASSWD: ALL\n" {
		t.Errorf("sudoers entry %q", b)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000:user:/home/user:/bin/bash\n") {
		t.Errorf("etc/passwd lacks user:\n%s", passwd)
	}
	for _, f := range []string{"etc/group", "etc/shadow", "etc/gshadow"} {
		b, _ := os.ReadFile(filepath.Join(root, f))
		if !strings.Contains(string(b), "\nuser:") {
			t.Errorf("%s lacks user:\n%s", f, b)
		}
	}
	if st := lstat(t, filepath.Join(root, "etc/shadow")); st.Uid != testUIDBase || st.Gid != testUIDBase+42 || st.Mode&0o777 != 0o640 {
		t.Errorf("etc/shadow %d:%d %o after adding user, want %d:%d 640", st.Uid, st.Gid, st.Mode&0o777, testUIDBase, testUIDBase+42)
	}
	for _, f := range []string{"home/user", "home/user/.bashrc"} {
		if st := lstat(t, filepath.Join(root, f)); st.Uid != testUIDBase+1000 || st.Gid != testUIDBase+1000 {
			t.Errorf("%s owned by %d:%d, want %d", f, st.Uid, st.Gid, testUIDBase+1000)
		}
	}
	if st := lstat(t, filepath.Join(root, "usr/bin/bash")); st.Uid != testUIDBase {
		t.Errorf("usr/bin/bash uid %d, want %d", st.Uid, testUIDBase)
	}
	if _, err := os.Stat(filepath.Join(root, ".berth")); err != nil {
		t.Errorf("no /.berth mount point: %v", err)
	}
	for _, gone := range []string{"dev/null", "var/cache/apt/archives/bash_5.2_amd64.deb", "var/lib/apt/lists/deb.debian.org_Packages"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s in layer (%v), want left out", gone, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/resolv.conf")); strings.Contains(string(b), "192.0.2.1") {
		t.Errorf("build host's resolv.conf leaked into the layer: %s", b)
	}

	// The cache keeps the raw result: another data dir builds without
	// running debootstrap again.
	if _, err := newStore().Build(ctx, "base", nil); err != nil {
		t.Fatal(err)
	}
	if n := runs(t, counter); n != 1 {
		t.Errorf("debootstrap ran %d times for two builds, want 1 (cached)", n)
	}
	if st := lstat(t, filepath.Join(cache, "debootstrap")); st.Uid != 0 {
		t.Errorf("cache owned by %d, want root (unshifted)", st.Uid)
	}
}

func TestBuildBaseCancelledDuringDebootstrap(t *testing.T) {
	requireRoot(t)
	deboot, _ := fakeDebootstrap(t, true)
	cache := t.TempDir()
	dataDir := t.TempDir()
	s, err := New(Config{DataDir: dataDir, CacheDir: cache, UIDBase: testUIDBase, DebootstrapPath: deboot, ChrootPath: fakeChroot(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var log syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := s.Build(ctx, "base", &log)
		done <- err
	}()
	harness.WaitFor(t, 10*time.Second, "debootstrap to start", func() bool { return strings.Contains(log.String(), "I: Validating") })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Build = %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Build did not return after cancel")
	}
	entries, _ := os.ReadDir(filepath.Join(cache, "debootstrap"))
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("cache holds %s after a cancelled debootstrap, want nothing", e.Name())
		}
	}
	if _, err := s.Get(t.Context(), "base"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Get(base) after cancelled build = %v, want ErrFailedPrecondition", err)
	}
	layers, _ := os.ReadDir(filepath.Join(dataDir, "templates", "base", "layers"))
	if len(layers) != 0 {
		t.Errorf("layers after cancelled build: %v", layers)
	}
}

// TestBuildBaseReal runs the real debootstrap build. Cold it takes about
// 95 s and needs the Debian mirror; warm (cache present) a few seconds.
func TestBuildBaseReal(t *testing.T) {
	requireRoot(t)
	cache := os.Getenv("BERTH_CACHE_DIR")
	if cache == "" {
		cache = DefaultCacheDir
	}
	probe, err := New(Config{DataDir: t.TempDir(), CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := probe.debootstrapCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat(cached)
	if statErr != nil && os.Getenv("BERTH_TEST_BASE") != "1" {
		t.Skipf("no debootstrap result at %s; set BERTH_TEST_BASE=1 to build it (~95 s, needs the Debian mirror), or BERTH_CACHE_DIR to point at a cache", cached)
	}
	if _, err := exec.LookPath("debootstrap"); err != nil && statErr != nil {
		t.Skip("needs debootstrap (Debian package debootstrap)")
	}

	build := func() (Template, time.Duration) {
		s, err := New(Config{DataDir: t.TempDir(), CacheDir: cache, UIDBase: testUIDBase})
		if err != nil {
			t.Fatal(err)
		}
		var log syncBuffer
		start := time.Now()
		tpl, err := s.Build(t.Context(), "base", &log)
		if err != nil {
			t.Fatalf("Build(base): %v\n%s", err, log.String())
		}
		took := time.Since(start)
		for _, line := range strings.Split(log.String(), "\n") {
			if strings.Contains(line, " in ") {
				t.Log(line)
			}
		}
		return tpl, took
	}
	tpl, took := build()
	t.Logf("base build (%s cache) took %s, %d MB", map[bool]string{true: "warm", false: "cold"}[statErr == nil], took, tpl.SizeBytes>>20)
	if statErr != nil {
		tpl, took = build()
		t.Logf("base build (warm cache) took %s", took)
	}
	root := tpl.Layers[0]
	for _, bin := range []string{"usr/bin/bash", "usr/bin/python3", "usr/bin/git", "usr/bin/curl"} {
		st := lstat(t, filepath.Join(root, bin))
		if st.Uid != testUIDBase {
			t.Errorf("%s uid %d, want %d", bin, st.Uid, testUIDBase)
		}
	}
	if st := lstat(t, filepath.Join(root, "home/user")); st.Uid != testUIDBase+1000 {
		t.Errorf("home/user uid %d, want %d", st.Uid, testUIDBase+1000)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000:") {
		t.Errorf("etc/passwd lacks user 1000:\n%s", passwd)
	}
	// The tools run: chroot as host root ignores the shifted owners. (git
	// is left out: it insists on a /dev/null, which only the runtime gives.)
	for _, argv := range [][]string{
		{"/usr/bin/python3", "-c", "import ssl, sqlite3; print('ok')"},
		{"/usr/bin/curl", "--version"},
		{"/usr/bin/bash", "-c", "id user"},
	} {
		out, err := exec.CommandContext(t.Context(), "chroot", append([]string{root}, argv...)...).CombinedOutput()
		if err != nil {
			t.Errorf("chroot %v: %v\n%s", argv, err, out)
		}
	}
}
