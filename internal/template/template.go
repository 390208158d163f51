// Package template owns sandbox templates: named stacks of read-only root
// filesystem layers that sandboxes mount as overlay lower dirs. It builds the
// built-in templates (a busybox "minimal" and a Debian "base" made by
// debootstrap), caches expensive build inputs, and stores every layer with
// its file ownership shifted into the sandboxes' user-namespace uid range.
//
// On disk, under Config.DataDir:
//
//	templates/<name>/manifest.json        what is built, for which uid base
//	templates/<name>/layers/<layer-id>/   one read-only layer (shifted)
//	templates/.<name>.lock                serialises builds across processes
//
// A layer is built in a temporary directory beside its final place and
// renamed in, and the manifest is replaced atomically last, so a crash or a
// cancelled build never leaves a template that looks built but is not.
package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Config configures a Store.
type Config struct {
	// DataDir is berth's data dir; templates live under DataDir/templates.
	DataDir string
	// CacheDir holds build inputs worth keeping across rebuilds (the raw
	// debootstrap result). Default /var/cache/berth.
	CacheDir string
	// Mirror is the Debian mirror debootstrap fetches from.
	// Default http://deb.debian.org/debian.
	Mirror string
	// UIDBase is the host uid (and gid) that uid 0 inside a sandbox maps to.
	// Stored layers are owned by UIDBase+uid.
	UIDBase uint32
	// BusyboxPath is a statically linked busybox for the minimal template.
	// Default /bin/busybox.
	BusyboxPath string
	// DebootstrapPath is the debootstrap program. Default "debootstrap"
	// (looked up in PATH). Tests point it at a stand-in.
	DebootstrapPath string
	// ChrootPath is the chroot program that runs apt in the debootstrap
	// result (baseAptPackages). Default "chroot" (tests replace it).
	ChrootPath string
	// Logger receives operational logs. Default: discard.
	Logger *slog.Logger
	// Puller resolves images for image templates (BuildImage); nil
	// leaves them off. internal/imagepull provides one.
	Puller Puller
}

// Defaults for Config fields left empty.
const (
	DefaultCacheDir    = "/var/cache/berth"
	DefaultMirror      = "http://deb.debian.org/debian"
	DefaultBusyboxPath = "/bin/busybox"
)

// maxInnerID is the highest uid/gid a layer may carry inside the sandbox
// (nobody is 65534); UIDBase plus it must still fit a uint32.
const maxInnerID = 65535

// Template describes one template as callers see it.
type Template struct {
	Name        string
	Description string
	Built       bool
	BuiltAt     time.Time
	// BuildID names the build (see manifest.BuildID).
	BuildID   string
	SizeBytes int64
	// Isolation is the isolation level sandboxes of this template get
	// when their request names none ("" = the daemon's default).
	Isolation string
	// Layers are absolute directories, lowest first; empty when not built.
	Layers []string
	// Source says where the template comes from: "built-in", or
	// "image REF@DIGEST".
	Source string
	// SharedLayers counts the layers another template uses too (filled
	// by List).
	SharedLayers int
	// Defaults are what sandboxes of the template start with (an image's
	// ENV, WORKDIR, USER, ENTRYPOINT+CMD); empty for built-in templates.
	Defaults Defaults
}

// Store builds, finds and caches templates. It is safe for concurrent use.
type Store struct {
	cfg     Config
	log     *slog.Logger
	recipes map[string]recipe

	mu    sync.Mutex
	locks map[string]chan struct{} // one-slot semaphore per template name

	// sharedMu: image builds hold it shared from their first layer to
	// their manifest, PruneLayers exclusively. (One daemon owns a data
	// dir; this does not reach across processes.)
	sharedMu sync.RWMutex
}

// New returns a Store for cfg, creating DataDir/templates if needed.
func New(cfg Config) (*Store, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("template store: data dir: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = DefaultCacheDir
	}
	if cfg.Mirror == "" {
		cfg.Mirror = DefaultMirror
	}
	if cfg.BusyboxPath == "" {
		cfg.BusyboxPath = DefaultBusyboxPath
	}
	if cfg.ChrootPath == "" {
		cfg.ChrootPath = "chroot"
	}
	if cfg.DebootstrapPath == "" {
		cfg.DebootstrapPath = "debootstrap"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if u, err := url.Parse(cfg.Mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("template store: mirror %q is not an http(s) URL: %w", cfg.Mirror, errdefs.ErrInvalidArgument)
	}
	if cfg.UIDBase > math.MaxUint32-maxInnerID {
		return nil, fmt.Errorf("template store: uid base %d too high: %w", cfg.UIDBase, errdefs.ErrInvalidArgument)
	}
	var err error
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	if cfg.CacheDir, err = filepath.Abs(cfg.CacheDir); err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	s := &Store{
		cfg:     cfg,
		log:     cfg.Logger,
		recipes: builtinRecipes(),
		locks:   make(map[string]chan struct{}),
	}
	// 0755: an overlay mounted from inside a sandbox's user namespace needs
	// to traverse to its lower dirs as the namespace's root.
	if err := os.MkdirAll(s.root(), 0o755); err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	// What an export or import that died left (archive.go); one daemon
	// owns a data dir.
	for _, pat := range []string{".export-*", ".import-*"} {
		left, _ := filepath.Glob(filepath.Join(s.root(), pat))
		for _, p := range left {
			if err := os.RemoveAll(p); err != nil {
				s.log.Warn("remove leftover", "path", p, "err", err)
			}
		}
	}
	return s, nil
}

// ValidName checks a template name (types.ValidTemplateName).
func ValidName(name string) error { return types.ValidTemplateName(name) }

func (s *Store) root() string                 { return filepath.Join(s.cfg.DataDir, "templates") }
func (s *Store) dir(name string) string       { return filepath.Join(s.root(), name) }
func (s *Store) layersDir(name string) string { return filepath.Join(s.dir(name), "layers") }

// List returns the built-in templates, built or not, plus every other
// template that is built, sorted by name.
func (s *Store) List(ctx context.Context) ([]Template, error) {
	names := make(map[string]bool, len(s.recipes))
	for name := range s.recipes {
		names[name] = true
	}
	entries, err := os.ReadDir(s.root())
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() && ValidName(e.Name()) == nil {
			names[e.Name()] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	slices.Sort(sorted)

	out := make([]Template, 0, len(sorted))
	for _, name := range sorted {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := s.inspect(name)
		if err != nil {
			return nil, err
		}
		_, builtin := s.recipes[name]
		if !t.Built && !builtin {
			continue // a leftover directory of a template nobody can build
		}
		out = append(out, t)
	}
	uses := map[string]int{}
	for _, t := range out {
		for _, l := range slices.Compact(slices.Sorted(slices.Values(t.Layers))) {
			uses[l]++
		}
	}
	for i, t := range out {
		for _, l := range t.Layers {
			if uses[l] > 1 {
				out[i].SharedLayers++
			}
		}
	}
	return out, nil
}

// Get returns a built template. It fails with errdefs.ErrNotFound for a name
// that is neither built in nor built, and errdefs.ErrFailedPrecondition for a
// known template that is not built (or was built for another uid base).
func (s *Store) Get(ctx context.Context, name string) (Template, error) {
	if err := ValidName(name); err != nil {
		return Template{}, err
	}
	if err := ctx.Err(); err != nil {
		return Template{}, err
	}
	t, err := s.inspect(name)
	if err != nil {
		return Template{}, err
	}
	if t.Built {
		return t, nil
	}
	if _, ok := s.recipes[name]; !ok {
		if _, err := os.Stat(s.manifestPath(name)); err != nil {
			return Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
		}
		return Template{}, fmt.Errorf("template %q is not usable (built for another uid base or damaged) and has no recipe to rebuild it: %w", name, errdefs.ErrFailedPrecondition)
	}
	return Template{}, fmt.Errorf("template %q is not built; run `berth template build %s`: %w", name, name, errdefs.ErrFailedPrecondition)
}

// Ensure returns the template, building it first if it is not built.
func (s *Store) Ensure(ctx context.Context, name string, log io.Writer) (Template, error) {
	t, err := s.Get(ctx, name)
	if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		return t, err
	}
	if _, ok := s.recipes[name]; !ok {
		return Template{}, err // unusable and nothing to rebuild it from
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	// Someone may have built it while we waited for the lock.
	if t, err := s.inspect(name); err == nil && t.Built {
		return t, nil
	}
	return s.buildLocked(ctx, name, log)
}

// Build builds (or rebuilds) a built-in template, streaming the build log to
// log (which may be nil). Builds of one name are serialised, also across
// processes sharing the data dir. A cancelled or failed build leaves the
// previous build, if any, in place and no partial layer behind.
func (s *Store) Build(ctx context.Context, name string, log io.Writer) (Template, error) {
	if err := ValidName(name); err != nil {
		return Template{}, err
	}
	if _, ok := s.recipes[name]; !ok {
		// An image template rebuilds from the reference it was made from
		// (a tag may point somewhere new).
		if m, err := readManifest(s.manifestPath(name)); err == nil && m.ImageRef != "" {
			return s.BuildImage(ctx, name, m.ImageRef, StartOptions{}, log)
		}
		return Template{}, fmt.Errorf("template %q has no build recipe (make it from an image with --image): %w", name, errdefs.ErrNotFound)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	return s.buildLocked(ctx, name, log)
}

// Prune removes layers no manifest references and no mounted overlay uses,
// and leftovers of interrupted builds. Builds prune their own template; the
// daemon may call this at start, once crashed sandboxes are cleaned up.
func (s *Store) Prune(ctx context.Context) error {
	entries, err := os.ReadDir(s.root())
	if err != nil {
		return fmt.Errorf("prune templates: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || ValidName(e.Name()) != nil {
			continue
		}
		unlock, err := s.lock(ctx, e.Name())
		if err != nil {
			return err
		}
		errs = append(errs, s.pruneLocked(e.Name()))
		unlock()
	}
	return errors.Join(errs...)
}

// lock serialises work on one template name: in-process through a one-slot
// channel (so waiting honours ctx), across processes through flock.
func (s *Store) lock(ctx context.Context, name string) (func(), error) {
	s.mu.Lock()
	ch, ok := s.locks[name]
	if !ok {
		ch = make(chan struct{}, 1)
		s.locks[name] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for template %q lock: %w", name, ctx.Err())
	}
	release, err := flock(ctx, filepath.Join(s.root(), "."+name+".lock"))
	if err != nil {
		<-ch
		return nil, fmt.Errorf("lock template %q: %w", name, err)
	}
	return func() {
		release()
		<-ch
	}, nil
}
