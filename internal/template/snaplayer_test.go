package template

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSnapshotLayerRoundTrip freezes a writable layer (owned by a
// sandbox's range, with a whiteout overlay made as host root, an opaque
// directory, a hard link, a symlink and a user xattr), exports it as a
// layer tar and imports it into another store with a different uid base:
// every marker, owner (as the sandbox sees it) and file survives.
func TestSnapshotLayerRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make whiteouts and trusted.* xattrs")
	}
	s, err := New(Config{DataDir: t.TempDir(), CacheDir: t.TempDir(), UIDBase: testUIDBase})
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	const sandboxRoot = 2000000
	mk := func(rel string, uid int, f func(p string) error) {
		t.Helper()
		p := filepath.Join(src, rel)
		if err := f(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	mk(".", sandboxRoot, func(string) error { return nil })
	// Overlay makes whiteouts as the mounter: host root.
	mk("gone", 0, func(p string) error { return unix.Mknod(p, unix.S_IFCHR, 0) })
	mk("opaque", sandboxRoot, func(p string) error { return os.Mkdir(p, 0o755) })
	if err := unix.Setxattr(filepath.Join(src, "opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("trusted xattrs unsupported here: %v", err)
	}
	mk("opaque/inner", sandboxRoot+5, func(p string) error { return os.WriteFile(p, []byte("inner"), 0o600) })
	mk("file", sandboxRoot+123, func(p string) error { return os.WriteFile(p, []byte("hello"), 0o640) })
	mk("link", sandboxRoot+123, func(p string) error { return os.Link(filepath.Join(src, "file"), p) })
	mk("sym", sandboxRoot, func(p string) error { return os.Symlink("/etc/passwd", p) })
	if err := unix.Setxattr(filepath.Join(src, "file"), "user.note", []byte("kept"), 0); err != nil {
		t.Skipf("user xattrs unsupported here: %v", err)
	}

	frozen := filepath.Join(t.TempDir(), "layer")
	size, err := s.FreezeLayer(t.Context(), src, frozen)
	if err != nil {
		t.Fatalf("FreezeLayer: %v", err)
	}
	if size != int64(len("hello")+len("inner")) {
		t.Errorf("FreezeLayer size = %d, want %d (hard links once)", size, len("hello")+len("inner"))
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(frozen, "gone"), &st); err != nil || !isWhiteout(&st) || st.Uid != testUIDBase {
		t.Errorf("frozen whiteout = %+v, %v; want a 0/0 device owned by %d", st, err, testUIDBase)
	}
	if err := unix.Lstat(filepath.Join(frozen, "file"), &st); err != nil || st.Uid != testUIDBase+123 {
		t.Errorf("frozen file owner = %d, %v; want %d", st.Uid, err, testUIDBase+123)
	}

	var tarball bytes.Buffer
	if err := s.ExportLayer(t.Context(), frozen, &tarball); err != nil {
		t.Fatalf("ExportLayer: %v", err)
	}
	const otherBase = 300000
	s2, err := New(Config{DataDir: t.TempDir(), CacheDir: t.TempDir(), UIDBase: otherBase})
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "imported")
	if _, err := s2.ImportLayer(t.Context(), &tarball, dst); err != nil {
		t.Fatalf("ImportLayer: %v", err)
	}
	if err := unix.Lstat(filepath.Join(dst, "gone"), &st); err != nil || !isWhiteout(&st) {
		t.Errorf("imported whiteout = %+v, %v", st, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("imported opaque xattr = %q, %v", buf[:n], err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "opaque/inner")); err != nil || string(b) != "inner" {
		t.Errorf("imported opaque/inner = %q, %v", b, err)
	}
	var a, b unix.Stat_t
	if err := unix.Lstat(filepath.Join(dst, "file"), &a); err != nil || a.Uid != otherBase+123 || a.Mode&0o7777 != 0o640 {
		t.Errorf("imported file = uid %d mode %o, %v; want %d 640", a.Uid, a.Mode&0o7777, err, otherBase+123)
	}
	if err := unix.Lstat(filepath.Join(dst, "link"), &b); err != nil || a.Ino != b.Ino {
		t.Errorf("imported hard link: inode %d vs %d, %v", b.Ino, a.Ino, err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "sym")); err != nil || target != "/etc/passwd" {
		t.Errorf("imported symlink = %q, %v", target, err)
	}
	if n, err := unix.Lgetxattr(filepath.Join(dst, "file"), "user.note", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("imported user xattr = %q, %v", buf[:n], err)
	}
	if err := unix.Lstat(dst, &st); err != nil || st.Uid != otherBase {
		t.Errorf("imported root owner = %d, %v; want %d", st.Uid, err, otherBase)
	}
}
