package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// makeTree builds a source tree with one of every kind of entry shiftCopy
// must handle, owned by assorted ids.
func makeTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(rel string) string { return filepath.Join(src, rel) }
	must(os.MkdirAll(p("usr/bin"), 0o755))
	must(os.MkdirAll(p("home/user/.cache"), 0o700))
	must(os.MkdirAll(p("dev/pts"), 0o755))
	must(os.Mkdir(p("tmp"), 0o755))
	must(unix.Chmod(p("tmp"), 0o1777))
	must(os.WriteFile(p("usr/bin/tool"), bytes.Repeat([]byte("x"), 3<<20), 0o755))
	must(unix.Chmod(p("usr/bin/tool"), 0o4755)) // setuid root
	must(os.WriteFile(p("usr/bin/grp"), []byte("g"), 0o755))
	must(os.Chown(p("usr/bin/grp"), 0, 42))
	must(unix.Chmod(p("usr/bin/grp"), 0o2755)) // setgid shadow
	must(os.Link(p("usr/bin/tool"), p("usr/bin/tool-alias")))
	must(os.Symlink("tool", p("usr/bin/sym")))
	must(os.Lchown(p("usr/bin/sym"), 0, 0))
	must(os.WriteFile(p("home/user/.profile"), []byte("export A=1\n"), 0o644))
	must(os.Chown(p("home/user/.profile"), 1000, 1000))
	must(os.Chown(p("home/user"), 1000, 1000))
	must(os.Chown(p("home/user/.cache"), 1000, 1000))
	must(unix.Mkfifo(p("home/user/fifo"), 0o600))
	must(os.Chown(p("home/user/fifo"), 1000, 1000))
	must(unix.Mknod(p("dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Lsetxattr(p("usr/bin/grp"), "user.berth", []byte("v"), 0))
	must(os.WriteFile(p("skipme"), []byte("no"), 0o644))
	return src
}

func TestShiftCopy(t *testing.T) {
	requireRoot(t)
	src := makeTree(t)
	dst := t.TempDir()
	skip := func(rel string, _ *unix.Stat_t) bool { return rel == "skipme" }
	if err := shiftCopy(t.Context(), src, dst, testUIDBase, skip); err != nil {
		t.Fatalf("shiftCopy: %v", err)
	}
	tests := []struct {
		rel      string
		typ      uint32
		uid, gid uint32
		mode     uint32
	}{
		{".", unix.S_IFDIR, 0, 0, 0o755},
		{"usr/bin/tool", unix.S_IFREG, 0, 0, 0o4755},
		{"usr/bin/grp", unix.S_IFREG, 0, 42, 0o2755},
		{"usr/bin/sym", unix.S_IFLNK, 0, 0, 0},
		{"tmp", unix.S_IFDIR, 0, 0, 0o1777},
		{"home/user", unix.S_IFDIR, 1000, 1000, 0o700},
		{"home/user/.profile", unix.S_IFREG, 1000, 1000, 0o644},
		{"home/user/fifo", unix.S_IFIFO, 1000, 1000, 0o600},
		{"dev/pts", unix.S_IFDIR, 0, 0, 0o755},
	}
	for _, tt := range tests {
		st := lstat(t, filepath.Join(dst, tt.rel))
		if st.Mode&unix.S_IFMT != tt.typ {
			t.Errorf("%s type %o, want %o", tt.rel, st.Mode&unix.S_IFMT, tt.typ)
		}
		if st.Uid != testUIDBase+tt.uid || st.Gid != testUIDBase+tt.gid {
			t.Errorf("%s owner %d:%d, want %d:%d", tt.rel, st.Uid, st.Gid, testUIDBase+tt.uid, testUIDBase+tt.gid)
		}
		if tt.mode != 0 && st.Mode&0o7777 != tt.mode {
			t.Errorf("%s mode %o, want %o", tt.rel, st.Mode&0o7777, tt.mode)
		}
		srcSt := lstat(t, filepath.Join(src, tt.rel))
		if tt.rel != "." && st.Mtim != srcSt.Mtim {
			t.Errorf("%s mtime %v, want %v", tt.rel, st.Mtim, srcSt.Mtim)
		}
	}
	a, b := lstat(t, filepath.Join(dst, "usr/bin/tool")), lstat(t, filepath.Join(dst, "usr/bin/tool-alias"))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hardlink not kept: inodes %d and %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if a.Size != 3<<20 {
		t.Errorf("tool size %d, want %d", a.Size, 3<<20)
	}
	if target, err := os.Readlink(filepath.Join(dst, "usr/bin/sym")); err != nil || target != "tool" {
		t.Errorf("sym -> %q, %v", target, err)
	}
	val := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(dst, "usr/bin/grp"), "user.berth", val); err != nil || string(val[:n]) != "v" {
		t.Errorf("xattr user.berth = %q, %v; want v", val[:max(n, 0)], err)
	}
	for _, gone := range []string{"dev/null", "skipme"} {
		if _, err := os.Lstat(filepath.Join(dst, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s copied (%v), want skipped", gone, err)
		}
	}
	size, err := DirSize(dst)
	if err != nil || size != 3<<20+1+int64(len("export A=1\n")) {
		t.Errorf("dirSize = %d, %v; want hardlinked file counted once", size, err)
	}
}

func TestShiftCopyCancelled(t *testing.T) {
	requireRoot(t)
	src := makeTree(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := shiftCopy(ctx, src, t.TempDir(), testUIDBase, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("shiftCopy with cancelled ctx = %v, want context.Canceled", err)
	}
}
