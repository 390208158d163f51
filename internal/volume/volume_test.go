package volume

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/diskimg"
)

func newDisks(t *testing.T) *Disks {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop devices, mounts)")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs)")
	}
	d, err := New(filepath.Join(t.TempDir(), "volumes"), 1000000, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	ok, err := mountinfo.Mounted(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return ok
}

// TestDisks: a volume's disk is capped at its size, owned by the
// canonical root, mounted on the host only while used, shared with a
// sandbox's bind (the same filesystem, never a second one), and removed
// only once nothing mounts it.
func TestDisks(t *testing.T) {
	d := newDisks(t)
	ctx := t.Context()
	const id = "v1"
	if err := d.Make(ctx, id, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := d.Make(ctx, id, 16<<20); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Make = %v, want ErrAlreadyExists", err)
	}
	if d.InUse(id) || mounted(t, d.mnt(id)) {
		t.Fatal("a new volume is still mounted")
	}
	root, release, err := d.Mount(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1000000 || st.Gid != 1000000 || st.Mode&0o777 != 0o777 {
		t.Errorf("root: uid %d gid %d mode %o, want 1000000 1000000 777", st.Uid, st.Gid, st.Mode&0o777)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("a new volume holds %v", ents)
	}
	// A second user shares the mount; the last release unmounts it.
	root2, release2, err := d.Mount(ctx, id)
	if err != nil || root2 != root {
		t.Fatalf("second Mount = %q, %v", root2, err)
	}
	release()
	release() // once only
	if !mounted(t, root) {
		t.Fatal("unmounted while a user holds it")
	}
	// The size cap.
	err = os.WriteFile(filepath.Join(root, "big"), bytes.Repeat([]byte("x"), 32<<20), 0o644)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing 32 MiB into a 16 MiB volume = %v, want ENOSPC", err)
	}
	os.Remove(filepath.Join(root, "big"))
	empty, err := d.Used(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "mib"), bytes.Repeat([]byte("x"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if used, err := d.Used(ctx, id); err != nil || used-empty < 1<<20 {
		t.Errorf("Used after writing 1 MiB = %d (empty %d), %v; want at least 1 MiB more", used, empty, err)
	}
	// A sandbox's bind: here a bind elsewhere on the host.
	bind := filepath.Join(t.TempDir(), "bind")
	if err := os.Mkdir(bind, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(root, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bind, unix.MNT_DETACH) })
	release2()
	if mounted(t, root) {
		t.Fatal("still mounted on the host after the last release")
	}
	if !d.InUse(id) {
		t.Fatal("InUse = false while a bind holds the filesystem")
	}
	if err := d.Remove(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Remove while bound = %v, want ErrFailedPrecondition", err)
	}
	if err := os.WriteFile(filepath.Join(bind, "f"), []byte("through the bind"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Mounted again: the same filesystem the bind shows.
	root, release, err = d.Mount(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(b) != "through the bind" {
		t.Errorf("the bind's file through a new host mount = %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(root, "g"), []byte("through the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(bind, "g")); err != nil || string(b) != "through the host" {
		t.Errorf("the host's file through the bind = %q, %v", b, err)
	}
	if n := len(loopsOf(d, id)); n != 1 {
		t.Errorf("loop devices bound to the image: %d, want 1", n)
	}
	release()
	if err := unix.Unmount(bind, 0); err != nil {
		t.Fatal(err)
	}
	// Kept across mounts.
	root, release, err = d.Mount(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "g")); err != nil || string(b) != "through the host" {
		t.Errorf("the file after every mount went = %q, %v", b, err)
	}
	release()
	if err := d.Remove(ctx, id); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume dir after Remove: %v", err)
	}
	if _, _, err := d.Mount(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Mount after Remove = %v, want ErrNotFound", err)
	}
	for _, bad := range []string{"", "../x", "A", "a/b"} {
		if err := d.Make(ctx, bad, 16<<20); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Make(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestNewUnmountsLeftovers: a daemon killed while it held a volume on the
// host leaves the mount; the next one takes it down at start.
func TestNewUnmountsLeftovers(t *testing.T) {
	d := newDisks(t)
	if err := d.Make(t.Context(), "v2", 16<<20); err != nil {
		t.Fatal(err)
	}
	root, _, err := d.Mount(t.Context(), "v2")
	if err != nil {
		t.Fatal(err)
	}
	d2, err := New(d.dir, d.uidBase, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mounted(t, root) || d2.InUse("v2") {
		t.Fatal("a killed daemon's host mount survived New")
	}
	if err := d2.Remove(t.Context(), "v2"); err != nil {
		t.Fatal(err)
	}
}

func loopsOf(d *Disks, id string) []string {
	return diskimg.LoopsBacking(d.image(id))
}
