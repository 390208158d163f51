package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// Dockerfile builds (internal/dockerfile) keep each step's result as a
// shared layer under .layers/, keyed by the step's cache key, next to image
// layers keyed by chain id: a template built from a Dockerfile names its
// base image's chain ids and its steps' keys, and PruneLayers treats them
// alike.

// UIDBase is the host uid that uid 0 of a sandbox's layers is stored as.
func (s *Store) UIDBase() uint32 { return s.cfg.UIDBase }

// StepLayer returns the directory of the stored layer key, if complete.
func (s *Store) StepLayer(key string) (string, bool) {
	if _, ok := s.sharedLayer(key); !ok {
		return "", false
	}
	return s.sharedDir(key), true
}

// SharedLayerDir is the directory a shared layer id lives in.
func (s *Store) SharedLayerDir(key string) string { return s.sharedDir(key) }

// AddStepLayer makes the stored layer key by calling fill on an empty
// directory (owned as the sandbox's root, UIDBase) and returns its
// directory. A layer already stored is returned as it is.
func (s *Store) AddStepLayer(ctx context.Context, key string, fill func(dir string) error) (string, error) {
	if !validLayerID(key) || len(key) < 32 {
		return "", fmt.Errorf("step layer key %q: %w", key, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(s.sharedRoot(), 0o755); err != nil {
		return "", err
	}
	unlock, err := s.lock(ctx, "layer-"+key[:32])
	if err != nil {
		return "", err
	}
	defer unlock()
	if dir, ok := s.StepLayer(key); ok {
		return dir, nil
	}
	os.Remove(s.sharedMeta(key))
	if err := os.RemoveAll(s.sharedDir(key)); err != nil {
		return "", err
	}
	tmp := filepath.Join(s.sharedRoot(), ".tmp-"+key[:32]+"-"+randHex(4))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", err
	}
	cleanup := func(err error) (string, error) {
		if rerr := os.RemoveAll(tmp); rerr != nil {
			s.log.Warn("remove partial layer", "path", tmp, "err", rerr)
		}
		return "", err
	}
	if err := unix.Lchown(tmp, int(s.cfg.UIDBase), int(s.cfg.UIDBase)); err != nil {
		return cleanup(err)
	}
	if err := fill(tmp); err != nil {
		return cleanup(err)
	}
	if err := syncFS(tmp); err != nil {
		return cleanup(err)
	}
	size, _ := DirSize(tmp)
	if err := os.Rename(tmp, s.sharedDir(key)); err != nil {
		return cleanup(err)
	}
	m := layerMeta{ChainID: "sha256:" + key, DiffID: "step", SizeBytes: size, UIDBase: s.cfg.UIDBase, Created: time.Now().UTC()}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeFileAtomic(s.sharedMeta(key), b); err != nil {
		return "", err
	}
	return s.sharedDir(key), nil
}

// FreezeInto copies src, a paused sandbox's writable layer, into dir (an
// AddStepLayer fill), moving its owners from the sandbox's uid range to
// the store's. Whiteouts and opaque directories are kept, so deletions
// stay deleted.
func (s *Store) FreezeInto(ctx context.Context, src, dir string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "cp", "-a", "--preserve=all", "--no-target-directory", src, dir)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(stderr.String()))
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	// Overlay makes the whiteouts of deleted files (0/0 character
	// devices) as the host's root, outside the sandbox's range: they are
	// the sandbox's root's.
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeCharDevice == 0 {
			return err
		}
		var wt unix.Stat_t
		if err := unix.Lstat(p, &wt); err != nil {
			return err
		}
		if wt.Rdev == 0 && (wt.Uid < st.Uid || wt.Uid-st.Uid >= idRange) {
			return unix.Lchown(p, int(st.Uid), int(st.Gid))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if st.Uid != s.cfg.UIDBase {
		return reown(ctx, dir, st.Uid, s.cfg.UIDBase)
	}
	return nil
}

// ImportLayers makes a built template's layers shared layers (for FROM
// berth:NAME) and returns their ids, lowest first, with its defaults.
// Layers of its own are hard-linked in (they are read-only), once.
func (s *Store) ImportLayers(ctx context.Context, name string) ([]string, Defaults, error) {
	t, err := s.Get(ctx, name)
	if err != nil {
		return nil, Defaults{}, err
	}
	ids := make([]string, 0, len(t.Layers))
	for _, dir := range t.Layers {
		if filepath.Dir(dir) == s.sharedRoot() {
			ids = append(ids, filepath.Base(dir))
			continue
		}
		sum := sha256.Sum256([]byte("template-layer\x00" + name + "\x00" + filepath.Base(dir)))
		key := hex.EncodeToString(sum[:])
		if _, err := s.AddStepLayer(ctx, key, func(tmp string) error {
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, "cp", "-al", "--no-target-directory", dir, tmp)
			cmd.Stderr = &stderr
			// cp wants the target absent.
			if err := os.Remove(tmp); err != nil {
				return err
			}
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("link %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
			}
			return nil
		}); err != nil {
			return nil, Defaults{}, err
		}
		ids = append(ids, key)
	}
	return ids, t.Defaults, nil
}

// PullLayers pulls ref's layers into the shared store and returns their
// chain ids, lowest first, the image's defaults and its name with digest.
func (s *Store) PullLayers(ctx context.Context, ref string, log io.Writer) ([]string, Defaults, string, error) {
	if err := s.CheckImageRef(ref); err != nil {
		return nil, Defaults{}, "", err
	}
	img, err := s.cfg.Puller.Resolve(ctx, ref)
	if err != nil {
		return nil, Defaults{}, "", err
	}
	fmt.Fprintf(log, "==> pulling %s (%s) from %s\n", img.Name, img.Digest, img.Registry)
	if img.OS != "" && img.OS != "linux" {
		return nil, Defaults{}, "", fmt.Errorf("image is for %s, not linux: %w", img.OS, errdefs.ErrFailedPrecondition)
	}
	diffIDs := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		diffIDs[i] = l.DiffID()
		if hx, ok := strings.CutPrefix(diffIDs[i], "sha256:"); !ok || len(hx) != 64 || strings.Trim(hx, "0123456789abcdef") != "" {
			return nil, Defaults{}, "", fmt.Errorf("layer diff id %q is not a sha256 digest: %w", diffIDs[i], errdefs.ErrFailedPrecondition)
		}
	}
	chains := chainIDs(diffIDs)
	if err := os.MkdirAll(s.sharedRoot(), 0o755); err != nil {
		return nil, Defaults{}, "", err
	}
	for i, l := range img.Layers {
		if _, err := s.ensureLayer(ctx, l, chains[:i+1], i, len(img.Layers), log); err != nil {
			return nil, Defaults{}, "", err
		}
	}
	src := img.Name
	if !strings.Contains(src, "@") {
		src += "@" + img.Digest
	}
	return chains, imageDefaults(img), src, nil
}

// BuildRecord is a template a Dockerfile build made.
type BuildRecord struct {
	Name        string
	Description string
	// Layers are shared layer ids, lowest first.
	Layers   []string
	Defaults Defaults
	// Source is what `template ls` shows ("dockerfile FILE from BASE").
	Source string
}

// HoldLayers keeps PruneLayers away until the returned func is called: a
// build holds it from its first layer to its manifest.
func (s *Store) HoldLayers() func() {
	s.sharedMu.RLock()
	return s.sharedMu.RUnlock
}

// PutBuilt writes the manifest of a template made of shared layers (a
// Dockerfile build). The caller holds HoldLayers.
func (s *Store) PutBuilt(ctx context.Context, r BuildRecord) (Template, error) {
	if err := ValidName(r.Name); err != nil {
		return Template{}, err
	}
	if _, ok := s.recipes[r.Name]; ok {
		return Template{}, fmt.Errorf("template %q is built in: %w", r.Name, errdefs.ErrInvalidArgument)
	}
	unlock, err := s.lock(ctx, r.Name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	var size int64
	for _, id := range r.Layers {
		m, ok := s.sharedLayer(id)
		if !ok {
			return Template{}, fmt.Errorf("layer %s is missing: %w", id, errdefs.ErrFailedPrecondition)
		}
		size += m.SizeBytes
	}
	if user := r.Defaults.User; user != "" {
		dirs := make([]string, 0, len(r.Layers))
		for j := len(r.Layers) - 1; j >= 0; j-- {
			dirs = append(dirs, s.sharedDir(r.Layers[j]))
		}
		if u, ok := resolveUser(user, dirs); ok {
			r.Defaults.User = u
		}
	}
	m := manifest{
		Version: manifestVersion, Name: r.Name, Description: r.Description, Shared: r.Layers,
		BuiltAt: time.Now().UTC().Truncate(time.Second), BuildID: NewBuildID(), SizeBytes: size, SourceHash: r.Source,
		UIDBase: s.cfg.UIDBase, Dockerfile: r.Source, Defaults: r.Defaults,
	}
	if old, err := readManifest(s.manifestPath(r.Name)); err == nil {
		m.Isolation = old.Isolation
	}
	if err := os.MkdirAll(s.dir(r.Name), 0o755); err != nil {
		return Template{}, err
	}
	if err := writeManifest(s.manifestPath(r.Name), m); err != nil {
		return Template{}, err
	}
	if err := s.pruneLocked(r.Name); err != nil {
		s.log.Warn("prune old template layers", "template", r.Name, "err", err)
	}
	return s.inspect(r.Name)
}
