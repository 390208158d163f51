package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
	uid, gid   int
	pax        map[string]string
}

func makeTar(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0), PAXRecords: e.pax, Format: tar.FormatPAX}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if hdr.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func extractInto(t *testing.T, entries []tarEntry, lowers ...string) (string, extractStats, error) {
	t.Helper()
	dst := t.TempDir()
	st, err := extractLayer(t.Context(), bytes.NewReader(makeTar(t, entries)), dst, testUIDBase, lowers)
	return dst, st, err
}

func TestExtractLayer(t *testing.T) {
	requireRoot(t)
	lower, _, err := extractInto(t, []tarEntry{
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/os-release", body: "lower\n"},
		{name: "opt/old/a", body: "a"},
		{name: "usr/bin/python3", body: "#!python", mode: 0o755},
	})
	if err != nil {
		t.Fatalf("lower: %v", err)
	}
	dst, st, err := extractInto(t, []tarEntry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/.wh.os-release", body: ""},
		{name: "opt/old/", typ: tar.TypeDir, mode: 0o755},
		{name: "opt/old/.wh..wh..opq"},
		{name: "opt/old/b", body: "b"},
		{name: "home/user/", typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
		{name: "home/user/file", body: "hello", uid: 1000, gid: 1000, pax: map[string]string{"SCHILY.xattr.user.k": "v", "SCHILY.xattr.trusted.overlay.opaque": "y"}},
		{name: "home/user/link", typ: tar.TypeLink, link: "home/user/file"},
		{name: "usr/bin/python", typ: tar.TypeLink, link: "/usr/bin/python3"}, // target in the lower layer
		{name: "usr/bin/sudo", body: "x", mode: 0o4755},
		{name: "usr/bin/py", typ: tar.TypeSymlink, link: "/usr/bin/python3"},
		{name: "big-owner", body: "z", uid: 1 << 20, gid: 5},
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		{name: "tmp/fifo", typ: tar.TypeFifo, mode: 0o600},
	}, lower)
	if err != nil {
		t.Fatalf("extract: %v", err)
	}
	p := func(rel string) string { return filepath.Join(dst, rel) }

	// Whiteout: a 0/0 character device owned by the sandbox's root.
	wst := lstat(t, p("etc/os-release"))
	if wst.Mode&unix.S_IFMT != unix.S_IFCHR || wst.Rdev != 0 || wst.Uid != testUIDBase {
		t.Errorf("whiteout: mode %o rdev %d uid %d", wst.Mode, wst.Rdev, wst.Uid)
	}
	if _, err := os.Lstat(p("etc/.wh.os-release")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".wh. file itself extracted: %v", err)
	}
	// Opaque directory.
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(p("opt/old"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr = %q, %v", buf[:n], err)
	}
	if _, err := os.Lstat(p("opt/old/.wh..wh..opq")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("opaque marker extracted as a file: %v", err)
	}
	// Hard link within the layer: one inode.
	a, b := lstat(t, p("home/user/file")), lstat(t, p("home/user/link"))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link: inodes %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if a.Uid != testUIDBase+1000 || a.Gid != testUIDBase+1000 {
		t.Errorf("file owner %d:%d", a.Uid, a.Gid)
	}
	// user.* xattrs kept, trusted.* never taken from a layer.
	if n, err := unix.Lgetxattr(p("home/user/file"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("user xattr = %q, %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(p("home/user/file"), "trusted.overlay.opaque", buf); err == nil {
		t.Error("trusted.* xattr from the tar was applied")
	}
	// Hard link to a lower layer's file: a copy with its content and owner.
	py := lstat(t, p("usr/bin/python"))
	if body, _ := os.ReadFile(p("usr/bin/python")); string(body) != "#!python" || py.Mode&0o777 != 0o755 || py.Uid != testUIDBase {
		t.Errorf("cross-layer hard link: %q mode %o uid %d", body, py.Mode, py.Uid)
	}
	if st := lstat(t, p("usr/bin/sudo")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("setuid lost: %o", st.Mode&0o7777)
	}
	if target, err := os.Readlink(p("usr/bin/py")); err != nil || target != "/usr/bin/python3" {
		t.Errorf("symlink = %q, %v", target, err)
	}
	if st := lstat(t, p("big-owner")); st.Uid != testUIDBase+nobodyID || st.Gid != testUIDBase+5 {
		t.Errorf("out-of-range owner became %d:%d", st.Uid, st.Gid)
	}
	if home := lstat(t, p("home/user")); home.Mode&0o777 != 0o750 || home.Mtim.Sec != 1700000000 {
		t.Errorf("home: mode %o mtime %d", home.Mode&0o777, home.Mtim.Sec)
	}
	if _, err := os.Lstat(p("dev/null")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("device node extracted: %v", err)
	}
	if st := lstat(t, p("tmp/fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo: %o", st.Mode)
	}
	if st.Remapped != 1 || st.Skipped != 1 || st.Files != 5 {
		t.Errorf("stats = %+v", st)
	}
}

// A layer must not write outside its directory: not through "..", not
// through an absolute name, not through a symlink it planted itself.
func TestExtractLayerConfined(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	cases := map[string][]tarEntry{
		"dotdot":        {{name: "../../../../" + outside + "/x", body: "evil"}},
		"absolute":      {{name: outside + "/x", body: "evil"}},
		"symlink dir":   {{name: "a", typ: tar.TypeSymlink, link: outside}, {name: "a/x", body: "evil"}},
		"symlink file":  {{name: "a", typ: tar.TypeSymlink, link: outside + "/x"}, {name: "a", body: "evil"}},
		"hardlink out":  {{name: "l", typ: tar.TypeLink, link: "../../../../" + outside + "/secret"}},
		"whiteout link": {{name: "a", typ: tar.TypeSymlink, link: outside}, {name: "a/.wh.secret"}},
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			dst, _, err := extractInto(t, entries)
			t.Logf("extract: %v", err)
			got, _ := os.ReadDir(outside)
			if len(got) != 1 || got[0].Name() != "secret" {
				t.Fatalf("outside dir changed: %v", got)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
				t.Fatal("outside file changed")
			}
			// The planted symlink stays a symlink: nothing went through it.
			if name == "symlink dir" {
				if st, err := os.Lstat(filepath.Join(dst, "a")); err != nil || st.Mode()&fs.ModeSymlink == 0 {
					t.Errorf("symlink replaced: %v", err)
				}
			}
		})
	}
}

func TestCleanEntryPath(t *testing.T) {
	for in, want := range map[string]string{
		"./":          ".",
		"/":           ".",
		"a/b/":        "a/b",
		"../../etc":   "etc",
		"/abs/x":      "abs/x",
		"a/../../b/.": "b",
		"./a//b":      "a/b",
	} {
		got, err := cleanEntryPath(in)
		if err != nil || got != want {
			t.Errorf("cleanEntryPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a\x00b"} {
		if _, err := cleanEntryPath(bad); err == nil {
			t.Errorf("cleanEntryPath(%q) accepted", bad)
		}
	}
}

// FuzzExtractLayer extracts layers whose entry names, link targets and
// types come from the fuzzer and checks that nothing appears outside the
// layer directory.
func FuzzExtractLayer(f *testing.F) {
	f.Add("a/b", "../x", byte(tar.TypeSymlink), "a/b/c", "")
	f.Add("../../x", "", byte(tar.TypeReg), "/x", "")
	f.Add("l", "/etc/passwd", byte(tar.TypeLink), "l", "")
	f.Add("d", "..", byte(tar.TypeSymlink), "d/.wh.x", "")
	f.Add("d/.wh..wh..opq", "", byte(tar.TypeReg), "d/../../y", "z")
	f.Fuzz(func(t *testing.T, name1, link1 string, typ1 byte, name2, link2 string) {
		if os.Geteuid() != 0 {
			t.Skip("needs root")
		}
		parent := t.TempDir()
		dst := filepath.Join(parent, "layer")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		types := []byte{tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo}
		typ2 := types[int(typ1)%len(types)]
		entries := []tarEntry{
			{name: name1, link: link1, typ: typ1},
			{name: name2, link: link2, typ: typ2, body: "x"},
			{name: name2 + "/f", body: "y"},
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Format: tar.FormatPAX}
			if e.typ == tar.TypeReg {
				hdr.Size = int64(len(e.body))
			}
			if tw.WriteHeader(hdr) != nil {
				return // not a name tar can carry
			}
			if hdr.Size > 0 {
				_, _ = tw.Write([]byte(e.body))
			}
		}
		_ = tw.Close()
		_, _ = extractLayer(t.Context(), &buf, dst, testUIDBase, nil)
		got, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Name() != "layer" {
			t.Fatalf("entries outside the layer: %v", got)
		}
	})
}
