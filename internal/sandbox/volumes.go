package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/units"
)

// Volumes are named, size-capped filesystems that outlive sandboxes: a
// sandbox made with one binds it at a path of its own, read-write or
// read-only; several sandboxes may bind one volume at once and see each
// other's writes. The Manager keeps their records (the store) and which
// sandboxes use them; VolumeDisks keeps their disks. A volume is its
// owner's (the API key that made it): only sandboxes of the same owner
// bind it. It cannot be deleted while a sandbox that binds it exists
// (creating, running or paused); a snapshot or fork of such a sandbox
// binds the same volumes.

// VolumeDisks keeps volumes' filesystems (internal/volume).
type VolumeDisks interface {
	// Make makes volume id's disk of size bytes.
	Make(ctx context.Context, id string, size int64) error
	// Mount mounts it on the host until release; a runtime binds it
	// into a sandbox from root.
	Mount(ctx context.Context, id string) (root string, release func(), err error)
	// Remove deletes its disk; refused (ErrFailedPrecondition) while it
	// is mounted anywhere.
	Remove(ctx context.Context, id string) error
	// IDs lists the volumes with a disk.
	IDs() ([]string, error)
	// Used reports how many bytes its files take.
	Used(ctx context.Context, id string) (int64, error)
}

// VolumeRequest binds a volume into a new sandbox (CreateRequest.Volumes).
type VolumeRequest struct {
	// Volume is the volume's ID or its name (among the owner's).
	Volume   string
	Path     string
	ReadOnly bool
}

// Bounds of volumes.
const (
	// MaxVolumeMounts is how many volumes one sandbox may bind.
	MaxVolumeMounts = 16
	// MinVolumeBytes is the smallest volume: ext4 with a journal needs
	// room of its own.
	MinVolumeBytes = 16 << 20
	// DefaultVolumeBytes and MaxVolumeBytes apply when the config sets
	// none.
	DefaultVolumeBytes = 10 << 30
	MaxVolumeBytes     = 1 << 40
)

// volumeName is what a volume may be called: E2B's names and paths-safe
// ones alike.
var volumeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// volumeState is the Manager's hold on volumes: creates binding one hold
// it for reading from the moment they resolve it until their record is
// live; a delete holds it for writing, so it never misses a sandbox on
// its way in.
type volumeState struct {
	mu sync.RWMutex
}

func (m *Manager) volumes() (core.VolumeStore, VolumeDisks, error) {
	vs, ok := m.deps.Store.(core.VolumeStore)
	if !ok || m.deps.Volumes == nil {
		return nil, nil, fmt.Errorf("volumes: this daemon keeps none: %w", errdefs.ErrNotImplemented)
	}
	return vs, m.deps.Volumes, nil
}

// newVolumeID returns a fresh volume ID: "vol" and 20 base-32 digits.
func newVolumeID() string {
	return "vol" + strings.ToLower(rand.Text()[:20])
}

// CreateVolume makes a volume called name of size bytes (0: the default)
// for owner, whose volumes may hold maxBytes together (0: unbounded; the
// key's quota).
func (m *Manager) CreateVolume(ctx context.Context, owner, name string, size, maxBytes int64) (core.Volume, error) {
	vs, disks, err := m.volumes()
	if err != nil {
		return core.Volume{}, err
	}
	if !volumeName.MatchString(name) {
		return core.Volume{}, &FieldError{Field: "name", Err: fmt.Errorf("name %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)}
	}
	if size == 0 {
		size = m.cfg.VolumeBytes
	}
	if size < MinVolumeBytes || size > m.cfg.MaxVolumeBytes {
		return core.Volume{}, &FieldError{Field: "size_bytes", Err: fmt.Errorf("size_bytes %d is out of range [%d, %d]: %w", size, MinVolumeBytes, m.cfg.MaxVolumeBytes, errdefs.ErrInvalidArgument)}
	}
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	if _, err := vs.VolumeByName(ctx, owner, name); err == nil {
		return core.Volume{}, &FieldError{Field: "name", Err: fmt.Errorf("volume %q exists: %w", name, errdefs.ErrAlreadyExists)}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return core.Volume{}, err
	}
	if maxBytes > 0 {
		all, err := vs.ListVolumes(ctx)
		if err != nil {
			return core.Volume{}, err
		}
		var held int64
		n := 0
		for _, v := range all {
			if v.Owner == owner {
				held += v.SizeBytes
				n++
			}
		}
		if held+size > maxBytes {
			return core.Volume{}, &FieldError{Field: "size", Err: fmt.Errorf("size: a volume of %s would take this key's volumes to %s, over its max_volume_size %s (%d volumes hold %s): %w",
				units.FormatSize(size), units.FormatSize(held+size), units.FormatSize(maxBytes), n, units.FormatSize(held), errdefs.ErrResourceExhausted)}
		}
	}
	v := core.Volume{ID: newVolumeID(), Name: name, Owner: owner, SizeBytes: size, CreatedAt: time.Now().UTC(), Token: newToken()}
	if err := disks.Make(ctx, v.ID, size); err != nil {
		return core.Volume{}, err
	}
	if err := vs.PutVolume(ctx, v); err != nil {
		if rerr := disks.Remove(context.WithoutCancel(ctx), v.ID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return core.Volume{}, &FieldError{Field: "name", Err: err}
		}
		return core.Volume{}, err
	}
	m.log.Info("volume_created", "volume_id", v.ID, "name", name, "owner", owner, "size_bytes", size)
	return v, nil
}

// LookupVolume returns the volume ref names: its ID, or the name of one of
// owner's (owner's own come first: a name of owner's that is another's
// ID names owner's). Whether the caller may see it is the caller's to
// decide (its Owner).
func (m *Manager) LookupVolume(ctx context.Context, owner, ref string) (core.Volume, error) {
	vs, _, err := m.volumes()
	if err != nil {
		return core.Volume{}, err
	}
	byID, err := vs.GetVolume(ctx, ref)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return core.Volume{}, err
	}
	found := err == nil
	if found && byID.Owner == owner {
		return byID, nil
	}
	v, err := vs.VolumeByName(ctx, owner, ref)
	if errors.Is(err, errdefs.ErrNotFound) && found {
		return byID, nil
	}
	return v, err
}

// MountVolume mounts volume id on the host for file operations from
// there, until release.
func (m *Manager) MountVolume(ctx context.Context, id string) (root string, release func(), err error) {
	vs, disks, err := m.volumes()
	if err != nil {
		return "", nil, err
	}
	if _, err := vs.GetVolume(ctx, id); err != nil {
		return "", nil, err
	}
	return disks.Mount(ctx, id)
}

// VolumeUsed reports how many bytes volume id's files take.
func (m *Manager) VolumeUsed(ctx context.Context, id string) (int64, error) {
	_, disks, err := m.volumes()
	if err != nil {
		return 0, err
	}
	return disks.Used(ctx, id)
}

// ListVolumes returns every volume, oldest first.
func (m *Manager) ListVolumes(ctx context.Context) ([]core.Volume, error) {
	vs, _, err := m.volumes()
	if err != nil {
		return nil, err
	}
	return vs.ListVolumes(ctx)
}

// VolumeUsers lists the sandboxes that bind volume id and still exist
// (creating, running, paused: anything not stopped or failed).
func (m *Manager) VolumeUsers(ctx context.Context, id string) ([]string, error) {
	var out []string
	m.mu.Lock()
	for sid, e := range m.live {
		if slices.ContainsFunc(e.cur.Load().rec.Volumes, func(v core.VolumeMount) bool { return v.Volume == id }) {
			out = append(out, sid)
		}
	}
	m.mu.Unlock()
	recs, err := m.deps.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.State == string(StateStopped) || r.State == string(StateFailed) || slices.Contains(out, r.ID) {
			continue
		}
		if slices.ContainsFunc(r.Volumes, func(v core.VolumeMount) bool { return v.Volume == id }) {
			out = append(out, r.ID)
		}
	}
	slices.Sort(out)
	return out, nil
}

// DeleteVolume deletes volume id and everything in it. While a sandbox
// binds it the delete is refused (ErrFailedPrecondition, naming them).
func (m *Manager) DeleteVolume(ctx context.Context, id string) error {
	vs, disks, err := m.volumes()
	if err != nil {
		return err
	}
	m.vols.mu.Lock()
	defer m.vols.mu.Unlock()
	v, err := vs.GetVolume(ctx, id)
	if err != nil {
		return err
	}
	users, err := m.VolumeUsers(ctx, id)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return fmt.Errorf("volume %s (%s) is bound in sandbox(es) %s: destroy them first: %w", v.Name, id, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	if err := disks.Remove(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err := vs.DeleteVolume(ctx, id); err != nil {
		return err
	}
	m.log.Info("volume_deleted", "volume_id", id, "name", v.Name)
	return nil
}

// resolveVolumes checks a create's volumes (CreateRequest.Volumes): each
// exists, is owner's, and binds at a path of its own. The caller holds
// m.vols for reading until its record is live.
func (m *Manager) resolveVolumes(ctx context.Context, req CreateRequest) ([]core.VolumeMount, error) {
	if len(req.Volumes) == 0 {
		return nil, nil
	}
	if len(req.Volumes) > MaxVolumeMounts {
		return nil, &FieldError{Field: "volumes", Err: fmt.Errorf("volumes: %d, at most %d: %w", len(req.Volumes), MaxVolumeMounts, errdefs.ErrInvalidArgument)}
	}
	out := make([]core.VolumeMount, 0, len(req.Volumes))
	for i, r := range req.Volumes {
		field := fmt.Sprintf("volumes[%d]", i)
		if err := runtime.CheckMountDestination(r.Path); err != nil {
			return nil, &FieldError{Field: field + ".path", Err: fmt.Errorf("%s.path: %w: %w", field, err, errdefs.ErrInvalidArgument)}
		}
		for _, o := range out {
			if o.Path == r.Path {
				return nil, &FieldError{Field: field + ".path", Err: fmt.Errorf("%s.path: %s is bound twice: %w", field, r.Path, errdefs.ErrInvalidArgument)}
			}
		}
		if r.Volume == "" {
			return nil, &FieldError{Field: field + ".volume", Err: fmt.Errorf("%s.volume: empty: %w", field, errdefs.ErrInvalidArgument)}
		}
		v, err := m.LookupVolume(ctx, req.Owner, r.Volume)
		if err == nil && v.Owner != req.Owner {
			// Another key's: as if there were none.
			err = fmt.Errorf("volume %q: %w", r.Volume, errdefs.ErrNotFound)
		}
		if err != nil {
			return nil, &FieldError{Field: field + ".volume", Err: err}
		}
		out = append(out, core.VolumeMount{Volume: v.ID, Name: v.Name, Path: r.Path, ReadOnly: r.ReadOnly})
	}
	return out, nil
}

// snapshotVolumes gives a create from snapshot s the snapshot's volumes
// when it names none; one from a memory snapshot must bind exactly those
// (its processes may hold files there open), at the same paths.
func snapshotVolumes(s core.Snapshot, req *CreateRequest) error {
	if len(req.Volumes) == 0 {
		for _, v := range s.Volumes {
			ref := v.Volume
			if ref == "" {
				ref = v.Name // an imported snapshot's: by name on this daemon
			}
			req.Volumes = append(req.Volumes, VolumeRequest{Volume: ref, Path: v.Path, ReadOnly: v.ReadOnly})
		}
		return nil
	}
	if s.Kind != core.SnapshotMemory {
		return nil
	}
	same := len(req.Volumes) == len(s.Volumes)
	for i := 0; same && i < len(s.Volumes); i++ {
		r, v := req.Volumes[i], s.Volumes[i]
		same = (r.Volume == v.Volume || r.Volume == v.Name) && r.Path == v.Path && r.ReadOnly == v.ReadOnly
	}
	if !same {
		return &FieldError{Field: "volumes", Err: fmt.Errorf("volumes: snapshot %s holds the memory of a sandbox that bound %s; a sandbox from it binds the same (leave volumes unset): %w", s.ID, describeVolumes(s.Volumes), errdefs.ErrInvalidArgument)}
	}
	return nil
}

// describeVolumes names volume mounts for a message.
func describeVolumes(vs []core.VolumeMount) string {
	if len(vs) == 0 {
		return "no volume"
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = v.Name + " at " + v.Path
		if v.ReadOnly {
			parts[i] += " (read-only)"
		}
	}
	return strings.Join(parts, ", ")
}

// mountVolumes mounts a sandbox's volumes on the host for its runtime to
// bind (Create, Start, Restore) and returns them as the spec's mounts;
// release drops the host's mounts once the runtime is done with them (the
// sandbox keeps its binds).
func (m *Manager) mountVolumes(ctx context.Context, rec core.Sandbox) ([]runtime.Mount, func(), error) {
	if len(rec.Volumes) == 0 {
		return nil, func() {}, nil
	}
	_, disks, err := m.volumes()
	if err != nil {
		return nil, nil, err
	}
	var releases []func()
	release := func() {
		for _, r := range releases {
			r()
		}
	}
	out := make([]runtime.Mount, 0, len(rec.Volumes))
	for _, v := range rec.Volumes {
		root, rel, err := disks.Mount(ctx, v.Volume)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("volume %s (%s): %w", v.Name, v.Volume, err)
		}
		releases = append(releases, rel)
		out = append(out, runtime.Mount{Source: root, Destination: v.Path, ReadOnly: v.ReadOnly})
	}
	return out, release, nil
}

// sweepVolumeDisks removes disks no record names (a create that died
// between its disk and its record), at start.
func (m *Manager) sweepVolumeDisks(ctx context.Context) {
	vs, disks, err := m.volumes()
	if err != nil {
		return
	}
	ids, err := disks.IDs()
	if err != nil {
		m.log.Warn("volume_sweep", "err", err)
		return
	}
	for _, id := range ids {
		if _, err := vs.GetVolume(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err := disks.Remove(ctx, id); err != nil {
			m.log.Warn("volume_sweep", "volume_id", id, "err", err)
			continue
		}
		m.log.Info("volume_disk_removed", "volume_id", id, "why", "no record")
	}
}
