package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestEnvironmentKeepsOverlayMarkers freezes a directory holding a
// whiteout (0/0 char device) and an opaque directory and checks both
// survive the copy, with ownership, so overlay honours them as a lower
// layer.
func TestEnvironmentKeepsOverlayMarkers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make whiteouts and trusted.* xattrs")
	}
	s, err := New(Config{DataDir: t.TempDir(), CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := unix.Mknod(filepath.Join(src, "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	opaque := filepath.Join(src, "opaque")
	os.Mkdir(opaque, 0o755)
	if err := unix.Setxattr(opaque, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("trusted xattrs unsupported here: %v", err)
	}
	os.WriteFile(filepath.Join(src, "file"), []byte("x"), 0o640)
	// A sandbox's writable layer: owned by its root, host uid 2000000
	// here, with a setuid file of its user 123. The store's layers are
	// owned by the canonical range (UIDBase 0 in this store).
	const sandboxRoot = 2000000
	for _, p := range []string{src, filepath.Join(src, "gone"), opaque} {
		if err := os.Lchown(p, sandboxRoot, sandboxRoot); err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(filepath.Join(src, "file"), sandboxRoot+123, sandboxRoot+123)
	unix.Chmod(filepath.Join(src, "file"), 0o4640)
	key := "0123456789abcdef0123456789abcdef"
	base := Template{Name: "base", Layers: []string{t.TempDir()}}
	e, err := s.AddEnvironment(t.Context(), key, base, "file:///r", "abc", nil, src)
	if err != nil {
		t.Fatalf("AddEnvironment: %v", err)
	}
	layer := e.Layers[len(e.Layers)-1]
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(layer, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout not kept: %+v, %v", st, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(layer, "opaque"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr not kept: %q, %v", buf[:n], err)
	}
	if err := unix.Lstat(filepath.Join(layer, "file"), &st); err != nil || st.Uid != 123 || st.Gid != 123 || st.Mode&0o7777 != 0o4640 {
		t.Errorf("file metadata = uid %d gid %d mode %o, %v; want 123 123 4640", st.Uid, st.Gid, st.Mode&0o7777, err)
	}
	if err := unix.Lstat(layer, &st); err != nil || st.Uid != 0 {
		t.Errorf("layer root owner = %d, %v; want 0", st.Uid, err)
	}
	got, err := s.Environment(t.Context(), key)
	if err != nil || got.Commit != "abc" || len(got.Layers) != 2 {
		t.Errorf("Environment = %+v, %v", got, err)
	}
	list, err := s.Environments(t.Context())
	if err != nil || len(list) != 1 {
		t.Errorf("Environments = %+v, %v", list, err)
	}
	removed, err := s.PruneEnvironments(t.Context(), "")
	if err != nil || len(removed) != 1 {
		t.Errorf("PruneEnvironments = %v, %v", removed, err)
	}
	if _, err := s.Environment(t.Context(), key); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Environment after prune = %v, want ErrNotFound", err)
	}
	// An owner outside the sandbox's range (not its to give) fails the
	// freeze and leaves nothing.
	os.Chown(filepath.Join(src, "file"), 100123, 100123)
	if _, err := s.AddEnvironment(t.Context(), key, base, "file:///r", "abc", nil, src); err == nil {
		t.Errorf("AddEnvironment with a foreign owner succeeded")
	}
	if _, err := s.Environment(t.Context(), key); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Environment after failed freeze = %v, want ErrNotFound", err)
	}
	if _, err := s.Environment(t.Context(), "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Environment(bad key) = %v, want ErrInvalidArgument", err)
	}
}
