package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// Cached environments: a sandbox's writable layer after a successful
// workspace setup, frozen into a read-only layer that later sandboxes with
// the same key stack on top of their template's layers instead of running
// setup again. On disk, under Config.DataDir:
//
//	environments/<key>/layer/     the frozen upper dir, owners moved from
//	                              the sandbox's uid range to the canonical one
//	environments/<key>/env.json   what it is; written last, so its presence
//	                              means the layer is complete
//
// Overlay honours whiteouts (0/0 character devices) and opaque directories
// (trusted.overlay.opaque) in lower layers as it does in upper ones, so the
// copy keeps them and deletions made during setup stay deleted.

// Environment is one cached environment.
type Environment struct {
	Key      string    `json:"key"`
	Template string    `json:"template"`
	Repo     string    `json:"repo"`
	Commit   string    `json:"commit"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	// SizeBytes is the size of the frozen layer alone.
	SizeBytes int64 `json:"size_bytes"`
	// EnvFile is the environment file setup ran with, when it came from
	// the repository: a cache hit for a pinned commit needs its
	// resources and agent-phase policy without cloning.
	EnvFile []byte `json:"env_file,omitempty"`
	// BaseLayers are the template's layers the environment sits on.
	BaseLayers []string `json:"base_layers"`
	// Layers are BaseLayers plus the environment's own, lowest first:
	// what a sandbox mounts.
	Layers []string `json:"-"`
}

var validEnvKey = regexp.MustCompile(`^[a-f0-9]{16,64}$`)

func (s *Store) envRoot() string           { return filepath.Join(s.cfg.DataDir, "environments") }
func (s *Store) envDir(key string) string  { return filepath.Join(s.envRoot(), key) }
func (s *Store) envMeta(key string) string { return filepath.Join(s.envDir(key), "env.json") }

func checkEnvKey(key string) error {
	if !validEnvKey.MatchString(key) {
		return fmt.Errorf("environment key %q: want 16-64 lowercase hex digits: %w", key, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Environment returns the cached environment for key, usable only when
// every layer it stacks on still exists. It fails with ErrNotFound otherwise.
func (s *Store) Environment(ctx context.Context, key string) (Environment, error) {
	if err := checkEnvKey(key); err != nil {
		return Environment{}, err
	}
	if err := ctx.Err(); err != nil {
		return Environment{}, err
	}
	var e Environment
	b, err := os.ReadFile(s.envMeta(key))
	if errors.Is(err, fs.ErrNotExist) {
		return Environment{}, fmt.Errorf("environment %s: %w", key, errdefs.ErrNotFound)
	}
	if err != nil {
		return Environment{}, fmt.Errorf("environment %s: %w", key, err)
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return Environment{}, fmt.Errorf("environment %s: %w", key, err)
	}
	own := filepath.Join(s.envDir(key), "layer")
	for _, l := range append(slices.Clone(e.BaseLayers), own) {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return Environment{}, fmt.Errorf("environment %s: layer %s is gone: %w", key, l, errdefs.ErrNotFound)
		}
	}
	e.Layers = append(slices.Clone(e.BaseLayers), own)
	return e, nil
}

// TouchEnvironment records that a sandbox started from the environment.
func (s *Store) TouchEnvironment(key string) {
	if checkEnvKey(key) != nil {
		return
	}
	b, err := os.ReadFile(s.envMeta(key))
	if err != nil {
		return
	}
	var e Environment
	if json.Unmarshal(b, &e) != nil {
		return
	}
	e.LastUsed = time.Now().UTC()
	if b, err = json.MarshalIndent(e, "", "  "); err == nil {
		_ = writeFileAtomic(s.envMeta(key), b) // best effort: LastUsed is informational
	}
}

// AddEnvironment freezes src (a paused sandbox's upper dir) into the cached
// environment key on top of base. The copy keeps ownership, modes, times,
// xattrs (trusted.overlay.*), hard links and device nodes (whiteouts).
// An environment that already exists is returned as it is.
func (s *Store) AddEnvironment(ctx context.Context, key string, base Template, repo, commit string, envFile []byte, src string) (Environment, error) {
	if err := checkEnvKey(key); err != nil {
		return Environment{}, err
	}
	if e, err := s.Environment(ctx, key); err == nil {
		return e, nil
	}
	if err := os.MkdirAll(s.envRoot(), 0o755); err != nil {
		return Environment{}, fmt.Errorf("add environment: %w", err)
	}
	unlock, err := s.lock(ctx, ".env-"+key)
	if err != nil {
		return Environment{}, err
	}
	defer unlock()
	dir := s.envDir(key)
	// A leftover of a crashed freeze has no env.json: start over.
	if err := os.RemoveAll(dir); err != nil {
		return Environment{}, fmt.Errorf("add environment: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Environment{}, fmt.Errorf("add environment: %w", err)
	}
	layer := filepath.Join(dir, "layer")
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "cp", "-a", "--preserve=all", "--no-target-directory", src, layer)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return Environment{}, fmt.Errorf("copy %s into environment %s: %w: %s", src, key, err, strings.TrimSpace(stderr.String()))
	}
	// The writable layer's top directory belongs to the sandbox's root:
	// its owner is the start of the sandbox's host uid range.
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		os.RemoveAll(dir)
		return Environment{}, fmt.Errorf("add environment %s: %w", key, err)
	}
	if st.Uid != s.cfg.UIDBase {
		if err := reown(ctx, layer, st.Uid, s.cfg.UIDBase); err != nil {
			os.RemoveAll(dir)
			return Environment{}, fmt.Errorf("add environment %s: %w", key, err)
		}
	}
	if err := syncFS(layer); err != nil {
		os.RemoveAll(dir)
		return Environment{}, err
	}
	size, _ := DirSize(layer)
	now := time.Now().UTC()
	e := Environment{Key: key, Template: base.Name, Repo: repo, Commit: commit, Created: now, LastUsed: now, SizeBytes: size, BaseLayers: base.Layers, EnvFile: envFile}
	b, err := json.MarshalIndent(e, "", "  ")
	if err == nil {
		err = writeFileAtomic(s.envMeta(key), b)
	}
	if err != nil {
		os.RemoveAll(dir)
		return Environment{}, fmt.Errorf("add environment %s: %w", key, err)
	}
	e.Layers = append(slices.Clone(e.BaseLayers), layer)
	return e, nil
}

// Environments lists the complete cached environments, newest first.
func (s *Store) Environments(ctx context.Context) ([]Environment, error) {
	ents, err := os.ReadDir(s.envRoot())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	var out []Environment
	for _, d := range ents {
		if !d.IsDir() || checkEnvKey(d.Name()) != nil {
			continue
		}
		if e, err := s.Environment(ctx, d.Name()); err == nil {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Environment) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// PruneEnvironments removes cached environments (all of them, or only the
// one named by key) that no mounted overlay uses, and leftovers of
// interrupted freezes. It returns the keys removed.
func (s *Store) PruneEnvironments(ctx context.Context, key string) ([]string, error) {
	if key != "" {
		if err := checkEnvKey(key); err != nil {
			return nil, err
		}
		if _, err := os.Stat(s.envDir(key)); err != nil {
			return nil, fmt.Errorf("environment %s: %w", key, errdefs.ErrNotFound)
		}
	}
	ents, err := os.ReadDir(s.envRoot())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("prune environments: %w", err)
	}
	mounted := mountOptions()
	var removed []string
	var errs []error
	for _, d := range ents {
		k := d.Name()
		if !d.IsDir() || checkEnvKey(k) != nil || (key != "" && k != key) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		if strings.Contains(mounted, filepath.Join(s.envDir(k), "layer")) {
			s.log.Info("keeping environment in use by a mount", "key", k)
			continue
		}
		unlock, err := s.lock(ctx, ".env-"+k)
		if err != nil {
			return removed, err
		}
		if err := os.RemoveAll(s.envDir(k)); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, k)
		}
		unlock()
	}
	return removed, errors.Join(errs...)
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
