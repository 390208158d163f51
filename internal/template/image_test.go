package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// fakePuller serves images from memory: the unit tests fake the registry
// (internal/imagepull and the e2e tests use a real one).
type fakePuller struct{ images map[string]Image }

func (f fakePuller) Check(ref string) error {
	if strings.ContainsAny(ref, " A") {
		return errdefs.ErrInvalidArgument
	}
	return nil
}

func (f fakePuller) Resolve(_ context.Context, ref string) (Image, error) {
	img, ok := f.images[ref]
	if !ok {
		return Image{}, errdefs.ErrNotFound
	}
	return img, nil
}

type memLayer struct {
	tar    []byte
	diffID string
}

func (l memLayer) DiffID() string               { return l.diffID }
func (l memLayer) Size() int64                  { return int64(len(l.tar)) }
func (l memLayer) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l.tar)), nil }

func newMemLayer(t *testing.T, entries []tarEntry) memLayer {
	b := makeTar(t, entries)
	sum := sha256.Sum256(b)
	return memLayer{tar: b, diffID: "sha256:" + hex.EncodeToString(sum[:])}
}

func TestBuildImage(t *testing.T) {
	requireRoot(t)
	base := newMemLayer(t, []tarEntry{
		{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n"},
		{name: "bin/tool", body: "#!", mode: 0o755},
	})
	top := newMemLayer(t, []tarEntry{{name: "srv/x", body: "x"}})
	other := newMemLayer(t, []tarEntry{{name: "srv/y", body: "y"}})
	bad := top
	bad.diffID = "sha256:" + strings.Repeat("ab", 32) // not what its content hashes to
	pl := fakePuller{images: map[string]Image{
		"one": {Name: "reg/one:1", Digest: "sha256:01", Env: []string{"A=1"}, User: "1001:1001", Cmd: []string{"run"}, Layers: []ImageLayer{base, top}},
		"two": {Name: "reg/two:1", Digest: "sha256:02", Layers: []ImageLayer{base, other}},
		"bad": {Name: "reg/bad:1", Digest: "sha256:03", Layers: []ImageLayer{base, bad}},
	}}
	dir := t.TempDir()
	s, err := New(Config{DataDir: dir, CacheDir: t.TempDir(), UIDBase: testUIDBase, Puller: pl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	one, err := s.BuildImage(ctx, "one", "one", StartOptions{}, nil)
	if err != nil {
		t.Fatalf("BuildImage(one): %v", err)
	}
	if len(one.Layers) != 2 || one.Defaults.User != "app" || one.Defaults.Workdir != "/" || one.Source != "image reg/one:1@sha256:01" {
		t.Errorf("one = %+v", one)
	}
	if _, err := s.BuildImage(ctx, "two", "two", StartOptions{}, nil); err != nil {
		t.Fatalf("BuildImage(two): %v", err)
	}
	stored, _ := filepath.Glob(filepath.Join(dir, "templates/.layers/*.json"))
	if len(stored) != 3 {
		t.Errorf("%d layers stored, want 3 (the base once)", len(stored))
	}
	ts, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		if (tp.Name == "one" || tp.Name == "two") && tp.SharedLayers != 1 {
			t.Errorf("%s shares %d layers, want 1", tp.Name, tp.SharedLayers)
		}
	}
	// A layer whose content does not match its diff id is refused and
	// leaves nothing behind.
	if _, err := s.BuildImage(ctx, "bad", "bad", StartOptions{}, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("BuildImage(bad) = %v, want failed precondition", err)
	}
	if _, err := s.Get(ctx, "bad"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(bad) = %v, want not found", err)
	}
	if _, err := s.BuildImage(ctx, "nope", "missing", StartOptions{}, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("BuildImage(missing) = %v", err)
	}
	if _, err := s.BuildImage(ctx, "minimal", "one", StartOptions{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("BuildImage over a built-in = %v", err)
	}
	// rm then prune frees what only two used.
	if err := s.Remove(ctx, "two"); err != nil {
		t.Fatal(err)
	}
	n, freed, err := s.PruneLayers(ctx)
	if err != nil || n != 1 || freed != 1 {
		t.Errorf("PruneLayers = %d, %d, %v; want 1 layer, 1 byte", n, freed, err)
	}
	if _, err := s.Get(ctx, "one"); err != nil {
		t.Errorf("one after prune: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "templates/.layers")); len(entries) != 4 {
		t.Errorf("layer store has %d entries, want 2 layers + 2 metas", len(entries))
	}
}
