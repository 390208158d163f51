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
	if err := unix.Mknod(filepath.Join(src, "gone"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	opaque := filepath.Join(src, "opaque")
	os.Mkdir(opaque, 0o755)
	if err := unix.Setxattr(opaque, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("trusted xattrs unsupported here: %v", err)
	}
	os.WriteFile(filepath.Join(src, "file"), []byte("x"), 0o640)
	os.Chown(filepath.Join(src, "file"), 100123, 100123)
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
	if err := unix.Lstat(filepath.Join(layer, "file"), &st); err != nil || st.Uid != 100123 || st.Mode&0o777 != 0o640 {
		t.Errorf("file metadata not kept: uid %d mode %o, %v", st.Uid, st.Mode&0o777, err)
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
	if _, err := s.Environment(t.Context(), "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Environment(bad key) = %v, want ErrInvalidArgument", err)
	}
}
