package dockerfile

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestContextPlan(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"a.txt": "a", "src/b.txt": "b", "src/secret.key": "no", "logs/x.log": "no",
		".dockerignore": "*.log\nlogs\nsrc/*.key\n",
	})
	// A symlink out of the context is copied as a link, never followed.
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "src", "escape")); err != nil {
		t.Fatal(err)
	}
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	es, err := c.plan([]string{"src/", "../../a.txt"}, "/app/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.dst)
	}
	want := "app app/a.txt app/b.txt app/escape"
	if strings.Join(got, " ") != want {
		t.Errorf("plan = %q, want %q", got, want)
	}
	h1, err := c.hash(es)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "src/b.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if h2, _ := c.hash(es); h2 == h1 {
		t.Error("hash unchanged after a file changed")
	}
	if _, err := c.plan([]string{"logs/x.log"}, "/x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ignored source: %v", err)
	}
	if _, err := c.plan([]string{"nope"}, "/x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("missing source: %v", err)
	}
	layer := t.TempDir()
	if err := c.copyTo(es, layer, os.Getuid(), os.Getgid(), nil, os.Getuid(), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(layer, "app/b.txt")); string(b) != "changed" {
		t.Errorf("copied b.txt = %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(layer, "app/escape")); l != "/etc/shadow" {
		t.Errorf("copied link = %q", l)
	}
	if _, err := os.Stat(filepath.Join(layer, "app/secret.key")); err == nil {
		t.Error("an ignored file was copied")
	}
}

func tarOf(t testing.TB, entries []tar.Header, content string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(content))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(content))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestExtractContextConfined(t *testing.T) {
	outside := t.TempDir()
	dir := t.TempDir()
	b := tarOf(t, []tar.Header{
		{Name: "../../" + filepath.Base(outside) + "/evil", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside},
		{Name: "link/evil2", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "ok/file", Typeflag: tar.TypeReg, Mode: 0o755},
	}, "x")
	_ = ExtractContext(bytes.NewReader(b), dir)
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("extraction wrote outside: %v", ents)
	}
}

func FuzzExtractContext(f *testing.F) {
	f.Add("a/b", "../x", "/abs", "link")
	f.Fuzz(func(t *testing.T, n1, n2, n3, target string) {
		outside := t.TempDir()
		dir := filepath.Join(outside, "ctx")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var hs []tar.Header
		for _, n := range []string{n1, n2, n3} {
			hs = append(hs, tar.Header{Name: n, Typeflag: tar.TypeSymlink, Linkname: target},
				tar.Header{Name: n + "/f", Typeflag: tar.TypeReg, Mode: 0o644},
				tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644})
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			if tw.WriteHeader(&h) != nil {
				return
			}
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		_ = ExtractContext(&buf, dir)
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 {
			t.Fatalf("extraction wrote beside the context: %v", ents)
		}
		// And copying everything out of it stays inside too.
		c, err := OpenContext(dir)
		if err != nil {
			return
		}
		defer c.Close()
		es, err := c.plan([]string{n1, n2, n3, "."}, "/dst/")
		if err != nil {
			return
		}
		layer := filepath.Join(outside, "layer")
		if err := os.Mkdir(layer, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = c.copyTo(es, layer, os.Getuid(), os.Getgid(), nil, os.Getuid(), 0)
		ents, _ = os.ReadDir(outside)
		if len(ents) != 2 {
			t.Fatalf("copy wrote beside the layer: %v", ents)
		}
	})
}
