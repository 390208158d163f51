package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// NewBuildID is a new build's ID: 16 random bytes, in hex.
func NewBuildID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ValidBuildID reports whether id is a build ID as NewBuildID makes them.
func ValidBuildID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// manifestVersion is bumped when the manifest's meaning changes.
const manifestVersion = 1

// manifest records one built template. It is written last, atomically, so
// its presence means the layers it names are complete.
type manifest struct {
	Version     int       `json:"version"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Layers      []string  `json:"layers"` // layer ids under layers/, lowest first
	BuiltAt     time.Time `json:"built_at"`
	// BuildID names this build of the template: new at each build, kept
	// by an export and its import (so copies of one build share it).
	BuildID    string `json:"build_id,omitempty"`
	SizeBytes  int64  `json:"size_bytes"`
	SourceHash string `json:"source_hash"`
	UIDBase    uint32 `json:"uid_base"`
	// Isolation is the level sandboxes of the template run at when their
	// request names none ("" = the daemon's default). It is the
	// operator's setting (SetIsolation) and survives rebuilds.
	Isolation string `json:"isolation,omitempty"`
	// Image templates: chain ids of shared layers (under .layers/),
	// lowest first, instead of Layers; the image they came from (with
	// digest) and the reference to rebuild from; the image's defaults.
	Shared   []string `json:"shared_layers,omitempty"`
	Image    string   `json:"image,omitempty"`
	ImageRef string   `json:"image_ref,omitempty"`
	Defaults Defaults `json:"defaults,omitzero"`
	// Start is what the build was asked about the start command and
	// ready check (Defaults holds the result); rebuilds ask the same.
	Start *StartOptions `json:"start,omitempty"`
	// Dockerfile is the source of a Dockerfile build ("dockerfile from
	// BASE"), whose layers are all in Shared.
	Dockerfile string `json:"dockerfile,omitempty"`
}

func (s *Store) manifestPath(name string) string {
	return filepath.Join(s.dir(name), "manifest.json")
}

func readManifest(path string) (manifest, error) {
	var m manifest
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("manifest %s: %w", path, err)
	}
	return m, nil
}

// writeManifest replaces path atomically: temp file, fsync, rename.
func writeManifest(path string, m manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write manifest %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// syncFS flushes the whole filesystem holding path: one syncfs is far
// cheaper than an fsync per file of a freshly written tree.
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// validLayerID guards against a manifest naming something outside layers/.
func validLayerID(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\x00") && !strings.HasPrefix(id, ".")
}

// inspect reports what is on disk for name without taking its lock. A
// template counts as built when its manifest is readable, was written for
// this store's uid base, and names layers that all exist.
func (s *Store) inspect(name string) (Template, error) {
	t := Template{Name: name}
	if r, ok := s.recipes[name]; ok {
		t.Description = r.description
		t.Source = "built-in"
	}
	m, err := readManifest(s.manifestPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		s.log.Warn("unreadable template manifest", "template", name, "err", err)
		return t, nil
	}
	if m.Description != "" {
		t.Description = m.Description
	}
	if m.Image != "" {
		t.Source = "image " + m.Image
	}
	if m.Dockerfile != "" {
		t.Source = m.Dockerfile
	}
	if m.Version != manifestVersion || m.Name != name || m.UIDBase != s.cfg.UIDBase || len(m.Layers)+len(m.Shared) == 0 {
		return t, nil
	}
	layers := make([]string, 0, len(m.Layers)+len(m.Shared))
	for _, id := range m.Shared {
		if _, ok := s.sharedLayer(id); !ok {
			return t, nil
		}
		layers = append(layers, s.sharedDir(id))
	}
	for _, id := range m.Layers {
		if !validLayerID(id) {
			return t, nil
		}
		dir := filepath.Join(s.layersDir(name), id)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return t, nil
		}
		layers = append(layers, dir)
	}
	t.Built = true
	t.Isolation = m.Isolation
	t.Defaults = m.Defaults
	t.BuiltAt = m.BuiltAt
	t.BuildID = m.BuildID
	t.SizeBytes = m.SizeBytes
	t.Layers = layers
	return t, nil
}

// buildLocked builds name's recipe into a new layer, installs it, switches
// the manifest to it and prunes what the old manifest pointed at. The
// caller holds name's lock.
func (s *Store) buildLocked(ctx context.Context, name string, log io.Writer) (Template, error) {
	r, ok := s.recipes[name]
	if !ok {
		return Template{}, fmt.Errorf("template %q has no build recipe: %w", name, errdefs.ErrNotFound)
	}
	if log == nil {
		log = io.Discard
	}
	start := time.Now()
	fmt.Fprintf(log, "==> building template %s (uid base %d)\n", name, s.cfg.UIDBase)
	s.log.Info("template build started", "template", name)

	hash, err := r.sourceHash(s)
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	if err := os.MkdirAll(s.layersDir(name), 0o755); err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	// Anything half-made is from a build that died; we hold the lock.
	s.removeTemps(name)

	id := shortHash(hash) + "-" + randHex(4)
	tmp := filepath.Join(s.layersDir(name), ".tmp-"+id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	fail := func(err error) (Template, error) {
		if rerr := os.RemoveAll(tmp); rerr != nil {
			s.log.Warn("remove partial layer", "template", name, "path", tmp, "err", rerr)
		}
		s.log.Info("template build failed", "template", name, "err", err)
		fmt.Fprintf(log, "==> template %s build failed: %v\n", name, err)
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	if err := r.build(ctx, s, tmp, log); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	size, err := DirSize(tmp)
	if err != nil {
		return fail(err)
	}
	// The manifest must not reach the disk before the files it vouches
	// for: flush the layer's filesystem first.
	if err := syncFS(tmp); err != nil {
		return fail(err)
	}
	final := filepath.Join(s.layersDir(name), id)
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	m := manifest{
		Version:     manifestVersion,
		Name:        name,
		Description: r.description,
		Layers:      []string{id},
		BuiltAt:     time.Now().UTC().Truncate(time.Second),
		BuildID:     NewBuildID(),
		SizeBytes:   size,
		SourceHash:  hash,
		UIDBase:     s.cfg.UIDBase,
	}
	if old, err := readManifest(s.manifestPath(name)); err == nil {
		m.Isolation = old.Isolation
	}
	if err := writeManifest(s.manifestPath(name), m); err != nil {
		os.RemoveAll(final)
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	if err := s.pruneLocked(name); err != nil {
		// The new template is in place; a stale layer only costs disk.
		s.log.Warn("prune old template layers", "template", name, "err", err)
	}
	elapsed := time.Since(start)
	s.log.Info("template built", "template", name, "size_bytes", size, "duration", elapsed)
	fmt.Fprintf(log, "==> template %s built in %s (%d MB)\n", name, elapsed.Round(time.Millisecond), size>>20)
	return s.inspect(name)
}

// removeTemps deletes leftovers of interrupted builds of name.
func (s *Store) removeTemps(name string) {
	entries, _ := os.ReadDir(s.layersDir(name))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			p := filepath.Join(s.layersDir(name), e.Name())
			if err := os.RemoveAll(p); err != nil {
				s.log.Warn("remove partial layer", "template", name, "path", p, "err", err)
			}
		}
	}
	os.Remove(s.manifestPath(name) + ".tmp")
}

// pruneLocked removes name's layers that its manifest does not reference,
// unless an overlay mount still uses them (a running sandbox of an older
// build). The caller holds name's lock.
func (s *Store) pruneLocked(name string) error {
	s.removeTemps(name)
	keep := map[string]bool{}
	if m, err := readManifest(s.manifestPath(name)); err == nil {
		for _, id := range m.Layers {
			keep[id] = true
		}
	}
	entries, err := os.ReadDir(s.layersDir(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var stale []string
	for _, e := range entries {
		if e.IsDir() && !keep[e.Name()] && validLayerID(e.Name()) {
			stale = append(stale, filepath.Join(s.layersDir(name), e.Name()))
		}
	}
	if len(stale) == 0 {
		return nil
	}
	mounted := mountOptions()
	var errs []error
	for _, dir := range stale {
		if strings.Contains(mounted, dir) {
			s.log.Info("keeping layer in use by a mount", "template", name, "path", dir)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountOptions returns the mount points and options of every mount
// namespace on the host, concatenated: enough to ask, conservatively,
// whether a path appears as an overlay lower dir anywhere.
func mountOptions() string {
	var b strings.Builder
	seen := map[string]bool{}
	add := func(pid string) {
		ns, err := os.Readlink("/proc/" + pid + "/ns/mnt")
		if err != nil || seen[ns] {
			return
		}
		seen[ns] = true
		f, err := os.Open("/proc/" + pid + "/mountinfo")
		if err != nil {
			return
		}
		defer f.Close()
		mounts, _ := mountinfo.GetMountsFromReader(f, nil)
		for _, m := range mounts {
			// Overlay lower dirs are in the superblock options.
			b.WriteString(m.Mountpoint + " " + m.Root + " " + m.Source + " " + m.VFSOptions + "\n")
		}
	}
	add("self")
	pids, _ := os.ReadDir("/proc")
	for _, p := range pids {
		if p.Name()[0] >= '0' && p.Name()[0] <= '9' {
			add(p.Name())
		}
	}
	return b.String()
}

// flock takes an exclusive flock on path, polling so ctx can stop the wait.
func flock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
