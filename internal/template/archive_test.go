package template

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestExportImport: an image template exported by one daemon is imported
// by another with another uid base: the same files, owned by the
// importer's range, with the record (defaults, start, isolation, source)
// kept. A second import under a new name shares the layers; a name that
// exists, a built-in name, a tampered archive and a built-in template's
// export are refused, and a refused import leaves no layer behind.
func TestExportImport(t *testing.T) {
	requireRoot(t)
	base := newMemLayer(t, []tarEntry{
		{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n"},
		{name: "home/app/notes", body: "mine", uid: 1001, gid: 1001, mode: 0o600},
		{name: "bin/tool", body: "#!", mode: 0o755},
	})
	top := newMemLayer(t, []tarEntry{{name: "srv/x", body: "x"}, {name: "bin/.wh.tool"}})
	pl := fakePuller{images: map[string]Image{
		"one": {Name: "reg/one:1", Digest: "sha256:01", Env: []string{"A=1"}, User: "app", Cmd: []string{"run"}, Layers: []ImageLayer{base, top}},
	}}
	ctx := t.Context()
	src, err := New(Config{DataDir: t.TempDir(), CacheDir: t.TempDir(), UIDBase: testUIDBase, Puller: pl})
	if err != nil {
		t.Fatal(err)
	}
	ready := &ReadyCheck{File: "/srv/x"}
	one, err := src.BuildImage(ctx, "one", "one", StartOptions{FromImage: true, Ready: ready}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SetIsolation(ctx, "one", "gvisor"); err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := src.Export(ctx, "one", &archive); err != nil {
		t.Fatalf("Export: %v", err)
	}

	const otherBase = testUIDBase + 65536
	dstDir := t.TempDir()
	dst, err := New(Config{DataDir: dstDir, CacheDir: t.TempDir(), UIDBase: otherBase})
	if err != nil {
		t.Fatal(err)
	}
	got, err := dst.Import(ctx, bytes.NewReader(archive.Bytes()), "")
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if !got.Built || got.Name != "one" || got.Source != one.Source || got.Isolation != "gvisor" || len(got.Layers) != 2 ||
		got.Defaults.User != "app" || got.Defaults.Ready == nil || got.Defaults.Ready.File != "/srv/x" || len(got.Defaults.Start) != 1 ||
		!got.BuiltAt.Equal(one.BuiltAt) || got.SizeBytes != one.SizeBytes || !ValidBuildID(one.BuildID) || got.BuildID != one.BuildID {
		t.Errorf("imported = %+v\nsource   = %+v", got, one)
	}
	// A build of its own is another build.
	if rebuilt, err := src.BuildImage(ctx, "one", "one", StartOptions{FromImage: true, Ready: ready}, nil); err != nil || rebuilt.BuildID == one.BuildID || !ValidBuildID(rebuilt.BuildID) {
		t.Errorf("rebuild of one: build ID %q (%v), the first's %q", rebuilt.BuildID, err, one.BuildID)
	}
	notes := lstat(t, filepath.Join(got.Layers[0], "home/app/notes"))
	if notes.Uid != otherBase+1001 || notes.Gid != otherBase+1001 || notes.Mode&0o7777 != 0o600 {
		t.Errorf("notes owned %d:%d mode %o; want %d:%d 600", notes.Uid, notes.Gid, notes.Mode&0o7777, otherBase+1001, otherBase+1001)
	}
	if b, err := os.ReadFile(filepath.Join(got.Layers[1], "srv/x")); err != nil || string(b) != "x" {
		t.Errorf("srv/x = %q, %v", b, err)
	}
	if st := lstat(t, filepath.Join(got.Layers[1], "bin/tool")); !isWhiteout(&st) {
		t.Errorf("the top layer's whiteout of bin/tool did not travel: mode %o", st.Mode)
	}
	// Imported layers are stored under their own ids, not the image's.
	for i, l := range got.Layers {
		if l == one.Layers[i] || filepath.Base(l) == filepath.Base(one.Layers[i]) {
			t.Errorf("layer %d stored under the exporter's chain id %s", i, filepath.Base(l))
		}
	}

	again, err := dst.Import(ctx, bytes.NewReader(archive.Bytes()), "one-copy")
	if err != nil || again.Name != "one-copy" || !again.Built {
		t.Fatalf("Import as one-copy = %+v, %v", again, err)
	}
	stored, _ := filepath.Glob(filepath.Join(dstDir, "templates/.layers/*.json"))
	if len(stored) != 2 {
		t.Errorf("%d layers stored after two imports, want 2 (shared)", len(stored))
	}
	if _, err := dst.Import(ctx, bytes.NewReader(archive.Bytes()), ""); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Import over an existing name = %v, want already exists", err)
	}
	if _, err := dst.Import(ctx, bytes.NewReader(archive.Bytes()), "minimal"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Import as a built-in name = %v, want already exists", err)
	}
	// ImportOver takes an existing template's place (a node catching up
	// with a rebuild), never a built-in one's.
	over, err := dst.ImportOver(ctx, bytes.NewReader(archive.Bytes()), "one-copy")
	if err != nil || over.Name != "one-copy" || !over.Built || over.BuiltAt != again.BuiltAt {
		t.Errorf("ImportOver one-copy = %+v, %v; want it built as the archive's", over, err)
	}
	if _, err := dst.ImportOver(ctx, bytes.NewReader(archive.Bytes()), "minimal"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("ImportOver a built-in name = %v, want already exists", err)
	}
	if err := src.Export(ctx, "minimal", &bytes.Buffer{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Export(minimal) = %v, want failed precondition (built in)", err)
	}
	if err := src.Export(ctx, "nope", &bytes.Buffer{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Export(nope) = %v, want not found", err)
	}

	// A flipped byte in a layer fails the import on its digest, with
	// nothing left behind.
	tampered := bytes.Clone(archive.Bytes())
	i := bytes.LastIndex(tampered, []byte("mine"))
	if i < 0 {
		t.Fatal("archive does not hold notes' content")
	}
	tampered[i] = 'M'
	fresh := t.TempDir()
	d3, err := New(Config{DataDir: fresh, CacheDir: t.TempDir(), UIDBase: otherBase})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d3.Import(ctx, bytes.NewReader(tampered), ""); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "digest") {
		t.Errorf("Import(tampered) = %v, want invalid argument on a digest", err)
	}
	if left, _ := os.ReadDir(filepath.Join(fresh, "templates/.layers")); len(left) != 0 {
		t.Errorf("a refused import left %d entries in the layer store", len(left))
	}
	for _, dir := range []string{fresh, dstDir} {
		if left, _ := filepath.Glob(filepath.Join(dir, "templates/.import-*")); len(left) != 0 {
			t.Errorf("imports left %v", left)
		}
	}
	if _, err := d3.Get(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(one) after a refused import = %v, want not found", err)
	}
	// Bytes that are no archive at all.
	if _, err := d3.Import(ctx, strings.NewReader("not a tar"), ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Import(garbage) = %v, want invalid argument", err)
	}
}
