package diskimg

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// MountsUnder finds mounts whose paths the kernel escapes in mountinfo (a
// space), leaves out a sibling that only shares the prefix, and lists the
// deepest first so that UnmountAll can take them down in order.
func TestMountsUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	outer := filepath.Join(dir, "a b")
	inner := filepath.Join(outer, "c")
	sibling := dir + "-sibling"
	for _, p := range []string{outer, sibling} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.RemoveAll(sibling) })
	mount := func(p string) {
		t.Helper()
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount %s: %v", p, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	}
	mount(outer)
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	mount(inner)
	mount(sibling)
	got, err := MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{inner, outer}; !slices.Equal(got, want) {
		t.Errorf("MountsUnder(%s) = %q, want %q", dir, got, want)
	}
	if err := UnmountAll(t.Context(), dir); err != nil {
		t.Fatalf("UnmountAll: %v", err)
	}
	if got, _ := MountsUnder(dir); len(got) != 0 {
		t.Errorf("after UnmountAll: %q still mounted", got)
	}
}
