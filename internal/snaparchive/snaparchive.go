// Package snaparchive owns the portable snapshot file (berth snapshot
// export/import) and the portable template file (berth template
// export/import, format TemplateFormat: the same shape, with a template's
// record instead of a snapshot's and never a memory image): a tar whose first entry, manifest.json, describes the
// snapshot and lists its layers with their sizes and SHA-256 digests, and
// whose next entries are those layers, each an OCI-style layer tar, in
// order, then, for a memory snapshot, the files of its memory image
// (memory/<name>, listed in the manifest the same way). Reading validates everything before a caller acts on it: the
// manifest's shape, every entry's name, type, order and size, and every
// layer's digest (a mismatch fails the read, and the caller discards what
// it extracted). Names in the archive are never used as host paths.
package snaparchive

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// Format names this version of the snapshot archive.
const Format = "berth-snapshot/1"

// TemplateFormat names this version of the template archive.
const TemplateFormat = "berth-template/1"

// Bounds of what an archive may hold.
const (
	MaxManifestBytes = 1 << 20
	MaxLayers        = 64
	manifestName     = "manifest.json"
)

// Meta is what a snapshot archive says about the snapshot.
type Meta struct {
	Name        string            `json:"name,omitempty"`
	Source      string            `json:"source,omitempty"`
	Kind        string            `json:"kind"`
	Template    string            `json:"template"`
	Isolation   string            `json:"isolation,omitempty"`
	CPUMillis   int64             `json:"cpu_millis,omitempty"`
	MemoryBytes int64             `json:"memory_bytes,omitempty"`
	DiskBytes   int64             `json:"disk_bytes,omitempty"`
	PidsLimit   int64             `json:"pids_limit,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	User        string            `json:"user,omitempty"`
	// AllowSudo is the source sandbox's allow_sudo. Absent (an archive
	// written before it was kept) is false; a reader that predates it
	// refuses an archive that has it, rather than drop it.
	AllowSudo bool `json:"allow_sudo,omitempty"`
	// Policy is the egress policy as JSON; empty for none.
	Policy json.RawMessage `json:"policy,omitempty"`
	// AgentToken is, for a memory snapshot, the access token its image's
	// agent holds (the image holds it anyway); the importing daemon
	// hands each sandbox made from it a token of its own.
	AgentToken string `json:"agent_token,omitempty"`
	// Volumes are the volumes the source bound, by name (a volume's ID
	// is its daemon's): a sandbox made from the snapshot on the
	// importing daemon binds that daemon's volumes of those names.
	Volumes   []VolumeMount `json:"volumes,omitempty"`
	CreatedAt time.Time     `json:"created_at"`
}

// VolumeMount is one volume a snapshot's source bound.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Layer is one layer's entry in the manifest.
type Layer struct {
	File   string `json:"file"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest is the archive's first entry.
type Manifest struct {
	Format   string `json:"format"`
	Snapshot Meta   `json:"snapshot,omitzero"`
	// Template is a template archive's record, as the template store
	// writes and reads it (the store checks it).
	Template json.RawMessage `json:"template,omitempty"`
	Layers   []Layer         `json:"layers"`
	// Memory lists a memory snapshot's image files (File
	// "memory/<name>"), after the layers.
	Memory []Layer `json:"memory,omitempty"`
}

// MaxMemoryFiles bounds the files of a memory image (runsc writes three).
const MaxMemoryFiles = 8

// memoryName is what a memory image file may be called: a plain name,
// no directory, as runsc names them (checkpoint.img, pages.img, …) and
// as Berth names the egress CA it keeps beside the image
// (berth-egress-ca.pem, berth-egress-ca.key).
var memoryName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}\.(img|pem|key)$`)

// MemoryFile is one file of a memory image, for Write.
type MemoryFile struct {
	Name string
	File *os.File
}

// layerFile is the only name layer i may have.
func layerFile(i int) string { return "layers/" + strconv.Itoa(i) + ".tar" }

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

func bad(format string, a ...any) error {
	return fmt.Errorf("archive: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// ParseManifest decodes and checks a manifest.
func ParseManifest(b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, bad("manifest: %v", err)
	}
	if dec.More() {
		return Manifest{}, bad("manifest: trailing data")
	}
	switch m.Format {
	case Format:
		if m.Snapshot.Template == "" || m.Snapshot.Kind == "" {
			return Manifest{}, bad("manifest names no template or kind")
		}
		if len(m.Template) > 0 {
			return Manifest{}, bad("a snapshot archive with a template record")
		}
	case TemplateFormat:
		if len(m.Template) == 0 || !json.Valid(m.Template) {
			return Manifest{}, bad("manifest has no template record")
		}
		if !reflect.ValueOf(m.Snapshot).IsZero() || len(m.Memory) > 0 {
			return Manifest{}, bad("a template archive with a snapshot record or memory image")
		}
	default:
		return Manifest{}, bad("format %q: this daemon reads %q and %q", m.Format, Format, TemplateFormat)
	}
	if n := len(m.Layers); n < 1 || n > MaxLayers {
		return Manifest{}, bad("%d layers: want 1 to %d", n, MaxLayers)
	}
	for i, l := range m.Layers {
		if l.File != layerFile(i) {
			return Manifest{}, bad("layer %d is %q: want %q", i, l.File, layerFile(i))
		}
		if l.Size < 0 {
			return Manifest{}, bad("layer %d has size %d", i, l.Size)
		}
		if !hexDigest.MatchString(l.SHA256) {
			return Manifest{}, bad("layer %d digest %q is not a SHA-256", i, l.SHA256)
		}
	}
	if len(m.Memory) > MaxMemoryFiles {
		return Manifest{}, bad("%d memory image files: want at most %d", len(m.Memory), MaxMemoryFiles)
	}
	seen := map[string]bool{}
	for i, l := range m.Memory {
		name, ok := strings.CutPrefix(l.File, "memory/")
		if !ok || !memoryName.MatchString(name) || seen[name] {
			return Manifest{}, bad("memory file %d is %q: want memory/<name>.img (or .pem, .key), each once", i, l.File)
		}
		seen[name] = true
		if l.Size < 0 {
			return Manifest{}, bad("memory file %d has size %d", i, l.Size)
		}
		if !hexDigest.MatchString(l.SHA256) {
			return Manifest{}, bad("memory file %d digest %q is not a SHA-256", i, l.SHA256)
		}
	}
	if len(m.Memory) > 0 && !seen["checkpoint.img"] {
		return Manifest{}, bad("a memory image without checkpoint.img")
	}
	if (len(m.Memory) > 0) != (m.Snapshot.AgentToken != "") {
		return Manifest{}, bad("a memory image and its agent token come together")
	}
	return m, nil
}

// Read reads an archive of format want from r: the manifest, then each
// layer in order, handed to layer with its manifest entry as a stream of
// exactly its size, then each memory image
// file, handed to memory by name (checked: a plain name). Once a func
// returns, what it left unread is consumed and the entry's digest
// checked; a mismatch, a misplaced or extra entry, or a short file fails
// the read. A func's error ends the read too.
func Read(r io.Reader, want string, layer func(i int, l Layer, r io.Reader) error, memory func(name string, r io.Reader) error) (Manifest, error) {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return Manifest{}, bad("no manifest: %v", err)
	}
	if hdr.Name != manifestName || hdr.Typeflag != tar.TypeReg {
		return Manifest{}, bad("first entry is %q: want the file %s", hdr.Name, manifestName)
	}
	if hdr.Size > MaxManifestBytes {
		return Manifest{}, bad("manifest is %d bytes, over %d", hdr.Size, MaxManifestBytes)
	}
	b, err := io.ReadAll(io.LimitReader(tr, MaxManifestBytes))
	if err != nil {
		return Manifest{}, bad("read manifest: %v", err)
	}
	m, err := ParseManifest(b)
	if err != nil {
		return Manifest{}, err
	}
	if m.Format != want {
		return Manifest{}, bad("format %q: want %q here", m.Format, want)
	}
	for i, l := range m.Layers {
		if err := readEntry(tr, l, fmt.Sprintf("layer %d (%s)", i, l.File), func(r io.Reader) error { return layer(i, l, r) }); err != nil {
			return m, err
		}
	}
	for _, l := range m.Memory {
		name := strings.TrimPrefix(l.File, "memory/")
		if err := readEntry(tr, l, "memory image file "+l.File, func(r io.Reader) error { return memory(name, r) }); err != nil {
			return m, err
		}
	}
	if hdr, err := tr.Next(); err == nil {
		return m, bad("unexpected entry %q after the last one listed", hdr.Name)
	} else if !errors.Is(err, io.EOF) {
		return m, bad("after the last entry: %v", err)
	}
	return m, nil
}

// readEntry reads the next entry of tr, which must be l (what names it
// in errors), into fn and checks its digest.
func readEntry(tr *tar.Reader, l Layer, what string, fn func(io.Reader) error) error {
	hdr, err := tr.Next()
	if err != nil {
		return bad("%s: %v", what, err)
	}
	if hdr.Name != l.File || hdr.Typeflag != tar.TypeReg {
		return bad("entry %q where the manifest has %s", hdr.Name, l.File)
	}
	if hdr.Size != l.Size {
		return bad("%s is %d bytes, the manifest says %d", l.File, hdr.Size, l.Size)
	}
	h := sha256.New()
	if err := fn(io.TeeReader(tr, h)); err != nil {
		return fmt.Errorf("archive: %s: %w", l.File, err)
	}
	if _, err := io.Copy(h, tr); err != nil {
		return bad("read %s: %v", l.File, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != l.SHA256 {
		return bad("%s has digest %s, the manifest says %s", l.File, got, l.SHA256)
	}
	return nil
}

// Write writes an archive of meta, the layer tars in files (lowest
// first) and the memory image files in memory (a memory snapshot's; each
// file read from its start) to w.
func Write(w io.Writer, meta Meta, files []*os.File, memory []MemoryFile) error {
	return write(w, Manifest{Format: Format, Snapshot: meta}, meta.CreatedAt, files, memory)
}

// WriteTemplate writes a template archive to w: the template store's
// record of it and its layers (each a layer tar in a file, read from its
// start), stamped with modTime.
func WriteTemplate(w io.Writer, record json.RawMessage, modTime time.Time, files []*os.File) error {
	return write(w, Manifest{Format: TemplateFormat, Template: record}, modTime, files, nil)
}

func write(w io.Writer, m Manifest, modTime time.Time, files []*os.File, memory []MemoryFile) error {
	digest := func(f *os.File, name string) (Layer, error) {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return Layer{}, err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return Layer{}, fmt.Errorf("digest %s: %w", name, err)
		}
		return Layer{File: name, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
	}
	for i, f := range files {
		l, err := digest(f, layerFile(i))
		if err != nil {
			return err
		}
		m.Layers = append(m.Layers, l)
	}
	for _, mf := range memory {
		if !memoryName.MatchString(mf.Name) {
			return fmt.Errorf("memory image file %q: not a plain image name", mf.Name)
		}
		l, err := digest(mf.File, "memory/"+mf.Name)
		if err != nil {
			return err
		}
		m.Memory = append(m.Memory, l)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: manifestName, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: modTime}); err != nil {
		return err
	}
	if _, err := tw.Write(b); err != nil {
		return err
	}
	write := func(f *os.File, l Layer) error {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: l.File, Typeflag: tar.TypeReg, Mode: 0o644, Size: l.Size, ModTime: modTime}); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, f, l.Size); err != nil {
			return fmt.Errorf("write %s: %w", l.File, err)
		}
		return nil
	}
	for i, f := range files {
		if err := write(f, m.Layers[i]); err != nil {
			return err
		}
	}
	for i, mf := range memory {
		if err := write(mf.File, m.Memory[i]); err != nil {
			return err
		}
	}
	return tw.Close()
}
