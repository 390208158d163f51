package template

import (
	"bytes"
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
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/snaparchive"
)

// Portable templates: a template made from an image, build steps or a
// Dockerfile is written as a snaparchive of format TemplateFormat (its
// record and each of its layers, owned by the canonical range), and read
// on another daemon into a template of the same files, owned by that
// daemon's uid base. The importing daemon needs no registry, no network
// and no build: a cluster's nodes get the same bits, where rebuilding
// from a tag could pull another image.
//
// An imported layer is stored under an id derived from the digests of its
// own tar and of the layers below it ("berth-import" chain), never under
// the chain id the exporter used: an archive cannot plant content under an
// id a later image pull would take as already stored. Two imports of the
// same layers share them.

// archiveRecord is the template's record in the archive.
type archiveRecord struct {
	Name        string        `json:"name"`
	Description string        `json:"description,omitempty"`
	BuiltAt     time.Time     `json:"built_at"`
	BuildID     string        `json:"build_id,omitempty"`
	SourceHash  string        `json:"source_hash,omitempty"`
	Isolation   string        `json:"isolation,omitempty"`
	Image       string        `json:"image,omitempty"`
	ImageRef    string        `json:"image_ref,omitempty"`
	Dockerfile  string        `json:"dockerfile,omitempty"`
	Defaults    Defaults      `json:"defaults,omitzero"`
	Start       *StartOptions `json:"start,omitempty"`
}

// maxArchiveText bounds each text field of a record.
const maxArchiveText = 4096

func (r archiveRecord) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("template archive: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if err := ValidName(r.Name); err != nil {
		return bad("name: %v", err)
	}
	for field, v := range map[string]string{"description": r.Description, "source_hash": r.SourceHash, "image": r.Image,
		"image_ref": r.ImageRef, "dockerfile": r.Dockerfile, "workdir": r.Defaults.Workdir, "user": r.Defaults.User} {
		if len(v) > maxArchiveText || strings.ContainsRune(v, 0) {
			return bad("%s is over %d bytes or holds a NUL", field, maxArchiveText)
		}
	}
	if r.BuildID != "" && !ValidBuildID(r.BuildID) {
		return bad("build_id %q: want 32 lowercase hex digits", r.BuildID)
	}
	if r.Isolation != "" && !slices.Contains(core.Isolations(), r.Isolation) {
		return bad("isolation %q: want one of %s or none", r.Isolation, strings.Join(core.Isolations(), ", "))
	}
	if r.Start != nil {
		if err := r.Start.Validate(); err != nil {
			return bad("start: %v", err)
		}
	}
	if r.Defaults.Ready != nil {
		if err := r.Defaults.Ready.Validate(); err != nil {
			return bad("ready: %v", err)
		}
	}
	return nil
}

// Export writes template name as a template archive to w. Built-in
// templates are refused (every daemon builds its own). Nothing is written
// to w before every layer is packed, so an error until then can still be
// answered plainly.
func (s *Store) Export(ctx context.Context, name string, w io.Writer) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if _, ok := s.recipes[name]; ok {
		return fmt.Errorf("template %q is built in: every daemon builds its own (berth template build %s): %w", name, name, errdefs.ErrFailedPrecondition)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	s.sharedMu.RLock()
	defer s.sharedMu.RUnlock()
	t, err := s.inspect(name)
	if err != nil {
		return err
	}
	m, merr := readManifest(s.manifestPath(name))
	switch {
	case errors.Is(merr, fs.ErrNotExist):
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	case merr != nil || !t.Built:
		return fmt.Errorf("template %q is not usable here (damaged, or built for another uid base): %w", name, errdefs.ErrFailedPrecondition)
	case len(m.Layers) > 0 || len(m.Shared) == 0 || len(m.Shared) > snaparchive.MaxLayers:
		return fmt.Errorf("template %q has %d layers of its own and %d shared: an archive holds 1 to %d shared layers: %w",
			name, len(m.Layers), len(m.Shared), snaparchive.MaxLayers, errdefs.ErrFailedPrecondition)
	}
	rec, err := json.Marshal(archiveRecord{
		Name: m.Name, Description: m.Description, BuiltAt: m.BuiltAt, BuildID: m.BuildID, SourceHash: m.SourceHash, Isolation: m.Isolation,
		Image: m.Image, ImageRef: m.ImageRef, Dockerfile: m.Dockerfile, Defaults: m.Defaults, Start: m.Start,
	})
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.root(), ".export-")
	if err != nil {
		return fmt.Errorf("export template %q: %w", name, err)
	}
	defer os.RemoveAll(tmp)
	files := make([]*os.File, 0, len(m.Shared))
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for i, id := range m.Shared {
		f, err := os.Create(filepath.Join(tmp, fmt.Sprintf("%d.tar", i)))
		if err != nil {
			return fmt.Errorf("export template %q: %w", name, err)
		}
		files = append(files, f)
		if err := s.ExportLayer(ctx, s.sharedDir(id), f); err != nil {
			return fmt.Errorf("export template %q: layer %d: %w", name, i, err)
		}
	}
	return snaparchive.WriteTemplate(w, rec, m.BuiltAt, files)
}

// importedLayerID is the id an imported layer is stored under: a chain of
// the archive's layer digests, lowest first.
func importedLayerID(below, digest string) string {
	sum := sha256.Sum256([]byte("berth-import " + below + " " + digest))
	return hex.EncodeToString(sum[:])
}

// Import reads a template archive from r into a new template, named as in
// the archive or as name when that is set. A name that exists (built in,
// or any template this daemon has) is ErrAlreadyExists; a damaged or
// foreign archive is ErrInvalidArgument. Nothing is left behind on an
// error but layers another template shares.
func (s *Store) Import(ctx context.Context, r io.Reader, name string) (Template, error) {
	return s.importArchive(ctx, r, name, false)
}

// ImportOver is Import that replaces a template of the name this daemon
// has (not a built-in one), as a rebuild does: sandboxes made from the
// old one keep its layers, the next ones get the archive's.
func (s *Store) ImportOver(ctx context.Context, r io.Reader, name string) (Template, error) {
	return s.importArchive(ctx, r, name, true)
}

func (s *Store) importArchive(ctx context.Context, r io.Reader, name string, replace bool) (Template, error) {
	if name != "" {
		if err := ValidName(name); err != nil {
			return Template{}, err
		}
	}
	// The archive is read into a directory of its own, outside the
	// layer store, with no lock held (an upload may take long); the
	// layers move into the store under the template's lock and the
	// store's shared lock, taken in the order a build takes them.
	work, err := os.MkdirTemp(s.root(), ".import-")
	if err != nil {
		return Template{}, fmt.Errorf("import template: %w", err)
	}
	defer os.RemoveAll(work)
	var (
		ids     []string         // each layer's id, lowest first
		newHere = map[int]bool{} // layers extracted under work/<i>
		size    int64
	)
	man, err := snaparchive.Read(r, snaparchive.TemplateFormat, func(i int, l snaparchive.Layer, lr io.Reader) error {
		below := ""
		if i > 0 {
			below = ids[i-1]
		}
		id := importedLayerID(below, l.SHA256)
		ids = append(ids, id)
		if m, ok := s.sharedLayer(id); ok {
			size += m.SizeBytes
			return nil // stored already; Read still checks the digest
		}
		newHere[i] = true
		n, err := s.ImportLayer(ctx, lr, filepath.Join(work, fmt.Sprint(i)))
		size += n
		return err
	}, nil)
	if err != nil {
		return Template{}, fmt.Errorf("import template: %w", err)
	}
	var rec archiveRecord
	dec := json.NewDecoder(bytes.NewReader(man.Template))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return Template{}, fmt.Errorf("import template: record: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := rec.check(); err != nil {
		return Template{}, err
	}
	if name == "" {
		name = rec.Name
	}
	if _, ok := s.recipes[name]; ok {
		return Template{}, fmt.Errorf("template %q is built in here: import it under another name: %w", name, errdefs.ErrAlreadyExists)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	s.sharedMu.RLock()
	defer s.sharedMu.RUnlock()
	_, err = os.Lstat(s.dir(name))
	existed := err == nil
	if existed && !replace {
		return Template{}, fmt.Errorf("template %q exists: remove it first or import under another name: %w", name, errdefs.ErrAlreadyExists)
	}
	if err := os.MkdirAll(s.sharedRoot(), 0o755); err != nil {
		return Template{}, fmt.Errorf("import template: %w", err)
	}
	for i, id := range ids {
		if !newHere[i] {
			// Found stored while the archive was read; a prune since
			// may have taken it.
			if _, ok := s.sharedLayer(id); !ok {
				return Template{}, fmt.Errorf("import template %q: layer %d was pruned while the archive was read; import again: %w", name, i, errdefs.ErrUnavailable)
			}
			continue
		}
		if err := s.putImportedLayer(ctx, id, filepath.Join(work, fmt.Sprint(i))); err != nil {
			return Template{}, fmt.Errorf("import template %q: %w", name, err)
		}
	}
	m := manifest{
		Version: manifestVersion, Name: name, Description: rec.Description, Shared: ids,
		BuiltAt: rec.BuiltAt.UTC().Truncate(time.Second), BuildID: rec.BuildID, SizeBytes: size, SourceHash: rec.SourceHash,
		UIDBase: s.cfg.UIDBase, Isolation: rec.Isolation, Image: rec.Image, ImageRef: rec.ImageRef,
		Defaults: rec.Defaults, Start: rec.Start, Dockerfile: rec.Dockerfile,
	}
	if m.BuiltAt.IsZero() {
		m.BuiltAt = time.Now().UTC().Truncate(time.Second)
	}
	if m.BuildID == "" {
		// An archive from before build IDs: a build of its own here.
		m.BuildID = NewBuildID()
	}
	if !existed {
		if err := os.Mkdir(s.dir(name), 0o755); err != nil {
			return Template{}, fmt.Errorf("import template %q: %w", name, err)
		}
	}
	if err := writeManifest(s.manifestPath(name), m); err != nil {
		if !existed {
			os.RemoveAll(s.dir(name))
		}
		return Template{}, fmt.Errorf("import template %q: %w", name, err)
	}
	if existed {
		// Layers of its own an earlier build left are no longer its.
		if err := s.pruneLocked(name); err != nil {
			s.log.Warn("prune old template layers", "template", name, "err", err)
		}
	}
	s.log.Info("template imported", "template", name, "layers", len(ids), "new_layers", len(newHere), "size_bytes", size)
	return s.inspect(name)
}

// putImportedLayer moves an extracted layer to its id, unless an import
// that ran at the same time stored it first.
func (s *Store) putImportedLayer(ctx context.Context, id, dir string) error {
	unlock, err := s.lock(ctx, "layer-"+id[:32])
	if err != nil {
		return err
	}
	defer unlock()
	if _, ok := s.sharedLayer(id); ok {
		return nil
	}
	os.Remove(s.sharedMeta(id))
	if err := os.RemoveAll(s.sharedDir(id)); err != nil {
		return err
	}
	n, err := DirSize(dir)
	if err != nil {
		return err
	}
	if err := os.Rename(dir, s.sharedDir(id)); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(layerMeta{ChainID: "berth-import:" + id, SizeBytes: n, UIDBase: s.cfg.UIDBase, Created: time.Now().UTC()}, "", "  ")
	return writeFileAtomic(s.sharedMeta(id), b)
}
