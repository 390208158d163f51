package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/snaparchive"
)

// Portable snapshots: a snapshot's own layers (every layer it stacks on
// its template's: those of the snapshots it was made from, and its own)
// and its record, written as a snaparchive; imported on another daemon on
// top of that daemon's template of the same name. An import is written
// under <id>.partial, checked (every digest, every path), and renamed and
// recorded only when whole.

// ExportSnapshot writes snapshot id as an archive to w.
func (m *Manager) ExportSnapshot(ctx context.Context, id string, w io.Writer) error {
	s, err := m.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	ls, err := m.layerStore()
	if err != nil {
		return err
	}
	tpl, err := m.deps.Templates.Get(ctx, s.Template)
	if err != nil {
		return fmt.Errorf("export snapshot %s: template %s: %w", id, s.Template, err)
	}
	n := len(tpl.Layers)
	if len(s.BaseLayers) < n || !slices.Equal(s.BaseLayers[:n], tpl.Layers) {
		return fmt.Errorf("export snapshot %s: template %s was rebuilt since it was taken, so its base is gone: %w", id, s.Template, errdefs.ErrFailedPrecondition)
	}
	own := append(slices.Clone(s.BaseLayers[n:]), m.snapshotLayer(id))
	tmp, err := os.MkdirTemp(m.cfg.SnapshotDir, ".export-")
	if err != nil {
		return fmt.Errorf("export snapshot %s: %w", id, err)
	}
	defer os.RemoveAll(tmp)
	files := make([]*os.File, 0, len(own))
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for i, l := range own {
		f, err := os.Create(filepath.Join(tmp, strconv.Itoa(i)+".tar"))
		if err != nil {
			return fmt.Errorf("export snapshot %s: %w", id, err)
		}
		files = append(files, f)
		if err := ls.ExportLayer(ctx, l, f); err != nil {
			return fmt.Errorf("export snapshot %s: %w", id, err)
		}
	}
	// A memory snapshot's image travels too, with the token its agent
	// holds (the image holds it anyway: the archive is as secret as the
	// sandbox's memory).
	var memory []snaparchive.MemoryFile
	if s.Kind == core.SnapshotMemory {
		dir := m.snapshotMemoryIn(m.snapshotDir(id))
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("export snapshot %s: memory image: %w", id, err)
		}
		for _, ent := range ents {
			if !ent.Type().IsRegular() {
				continue
			}
			f, err := os.Open(filepath.Join(dir, ent.Name()))
			if err != nil {
				return fmt.Errorf("export snapshot %s: memory image: %w", id, err)
			}
			files = append(files, f) // closed with the layers
			memory = append(memory, snaparchive.MemoryFile{Name: ent.Name(), File: f})
		}
	}
	meta := snaparchive.Meta{
		Name: s.Name, Source: s.Source, Kind: s.Kind, Template: s.Template, Isolation: s.Isolation,
		CPUMillis: s.CPUMillis, MemoryBytes: s.MemoryBytes, DiskBytes: s.DiskBytes, PidsLimit: s.PidsLimit,
		Env: s.Env, Labels: s.Labels, User: s.User, AllowSudo: s.AllowSudo, CreatedAt: s.CreatedAt,
	}
	if s.Policy != "" {
		meta.Policy = json.RawMessage(s.Policy)
	}
	if s.Kind == core.SnapshotMemory {
		meta.AgentToken = s.AgentToken
	}
	for _, v := range s.Volumes {
		meta.Volumes = append(meta.Volumes, snaparchive.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return snaparchive.Write(w, meta, files[:len(own)], memory)
}

// ImportSnapshot reads an archive from r into a new snapshot owned by
// owner, with labels set over the archive's (a Berth node marks the
// snapshots it imports as its own this way), under id (the Kubernetes
// gateway keeps a snapshot's copies on several nodes under one ID) or,
// when id is empty, a new one. An id this daemon has is already_exists.
func (m *Manager) ImportSnapshot(ctx context.Context, r io.Reader, owner string, labels map[string]string, id string) (core.Snapshot, error) {
	if id != "" {
		if err := types.ValidSandboxID(id); err != nil {
			return core.Snapshot{}, &FieldError{Field: "id", Err: fmt.Errorf("import snapshot: %w", err)}
		}
	}
	ss, err := m.snapStore()
	if err != nil {
		return core.Snapshot{}, err
	}
	ls, err := m.layerStore()
	if err != nil {
		return core.Snapshot{}, err
	}
	if err := os.MkdirAll(m.cfg.SnapshotDir, 0o755); err != nil {
		return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
	}
	ctx = context.WithoutCancel(ctx)
	if id == "" {
		id = newID()
	} else if _, err := ss.GetSnapshot(ctx, id); err == nil {
		return core.Snapshot{}, &FieldError{Field: "id", Err: fmt.Errorf("import snapshot: snapshot %s exists: %w", id, errdefs.ErrAlreadyExists)}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
	}
	partial := m.snapshotDir(id) + ".partial"
	if err := os.Mkdir(partial, 0o755); errors.Is(err, fs.ErrExist) {
		return core.Snapshot{}, &FieldError{Field: "id", Err: fmt.Errorf("import snapshot: snapshot %s is being imported: %w", id, errdefs.ErrAlreadyExists)}
	} else if err != nil {
		return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(partial) // the error returned says why
		}
	}()
	var size int64
	var last int
	man, err := snaparchive.Read(r, snaparchive.Format, func(i int, _ snaparchive.Layer, lr io.Reader) error {
		// Every layer but the last is a base layer under base/<i>.
		dst := filepath.Join(partial, "base", strconv.Itoa(i))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		n, err := ls.ImportLayer(ctx, lr, dst)
		size += n
		last = i
		return err
	}, func(name string, r io.Reader) error {
		// A plain name (snaparchive checked it), under memory/.
		dir := m.snapshotMemoryIn(partial)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		size += n
		return errors.Join(err, f.Close())
	})
	if err != nil {
		return core.Snapshot{}, &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: %w", err)}
	}
	meta := man.Snapshot
	tpl, err := m.deps.Templates.Get(ctx, meta.Template)
	if err != nil {
		return core.Snapshot{}, &FieldError{Field: "template", Err: fmt.Errorf("import snapshot: it sits on template %q, which this daemon lacks (build or create it first): %w", meta.Template, err)}
	}
	kind, token := meta.Kind, meta.AgentToken
	switch {
	case kind == core.SnapshotFilesystem && len(man.Memory) == 0:
	case kind == core.SnapshotMemory && len(man.Memory) > 0:
		// Where this daemon cannot start sandboxes from a memory image
		// (no gVisor, or an older runsc), the files still make a
		// snapshot; the record says it keeps files only.
		if mc, ok := m.rts[meta.Isolation].(MemoryCopier); !ok || !mc.CopiesMemory() {
			if err := os.RemoveAll(m.snapshotMemoryIn(partial)); err != nil {
				return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
			}
			m.log.Warn("snapshot_import_memory_dropped", "isolation", meta.Isolation, "why", "this daemon's runtime cannot start a sandbox from a memory image")
			kind, token = core.SnapshotFilesystem, ""
		}
	default:
		return core.Snapshot{}, &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: kind %q with %d memory image files: want filesystem without, or memory with: %w", meta.Kind, len(man.Memory), errdefs.ErrInvalidArgument)}
	}
	if err := os.Rename(filepath.Join(partial, "base", strconv.Itoa(last)), filepath.Join(partial, "layer")); err != nil {
		return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
	}
	base := slices.Clone(tpl.Layers)
	for i := range last {
		base = append(base, filepath.Join(m.snapshotDir(id), "base", strconv.Itoa(i)))
	}
	rec := core.Snapshot{
		ID: id, Name: meta.Name, Source: meta.Source, Kind: kind, AgentToken: token, Template: tpl.Name, Isolation: meta.Isolation, Owner: owner,
		CPUMillis: meta.CPUMillis, MemoryBytes: meta.MemoryBytes, DiskBytes: meta.DiskBytes, PidsLimit: meta.PidsLimit,
		Env: meta.Env, Labels: merged(meta.Labels, labels), User: meta.User, AllowSudo: meta.AllowSudo, Policy: string(meta.Policy),
		BaseLayers: base, SizeBytes: size, CreatedAt: time.Now().UTC(),
	}
	for _, v := range meta.Volumes {
		// By name only: the importing key's volume of that name.
		rec.Volumes = append(rec.Volumes, core.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	if err := m.checkImported(rec); err != nil {
		return core.Snapshot{}, err
	}
	if err := os.Rename(partial, m.snapshotDir(id)); err != nil {
		return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
	}
	keep = true
	err = syncDir(m.cfg.SnapshotDir)
	if err == nil {
		err = ss.PutSnapshot(ctx, rec)
	}
	if err != nil {
		_ = os.RemoveAll(m.snapshotDir(id)) // not recorded: never used
		return core.Snapshot{}, fmt.Errorf("import snapshot: %w", err)
	}
	m.log.Info("snapshot_imported", "snapshot_id", id, "size_bytes", size, "layers", last+1)
	return rec, nil
}

// checkImported holds an imported record to what a create accepts, so a
// bad archive is refused at import rather than at its first use.
func (m *Manager) checkImported(rec core.Snapshot) error {
	req := CreateRequest{
		Template: rec.Template, Env: rec.Env, Labels: rec.Labels, User: rec.User,
		Limits: Limits{CPUMillis: rec.CPUMillis, MemoryBytes: rec.MemoryBytes, DiskBytes: rec.DiskBytes, PidsLimit: rec.PidsLimit},
	}
	if err := m.validate(&req); err != nil {
		return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: %w", err)}
	}
	if rec.Policy != "" {
		var p policy.Policy
		if err := json.Unmarshal([]byte(rec.Policy), &p); err != nil {
			return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: policy: %v: %w", err, errdefs.ErrInvalidArgument)}
		}
		if err := p.Validate(); err != nil {
			return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: policy: %w", err)}
		}
	}
	if rec.Isolation != "" && rec.Isolation != core.IsolationRunc && rec.Isolation != core.IsolationGVisor {
		return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: isolation %q: %w", rec.Isolation, errdefs.ErrInvalidArgument)}
	}
	if len(rec.Volumes) > MaxVolumeMounts {
		return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: %d volumes, at most %d: %w", len(rec.Volumes), MaxVolumeMounts, errdefs.ErrInvalidArgument)}
	}
	for _, v := range rec.Volumes {
		if !volumeName.MatchString(v.Name) {
			return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: volume name %q: %w", v.Name, errdefs.ErrInvalidArgument)}
		}
		if err := runtime.CheckMountDestination(v.Path); err != nil {
			return &FieldError{Field: "file", Err: fmt.Errorf("import snapshot: volume %s: %w: %w", v.Name, err, errdefs.ErrInvalidArgument)}
		}
	}
	return nil
}
