package volume

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

const testBase = 1000000

func ptr(v uint32) *uint32 { return &v }

// newFiles is a volume root in a plain directory (the host's view of a
// mounted volume), with a secret beside it that no path may reach.
func newFiles(t *testing.T) (*Files, string) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFiles(root, testBase)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, root
}

// TestFiles: the volume's files are written, listed, read, changed and
// removed at their paths in it, owned in the sandbox's ids (kept on disk
// in the canonical range), and nothing outside the volume is reached
// through a symlink or "..".
func TestFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	f, root := newFiles(t)
	e, err := f.WriteFile("/a/b/c.txt", strings.NewReader("hello"), Attrs{UID: ptr(1000), GID: ptr(1000)}, true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "/a/b/c.txt" || e.Name != "c.txt" || e.Type != "file" || e.Size != 5 || e.UID != 1000 || e.GID != 1000 || e.Mode != 0o644 {
		t.Errorf("written entry = %+v", e)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "a/b/c.txt"), &st); err != nil || st.Uid != testBase+1000 || st.Gid != testBase+1000 {
		t.Errorf("on disk: uid %d gid %d (%v), want %d", st.Uid, st.Gid, err, testBase+1000)
	}
	if e, err := f.Stat("a/b"); err != nil || e.Type != "directory" || e.UID != 1000 {
		t.Errorf("a parent made by force = %+v, %v; want a directory of uid 1000", e, err)
	}
	if _, err := f.WriteFile("/x/y.txt", strings.NewReader("no"), Attrs{}, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("write under a missing parent without force = %v, want not found", err)
	}
	rd, fi, err := f.ReadFile("/a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rd)
	rd.Close()
	if string(b) != "hello" || fi.Size() != 5 {
		t.Errorf("read %q (size %d)", b, fi.Size())
	}
	// Through a symlink inside the volume: the target's size, not the
	// link's.
	if err := os.Symlink("b/c.txt", filepath.Join(root, "a", "link")); err != nil {
		t.Fatal(err)
	}
	if rd, fi, err := f.ReadFile("/a/link"); err != nil || fi.Size() != 5 {
		t.Errorf("ReadFile through an inner symlink = %v, %v", fi, err)
	} else {
		rd.Close()
	}
	if err := os.Remove(filepath.Join(root, "a", "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.MakeDir("/a", Attrs{}, false); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("mkdir of an existing dir = %v, want already exists", err)
	}
	if e, err := f.MakeDir("/a", Attrs{}, true); err != nil || e.Type != "directory" {
		t.Errorf("mkdir -p of an existing dir = %+v, %v", e, err)
	}
	if e, err := f.MakeDir("/d", Attrs{Mode: ptr(0o700)}, false); err != nil || e.Mode != 0o700 || e.UID != 0 {
		t.Errorf("mkdir /d = %+v, %v", e, err)
	}
	if e, err := f.SetAttrs("/a/b/c.txt", Attrs{UID: ptr(5), Mode: ptr(0o600)}); err != nil || e.UID != 5 || e.GID != 1000 || e.Mode != 0o600 {
		t.Errorf("SetAttrs = %+v, %v", e, err)
	}
	for _, bad := range []Attrs{{UID: ptr(MaxID + 1)}, {GID: ptr(1 << 31)}, {Mode: ptr(0o17777)}} {
		if _, err := f.SetAttrs("/a", bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetAttrs(%+v) = %v, want invalid argument", bad, err)
		}
	}
	list, err := f.List("/", 1)
	if err != nil || len(list) != 2 || list[0].Path != "/a" || list[1].Path != "/d" {
		t.Errorf("List(/, 1) = %+v, %v", list, err)
	}
	if list, err := f.List("/", 3); err != nil || len(list) != 4 || list[2].Path != "/a/b/c.txt" {
		t.Errorf("List(/, 3) = %+v, %v", list, err)
	}
	if list, err := f.List("/a/b/c.txt", 1); err != nil || len(list) != 1 || list[0].Path != "/a/b/c.txt" || list[0].Type != "file" {
		t.Errorf("List of a file = %+v, %v; want its own entry", list, err)
	}

	// Out of the volume: symlinks pointing out, absolute or relative, and
	// "..". Their own entries are fine; following them is refused.
	for name, target := range map[string]string{"abs": filepath.Join(root, "..", "secret"), "rel": "../secret", "dir": "/"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
		if e, err := f.Stat("/" + name); err != nil || e.Type != "symlink" || e.Target != target {
			t.Errorf("stat of symlink %s = %+v, %v", name, e, err)
		}
	}
	for _, p := range []string{"/rel", "/abs", "/dir/secret", "/dir/../secret"} {
		if rd, _, err := f.ReadFile(p); err == nil {
			b, _ := io.ReadAll(rd)
			rd.Close()
			t.Errorf("ReadFile(%s) read %q outside the volume", p, b)
		}
	}
	for _, p := range []string{"/rel", "/dir/escape"} {
		if _, err := f.WriteFile(p, strings.NewReader("pwned"), Attrs{}, true); err == nil {
			// A write to a symlink's own name replaces the link (rename
			// over it), never its target.
			if b, _ := os.ReadFile(filepath.Join(root, "..", "secret")); string(b) != "host" {
				t.Errorf("WriteFile(%s) wrote outside the volume", p)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escape")); err == nil {
		t.Error("a write through a symlinked dir landed outside the volume")
	}
	if _, err := f.SetAttrs("/dir", Attrs{Mode: ptr(0o777)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("chmod of a symlink = %v, want invalid argument", err)
	}
	if err := f.Remove("/abs"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(root), "secret")); err != nil || string(b) != "host" {
		t.Errorf("removing a symlink touched its target: %q, %v", b, err)
	}
	for _, p := range []string{"", "/../secret", "a/../../secret", "a\x00b"} {
		if _, err := f.Stat(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Stat(%q) = %v, want invalid argument", p, err)
		}
	}
	if err := f.Remove("/"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Remove(/) = %v, want invalid argument", err)
	}
	if err := f.Remove("/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat("/a/b/c.txt"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after removing /a: %v, want not found", err)
	}
	if err := f.Remove("/a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second remove = %v, want not found", err)
	}
}

// FuzzCleanPath: whatever it accepts is a relative, clean name inside
// the root.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "a/b", "/a/../b", "..", "a//b/", "./a", "/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		name, err := CleanPath(p)
		if err != nil {
			return
		}
		if name == "" || strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) || filepath.Clean(name) != name {
			t.Fatalf("CleanPath(%q) = %q", p, name)
		}
		if name == ".." || strings.HasPrefix(name, "../") {
			t.Fatalf("CleanPath(%q) = %q climbs out", p, name)
		}
	})
}
