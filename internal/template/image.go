package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// Image templates: a template made of an OCI/Docker image's layers.
//
// Their layers live in one store shared by every image template, keyed by
// chain id (the digest of a layer together with every layer below it, as
// containerd keys snapshots): two images built on the same base share its
// layers on disk. On disk, under DataDir/templates:
//
//	.layers/<chain-hex>/        one extracted layer, owners shifted
//	.layers/<chain-hex>.json    what it is; written last, after a rename
//	                            put the directory in place
//
// A template's manifest names its chain ids (Shared) instead of layers of
// its own. Layers no manifest names are removed by PruneLayers.

// Defaults are what an image says about how to run it; sandboxes of the
// template start with them unless the create request says otherwise.
type Defaults struct {
	// Env is KEY=VALUE pairs (the image's ENV).
	Env []string `json:"env,omitempty"`
	// Workdir is the default working directory (WORKDIR).
	Workdir string `json:"workdir,omitempty"`
	// User is the default user (USER), as the image names it.
	User string `json:"user,omitempty"`
	// Command is the image's ENTRYPOINT followed by CMD. It is the start
	// command only when the build asked for that (StartOptions.FromImage).
	Command []string `json:"command,omitempty"`
	// Start, when set, is the start command (argv): each new sandbox runs
	// it in the background once its agent answers.
	Start []string `json:"start,omitempty"`
	// Ready, when set, is the check that must pass before a new sandbox
	// is ready.
	Ready *ReadyCheck `json:"ready,omitempty"`
}

// Puller resolves image references; internal/imagepull implements it over
// registries. An interface, so that this package (which the sandbox
// Manager imports) links no HTTP.
type Puller interface {
	// Check validates a reference without the network
	// (errdefs.ErrInvalidArgument).
	Check(ref string) error
	// Resolve fetches ref's manifest and config, for linux on the host's
	// architecture. Errors are classified: unknown image ErrNotFound,
	// unreachable registry ErrUnavailable.
	Resolve(ctx context.Context, ref string) (Image, error)
}

// Image is a resolved image.
type Image struct {
	Name     string // full reference, e.g. index.docker.io/library/debian:12
	Digest   string // of the manifest (or manifest list) resolved
	Registry string // the host it comes from (a mirror, or the registry)
	OS       string
	// From the image config.
	Env             []string
	Workdir, User   string
	Entrypoint, Cmd []string
	Layers          []ImageLayer // lowest first
}

// ImageLayer is one layer of a resolved image.
type ImageLayer interface {
	DiffID() string // "sha256:<hex>" of the uncompressed tar
	Size() int64    // compressed, as downloaded
	Open() (io.ReadCloser, error)
}

// CheckImageRef validates an image reference without the network.
func (s *Store) CheckImageRef(ref string) error {
	if s.cfg.Puller == nil {
		return fmt.Errorf("image templates are not configured: %w", errdefs.ErrFailedPrecondition)
	}
	return s.cfg.Puller.Check(ref)
}

// layerMeta describes one shared layer.
type layerMeta struct {
	ChainID   string    `json:"chain_id"`
	DiffID    string    `json:"diff_id"`
	SizeBytes int64     `json:"size_bytes"`
	UIDBase   uint32    `json:"uid_base"`
	Created   time.Time `json:"created"`
}

func (s *Store) sharedRoot() string            { return filepath.Join(s.root(), ".layers") }
func (s *Store) sharedDir(chain string) string { return filepath.Join(s.sharedRoot(), chain) }
func (s *Store) sharedMeta(chain string) string {
	return filepath.Join(s.sharedRoot(), chain+".json")
}

// sharedLayer returns a shared layer's metadata if it is complete and was
// made for this store's uid base.
func (s *Store) sharedLayer(chain string) (layerMeta, bool) {
	if !validLayerID(chain) {
		return layerMeta{}, false
	}
	var m layerMeta
	b, err := os.ReadFile(s.sharedMeta(chain))
	if err != nil || json.Unmarshal(b, &m) != nil || m.UIDBase != s.cfg.UIDBase {
		return layerMeta{}, false
	}
	if fi, err := os.Stat(s.sharedDir(chain)); err != nil || !fi.IsDir() {
		return layerMeta{}, false
	}
	return m, true
}

// chainIDs computes the chain id of each layer from the diff ids, as the
// OCI image spec defines it, hex only.
func chainIDs(diffIDs []string) []string {
	out := make([]string, len(diffIDs))
	prev := ""
	for i, d := range diffIDs {
		if i == 0 {
			prev = d
		} else {
			sum := sha256.Sum256([]byte(prev + " " + d))
			prev = "sha256:" + hex.EncodeToString(sum[:])
		}
		out[i] = strings.TrimPrefix(prev, "sha256:")
	}
	return out
}

// BuildImage builds (or rebuilds) template name from the image ref,
// streaming progress to log. Nothing is written to log until the image's
// manifest is resolved, so a caller can still answer a bad reference or an
// unreachable registry with a plain error. Errors: a bad ref is
// ErrInvalidArgument; a registry that cannot be reached is ErrUnavailable,
// an image it does not have ErrNotFound.
//
// start sets the template's start command and ready check; a rebuild that
// asks for none keeps what the last build recorded.
func (s *Store) BuildImage(ctx context.Context, name, ref string, opts StartOptions, log io.Writer) (Template, error) {
	if err := ValidName(name); err != nil {
		return Template{}, err
	}
	if err := opts.Validate(); err != nil {
		return Template{}, err
	}
	if _, ok := s.recipes[name]; ok {
		return Template{}, fmt.Errorf("template %q is built in and cannot be made from an image: %w", name, errdefs.ErrInvalidArgument)
	}
	if err := s.CheckImageRef(ref); err != nil {
		return Template{}, err
	}
	if log == nil {
		log = io.Discard
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	// Prune must not take layers between their extraction and the
	// manifest that names them.
	s.sharedMu.RLock()
	defer s.sharedMu.RUnlock()

	start := time.Now()
	img, err := s.cfg.Puller.Resolve(ctx, ref)
	if err != nil {
		return Template{}, fmt.Errorf("build template %q from %s: %w", name, ref, err)
	}
	fail := func(err error) (Template, error) {
		s.log.Info("template build failed", "template", name, "image", ref, "err", err)
		fmt.Fprintf(log, "==> template %s build failed: %v\n", name, err)
		return Template{}, fmt.Errorf("build template %q from %s: %w", name, ref, err)
	}
	fmt.Fprintf(log, "==> pulling %s (%s) from %s\n", img.Name, img.Digest, img.Registry)
	s.log.Info("template build started", "template", name, "image", img.Name, "digest", img.Digest)
	if img.OS != "" && img.OS != "linux" {
		return fail(fmt.Errorf("image is for %s, not linux: %w", img.OS, errdefs.ErrFailedPrecondition))
	}
	if len(img.Layers) == 0 {
		return fail(fmt.Errorf("image has no layers: %w", errdefs.ErrFailedPrecondition))
	}
	diffIDs := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		diffIDs[i] = l.DiffID()
		if hx, ok := strings.CutPrefix(diffIDs[i], "sha256:"); !ok || len(hx) != 64 || strings.Trim(hx, "0123456789abcdef") != "" {
			return fail(fmt.Errorf("layer diff id %q is not a sha256 digest: %w", diffIDs[i], errdefs.ErrFailedPrecondition))
		}
	}
	chains := chainIDs(diffIDs)
	if err := os.MkdirAll(s.sharedRoot(), 0o755); err != nil {
		return fail(err)
	}
	var size int64
	for i, l := range img.Layers {
		m, err := s.ensureLayer(ctx, l, chains[:i+1], i, len(img.Layers), log)
		if err != nil {
			return fail(err)
		}
		size += m.SizeBytes
	}
	if opts.IsZero() {
		if old, err := readManifest(s.manifestPath(name)); err == nil && old.Start != nil {
			opts = *old.Start
		}
	}
	defaults := imageDefaults(img)
	if err := opts.apply(&defaults, defaults.Command); err != nil {
		return fail(err)
	}
	if defaults.User != "" {
		dirs := make([]string, 0, len(chains))
		for j := len(chains) - 1; j >= 0; j-- {
			dirs = append(dirs, s.sharedDir(chains[j]))
		}
		user, ok := resolveUser(defaults.User, dirs)
		if !ok {
			fmt.Fprintf(log, "warning: USER %q is not in the image's /etc/passwd; sandboxes run as root unless a create names a user\n", defaults.User)
		}
		defaults.User = user
	}
	src := img.Name
	if !strings.Contains(src, "@") {
		src += "@" + img.Digest
	}
	m := manifest{
		Version:     manifestVersion,
		Name:        name,
		Description: "from image " + img.Name,
		Shared:      chains,
		BuiltAt:     time.Now().UTC().Truncate(time.Second),
		BuildID:     NewBuildID(),
		SizeBytes:   size,
		SourceHash:  img.Digest,
		UIDBase:     s.cfg.UIDBase,
		Image:       src,
		ImageRef:    img.Name,
		Defaults:    defaults,
	}
	if !opts.IsZero() {
		m.Start = &opts
	}
	if err := os.MkdirAll(s.dir(name), 0o755); err != nil {
		return fail(err)
	}
	if err := writeManifest(s.manifestPath(name), m); err != nil {
		return fail(err)
	}
	// A template that was a built-in-style build before keeps no layers
	// of its own now.
	if err := s.pruneLocked(name); err != nil {
		s.log.Warn("prune old template layers", "template", name, "err", err)
	}
	elapsed := time.Since(start)
	s.log.Info("template built", "template", name, "image", src, "size_bytes", size, "duration", elapsed)
	fmt.Fprintf(log, "==> template %s built from %s in %s (%d layers, %d MB)\n", name, src, elapsed.Round(time.Millisecond), len(chains), size>>20)
	return s.inspect(name)
}

// ensureLayer makes the shared layer chain[len-1] present: already stored,
// or downloaded and extracted on top of the layers below it.
func (s *Store) ensureLayer(ctx context.Context, l ImageLayer, chain []string, i, n int, log io.Writer) (layerMeta, error) {
	id := chain[len(chain)-1]
	diffID := l.DiffID()
	diffHex := strings.TrimPrefix(diffID, "sha256:")
	short := diffHex[:12]
	if m, ok := s.sharedLayer(id); ok {
		fmt.Fprintf(log, "layer %d/%d %s: already stored\n", i+1, n, short)
		return m, nil
	}
	// One extraction per layer, also across templates built at once.
	unlock, err := s.lock(ctx, "layer-"+id[:32])
	if err != nil {
		return layerMeta{}, err
	}
	defer unlock()
	if m, ok := s.sharedLayer(id); ok {
		fmt.Fprintf(log, "layer %d/%d %s: already stored\n", i+1, n, short)
		return m, nil
	}
	// Whatever is there is from another uid base or a build that died.
	os.Remove(s.sharedMeta(id))
	if err := os.RemoveAll(s.sharedDir(id)); err != nil {
		return layerMeta{}, err
	}
	lowers := make([]string, 0, len(chain)-1)
	for j := len(chain) - 2; j >= 0; j-- {
		lowers = append(lowers, s.sharedDir(chain[j]))
	}
	fmt.Fprintf(log, "layer %d/%d %s: pulling (%s compressed)\n", i+1, n, short, humanSize(l.Size()))
	start := time.Now()
	tmp := filepath.Join(s.sharedRoot(), ".tmp-"+id[:32]+"-"+randHex(4))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return layerMeta{}, err
	}
	cleanup := func(err error) (layerMeta, error) {
		if rerr := os.RemoveAll(tmp); rerr != nil {
			s.log.Warn("remove partial layer", "path", tmp, "err", rerr)
		}
		return layerMeta{}, err
	}
	rc, err := l.Open()
	if err != nil {
		return cleanup(err)
	}
	// The hash of what was extracted must be the diff id the image's
	// config promised: a registry cannot slip in other content.
	h := sha256.New()
	st, err := extractLayer(ctx, io.TeeReader(rc, h), tmp, s.cfg.UIDBase, lowers)
	if err == nil {
		// Drain what tar leaves after its end marker: it is hashed too.
		_, err = io.Copy(h, rc)
	}
	if cerr := rc.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return cleanup(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != diffHex {
		return cleanup(fmt.Errorf("layer %s: content hashes to sha256:%s: %w", diffID, got, errdefs.ErrFailedPrecondition))
	}
	if err := syncFS(tmp); err != nil {
		return cleanup(err)
	}
	if err := os.Rename(tmp, s.sharedDir(id)); err != nil {
		return cleanup(err)
	}
	m := layerMeta{ChainID: "sha256:" + id, DiffID: diffID, SizeBytes: st.Bytes, UIDBase: s.cfg.UIDBase, Created: time.Now().UTC()}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeFileAtomic(s.sharedMeta(id), b); err != nil {
		return layerMeta{}, err
	}
	msg := fmt.Sprintf("layer %d/%d %s: %d files, %s, in %s", i+1, n, short, st.Files, humanSize(st.Bytes), time.Since(start).Round(time.Millisecond))
	if st.Remapped > 0 {
		msg += fmt.Sprintf(" (%d entries owned beyond uid %d now belong to nobody)", st.Remapped, maxInnerID)
	}
	fmt.Fprintln(log, msg)
	return m, nil
}

// imageDefaults takes what a sandbox should inherit from an image config.
func imageDefaults(c Image) Defaults {
	d := Defaults{Env: slices.Clone(c.Env), Workdir: c.Workdir, User: c.User}
	if d.Workdir == "" {
		d.Workdir = "/" // as Docker runs an image without WORKDIR
	}
	d.Command = append(slices.Clone(c.Entrypoint), c.Cmd...)
	return d
}

// PruneLayers removes shared layers that no template's manifest names, and
// leftovers of interrupted pulls. It returns how many layers it removed
// and the bytes they held. Callers make sure no sandbox runs on a layer of
// an older build (the API refuses while one might).
func (s *Store) PruneLayers(ctx context.Context) (int, int64, error) {
	s.sharedMu.Lock()
	defer s.sharedMu.Unlock()
	keep := map[string]bool{}
	entries, err := os.ReadDir(s.root())
	if err != nil {
		return 0, 0, fmt.Errorf("prune layers: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || ValidName(e.Name()) != nil {
			continue
		}
		m, err := readManifest(s.manifestPath(e.Name()))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return 0, 0, fmt.Errorf("prune layers: %w", err)
			}
			continue
		}
		for _, c := range m.Shared {
			keep[c] = true
		}
	}
	layers, err := os.ReadDir(s.sharedRoot())
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("prune layers: %w", err)
	}
	var (
		n     int
		freed int64
		errs  []error
	)
	for _, e := range layers {
		if err := ctx.Err(); err != nil {
			return n, freed, err
		}
		name := e.Name()
		p := filepath.Join(s.sharedRoot(), name)
		switch {
		case strings.HasPrefix(name, ".tmp-"):
			errs = append(errs, os.RemoveAll(p))
		case e.IsDir() && !keep[name] && validLayerID(name):
			if m, ok := s.sharedLayer(name); ok {
				freed += m.SizeBytes
			}
			os.Remove(s.sharedMeta(name))
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
			s.log.Info("pruned template layer", "chain_id", name)
		case !e.IsDir() && strings.HasSuffix(name, ".json"):
			if id := strings.TrimSuffix(name, ".json"); !keep[id] {
				if _, err := os.Stat(s.sharedDir(id)); errors.Is(err, fs.ErrNotExist) {
					os.Remove(p) // metadata of a layer that is gone
				}
			}
		}
	}
	return n, freed, errors.Join(errs...)
}

// Remove deletes a template that is not built in: its manifest first (so
// it stops being usable at once), then its directory. Shared layers stay
// until PruneLayers. Callers check that no sandbox uses it.
func (s *Store) Remove(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if _, ok := s.recipes[name]; ok {
		return fmt.Errorf("template %q is built in and cannot be removed: %w", name, errdefs.ErrFailedPrecondition)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(s.dir(name)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	if err := os.Remove(s.manifestPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	if err := os.RemoveAll(s.dir(name)); err != nil {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	s.log.Info("template removed", "template", name)
	return nil
}

// resolveUser turns an image's USER ("name", "uid", "name:group",
// "uid:gid") into the account name the agent looks up, from the topmost
// /etc/passwd among layers (topmost first). It reports false, with "", when
// the image has no such account.
func resolveUser(user string, layers []string) (string, bool) {
	who, _, _ := strings.Cut(user, ":")
	if who == "" {
		return "", false
	}
	for _, dir := range layers {
		root, err := os.OpenRoot(dir)
		if err != nil {
			continue
		}
		b, err := root.ReadFile("etc/passwd")
		root.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) >= 3 && (f[0] == who || f[2] == who) {
				return f[0], true
			}
		}
		return "", false
	}
	return "", false
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
