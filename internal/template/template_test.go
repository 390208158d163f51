package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

const testUIDBase = 100000

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: layers are chowned into the sandbox uid range")
	}
}

func requireBusybox(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(DefaultBusyboxPath); err != nil {
		t.Skipf("needs a static busybox at %s (Debian package busybox-static)", DefaultBusyboxPath)
	}
}

func newTestStore(t *testing.T, dataDir string, base uint32) *Store {
	t.Helper()
	s, err := New(Config{DataDir: dataDir, CacheDir: t.TempDir(), UIDBase: base})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func lstat(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("lstat: %v", err)
	}
	return st
}

// syncBuffer is a log writer tests can read while a build writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"minimal", true},
		{"base", true},
		{"a", true},
		{"0", true},
		{"my-tpl_2", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"-x", false},
		{"_x", false},
		{"Base", false},
		{"a/b", false},
		{"..", false},
		{".hidden", false},
		{"a b", false},
		{"ä", false},
	}
	for _, tt := range tests {
		err := ValidName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidName(%q) = %v, want ErrInvalidArgument", tt.name, err)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no data dir", Config{}},
		{"mirror not a URL", Config{DataDir: t.TempDir(), Mirror: "deb.debian.org"}},
		{"mirror ftp", Config{DataDir: t.TempDir(), Mirror: "ftp://deb.debian.org/debian"}},
		{"uid base overflows", Config{DataDir: t.TempDir(), UIDBase: 1<<32 - 100}},
	}
	for _, tt := range tests {
		if _, err := New(tt.cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New(%s) = %v, want ErrInvalidArgument", tt.name, err)
		}
	}
}

func TestGetErrors(t *testing.T) {
	s := newTestStore(t, t.TempDir(), testUIDBase)
	ctx := t.Context()
	tests := []struct {
		name string
		want error
	}{
		{"nosuch", errdefs.ErrNotFound},
		{"minimal", errdefs.ErrFailedPrecondition},
		{"base", errdefs.ErrFailedPrecondition},
		{"Bad/Name", errdefs.ErrInvalidArgument},
		{"", errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		if _, err := s.Get(ctx, tt.name); !errors.Is(err, tt.want) {
			t.Errorf("Get(%q) = %v, want %v", tt.name, err, tt.want)
		}
	}
	_, err := s.Get(ctx, "minimal")
	if want := "berth template build minimal"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Get(unbuilt) error %q does not say %q", err, want)
	}
	for _, name := range []string{"nosuch", "../x"} {
		want := errdefs.ErrNotFound
		if ValidName(name) != nil {
			want = errdefs.ErrInvalidArgument
		}
		if _, err := s.Build(ctx, name, nil); !errors.Is(err, want) {
			t.Errorf("Build(%q) = %v, want %v", name, err, want)
		}
		if _, err := s.Ensure(ctx, name, nil); !errors.Is(err, want) {
			t.Errorf("Ensure(%q) = %v, want %v", name, err, want)
		}
	}
}

func TestBuildMinimal(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	dataDir := t.TempDir()
	s := newTestStore(t, dataDir, testUIDBase)
	var log syncBuffer
	start := time.Now()
	tpl, err := s.Build(t.Context(), "minimal", &log)
	if err != nil {
		t.Fatalf("Build(minimal): %v\n%s", err, log.String())
	}
	t.Logf("minimal built in %s", time.Since(start))
	if !tpl.Built || len(tpl.Layers) != 1 || tpl.SizeBytes < 1<<20 || tpl.BuiltAt.IsZero() {
		t.Fatalf("Build(minimal) = %+v, want built with one layer of >1 MiB", tpl)
	}
	root := tpl.Layers[0]
	if !filepath.IsAbs(root) || !strings.HasPrefix(root, dataDir) {
		t.Errorf("layer %q is not an absolute dir under %s", root, dataDir)
	}

	owners := []struct {
		path string
		uid  uint32
		mode uint32 // permission bits incl. sticky/setuid; 0 = don't check
	}{
		{".", testUIDBase, 0o755},
		{"bin/busybox", testUIDBase, 0o755},
		{"bin/sh", testUIDBase, 0},
		{"usr/bin/env", testUIDBase, 0},
		{"etc/passwd", testUIDBase, 0o644},
		{"home/user", testUIDBase + 1000, 0o755},
		{"root", testUIDBase, 0o700},
		{"tmp", testUIDBase, 0o1777},
		{"proc", testUIDBase, 0o755},
		{"sys", testUIDBase, 0o755},
		{"dev", testUIDBase, 0o755},
		{".berth", testUIDBase, 0o755},
	}
	for _, o := range owners {
		st := lstat(t, filepath.Join(root, o.path))
		if st.Uid != o.uid || st.Gid != o.uid {
			t.Errorf("%s owned by %d:%d, want %d:%d", o.path, st.Uid, st.Gid, o.uid, o.uid)
		}
		if o.mode != 0 && st.Mode&0o7777 != o.mode {
			t.Errorf("%s mode %o, want %o", o.path, st.Mode&0o7777, o.mode)
		}
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Errorf("bin/sh -> %q, %v; want /bin/busybox", target, err)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"root:x:0:0:root:/root:/bin/sh", "user:x:1000:1000:user:/home/user:/bin/sh"} {
		if !strings.Contains(string(passwd), want+"\n") {
			t.Errorf("etc/passwd lacks %q:\n%s", want, passwd)
		}
	}

	// The manifest round-trips: a fresh store over the same data dir sees
	// the same template.
	m, err := readManifest(filepath.Join(dataDir, "templates", "minimal", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "minimal" || m.UIDBase != testUIDBase || len(m.Layers) != 1 || m.SourceHash == "" || m.SizeBytes != tpl.SizeBytes {
		t.Errorf("manifest = %+v", m)
	}
	b, _ := json.Marshal(m)
	var m2 manifest
	if err := json.Unmarshal(b, &m2); err != nil || !reflect.DeepEqual(m, m2) {
		t.Errorf("manifest does not round-trip: %+v vs %+v (%v)", m, m2, err)
	}
	s2 := newTestStore(t, dataDir, testUIDBase)
	got, err := s2.Get(t.Context(), "minimal")
	if err != nil {
		t.Fatalf("Get(minimal) on a fresh store: %v", err)
	}
	if !reflect.DeepEqual(got, tpl) {
		t.Errorf("Get(minimal) = %+v, want %+v", got, tpl)
	}
}

// buildTracker counts builds in flight across several log writers.
type buildTracker struct {
	mu             sync.Mutex
	active, maxAct int
	done           int
}

type trackedLog struct{ tr *buildTracker }

func (l trackedLog) Write(p []byte) (int, error) {
	l.tr.mu.Lock()
	defer l.tr.mu.Unlock()
	s := string(p)
	switch {
	case strings.HasPrefix(s, "==> building template"):
		l.tr.active++
		l.tr.maxAct = max(l.tr.maxAct, l.tr.active)
	case strings.HasPrefix(s, "==> template") && strings.Contains(s, " built in "):
		l.tr.active--
		l.tr.done++
	}
	return len(p), nil
}

func TestConcurrentBuildsAreSerialised(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	dataDir := t.TempDir()
	s := newTestStore(t, dataDir, testUIDBase)
	tr := &buildTracker{}
	const n = 4
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := s.Build(t.Context(), "minimal", trackedLog{tr})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Build: %v", err)
		}
	}
	if tr.maxAct != 1 || tr.done != n {
		t.Errorf("builds in flight at once: %d, finished: %d; want 1 and %d", tr.maxAct, tr.done, n)
	}
	// Each rebuild pruned the layer before it.
	entries, err := os.ReadDir(filepath.Join(dataDir, "templates", "minimal", "layers"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("layers after %d builds: %v, want exactly one", n, entries)
	}
	tpl, err := s.Get(t.Context(), "minimal")
	if err != nil || tpl.Layers[0] != filepath.Join(dataDir, "templates", "minimal", "layers", entries[0].Name()) {
		t.Errorf("Get(minimal) = %+v, %v; want the one remaining layer", tpl, err)
	}
}

func TestUIDBaseChangeMeansNotBuilt(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	ctx := t.Context()
	dataDir := t.TempDir()
	if _, err := newTestStore(t, dataDir, testUIDBase).Build(ctx, "minimal", nil); err != nil {
		t.Fatal(err)
	}
	const other = 300000
	s := newTestStore(t, dataDir, other)
	if _, err := s.Get(ctx, "minimal"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Get after uid base change = %v, want ErrFailedPrecondition", err)
	}
	list, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tpl := range list {
		if tpl.Name == "minimal" && (tpl.Built || len(tpl.Layers) != 0) {
			t.Errorf("List after uid base change: %+v, want not built", tpl)
		}
	}
	tpl, err := s.Ensure(ctx, "minimal", nil)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if st := lstat(t, filepath.Join(tpl.Layers[0], "home/user")); st.Uid != other+1000 {
		t.Errorf("home/user uid %d after rebuild, want %d", st.Uid, other+1000)
	}
	again, err := s.Ensure(ctx, "minimal", nil)
	if err != nil || !reflect.DeepEqual(again, tpl) {
		t.Errorf("second Ensure = %+v, %v; want the same template %+v without a rebuild", again, err, tpl)
	}
}

func TestList(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	ctx := t.Context()
	dataDir := t.TempDir()
	s := newTestStore(t, dataDir, testUIDBase)
	if _, err := s.Build(ctx, "minimal", nil); err != nil {
		t.Fatal(err)
	}
	// A template built by something else (say, a snapshot), and a stray
	// directory without a manifest.
	custom := filepath.Join(dataDir, "templates", "snap1")
	if err := os.MkdirAll(filepath.Join(custom, "layers", "l1"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := manifest{Version: manifestVersion, Name: "snap1", Layers: []string{"l1"}, UIDBase: testUIDBase, BuiltAt: time.Now().UTC().Truncate(time.Second)}
	if err := writeManifest(filepath.Join(custom, "manifest.json"), m); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dataDir, "templates", "stray"), 0o755); err != nil {
		t.Fatal(err)
	}

	list, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	var names []string
	for _, tpl := range list {
		got[tpl.Name] = tpl.Built
		names = append(names, tpl.Name)
	}
	want := map[string]bool{"base": false, "minimal": true, "snap1": true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if !reflect.DeepEqual(names, []string{"base", "minimal", "snap1"}) {
		t.Errorf("List order = %v, want sorted", names)
	}
	if tpl, err := s.Get(ctx, "snap1"); err != nil || tpl.Layers[0] != filepath.Join(custom, "layers", "l1") {
		t.Errorf("Get(snap1) = %+v, %v", tpl, err)
	}
	if _, err := s.Build(ctx, "snap1", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Build(snap1) = %v, want ErrNotFound (no recipe)", err)
	}
	if _, err := s.Get(ctx, "stray"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(stray) = %v, want ErrNotFound", err)
	}
}

func TestManifestLayerEscapeRefused(t *testing.T) {
	dataDir := t.TempDir()
	s := newTestStore(t, dataDir, testUIDBase)
	dir := filepath.Join(dataDir, "templates", "evil")
	if err := os.MkdirAll(filepath.Join(dir, "layers"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"..", "../../..", "/etc", ".tmp-x"} {
		m := manifest{Version: manifestVersion, Name: "evil", Layers: []string{id}, UIDBase: testUIDBase}
		if err := writeManifest(filepath.Join(dir, "manifest.json"), m); err != nil {
			t.Fatal(err)
		}
		if tpl, err := s.Get(t.Context(), "evil"); err == nil {
			t.Errorf("Get with layer id %q = %+v, want an error", id, tpl)
		}
	}
}

func TestBuildCancelledLeavesNothing(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	dataDir := t.TempDir()
	s := newTestStore(t, dataDir, testUIDBase)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Build(ctx, "minimal", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Build with cancelled ctx = %v, want context.Canceled", err)
	}
	if _, err := s.Get(t.Context(), "minimal"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Get after cancelled build = %v, want ErrFailedPrecondition", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dataDir, "templates", "minimal", "layers"))
	if len(entries) != 0 {
		t.Errorf("layers after cancelled build: %v, want none", entries)
	}
}

func TestRebuildKeepsLayersInUse(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	ctx := t.Context()
	s := newTestStore(t, t.TempDir(), testUIDBase)
	old, err := s.Build(ctx, "minimal", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A running sandbox of the old build: an overlay with it as lower dir.
	work := t.TempDir()
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(work, "merged")
	opts := "lowerdir=" + old.Layers[0] + ",upperdir=" + filepath.Join(work, "upper") + ",workdir=" + filepath.Join(work, "work")
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("needs overlayfs: %v", err)
	}
	mounted := true
	unmount := func() {
		if mounted {
			if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount: %v", err)
			}
			mounted = false
		}
	}
	t.Cleanup(unmount)

	cur, err := s.Build(ctx, "minimal", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Layers[0] == old.Layers[0] {
		t.Fatalf("rebuild reused layer %s", cur.Layers[0])
	}
	if _, err := os.Stat(filepath.Join(old.Layers[0], "bin/busybox")); err != nil {
		t.Errorf("layer under a mounted overlay was pruned: %v", err)
	}
	unmount()
	if err := s.Prune(ctx); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if _, err := os.Stat(old.Layers[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old layer still there after unmount and Prune: %v", err)
	}
	if _, err := os.Stat(cur.Layers[0]); err != nil {
		t.Errorf("Prune removed the current layer: %v", err)
	}
}
