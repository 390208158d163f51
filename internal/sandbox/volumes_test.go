package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// volStore is memStore plus volume records.
type volStore struct {
	*memStore
	vmu  sync.Mutex
	vols map[string]core.Volume
}

func (s *volStore) PutVolume(_ context.Context, v core.Volume) error {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	for _, o := range s.vols {
		if o.ID != v.ID && o.Owner == v.Owner && o.Name == v.Name {
			return fmt.Errorf("volume %q exists: %w", v.Name, errdefs.ErrAlreadyExists)
		}
	}
	s.vols[v.ID] = v
	return nil
}

func (s *volStore) GetVolume(_ context.Context, id string) (core.Volume, error) {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	v, ok := s.vols[id]
	if !ok {
		return v, fmt.Errorf("volume %s: %w", id, errdefs.ErrNotFound)
	}
	return v, nil
}

func (s *volStore) VolumeByName(_ context.Context, owner, name string) (core.Volume, error) {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	for _, v := range s.vols {
		if v.Owner == owner && v.Name == name {
			return v, nil
		}
	}
	return core.Volume{}, fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
}

func (s *volStore) ListVolumes(context.Context) ([]core.Volume, error) {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	var out []core.Volume
	for _, v := range s.vols {
		out = append(out, v)
	}
	return out, nil
}

func (s *volStore) DeleteVolume(_ context.Context, id string) error {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	if _, ok := s.vols[id]; !ok {
		return fmt.Errorf("volume %s: %w", id, errdefs.ErrNotFound)
	}
	delete(s.vols, id)
	return nil
}

// fakeDisks keeps volumes as names; mounted counts host mounts.
type fakeDisks struct {
	mu      sync.Mutex
	disks   map[string]int64
	mounted map[string]int
}

func (d *fakeDisks) Make(_ context.Context, id string, size int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.disks[id] = size
	return nil
}

func (d *fakeDisks) Mount(_ context.Context, id string) (string, func(), error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.disks[id]; !ok {
		return "", nil, fmt.Errorf("volume %s has no disk: %w", id, errdefs.ErrNotFound)
	}
	d.mounted[id]++
	return "/volumes/" + id, func() {
		d.mu.Lock()
		d.mounted[id]--
		d.mu.Unlock()
	}, nil
}

func (d *fakeDisks) Remove(_ context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.disks, id)
	return nil
}

func (d *fakeDisks) Used(context.Context, string) (int64, error) { return 4096, nil }

func (d *fakeDisks) IDs() ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id := range d.disks {
		out = append(out, id)
	}
	return out, nil
}

// mountsRuntime records each create's mounts.
type mountsRuntime struct {
	*fakeRuntime
	mu     sync.Mutex
	mounts map[string][]runtime.Mount
}

func (r *mountsRuntime) Create(ctx context.Context, spec runtime.Spec) error {
	r.mu.Lock()
	r.mounts[spec.ID] = spec.Mounts
	r.mu.Unlock()
	return r.fakeRuntime.Create(ctx, spec)
}

// TestVolumes: a volume binds into its owner's sandboxes at their paths
// (the runtime gets the disk's root, the host mount is released once the
// runtime has it), is not another key's to bind, cannot be deleted while
// a sandbox that binds it exists, and bad requests name their field and
// make nothing.
func TestVolumes(t *testing.T) {
	st := &volStore{memStore: newMemStore(), vols: map[string]core.Volume{}}
	disks := &fakeDisks{disks: map[string]int64{}, mounted: map[string]int{}}
	var rt *mountsRuntime
	f := newLifeFixture(t, func(d *Deps) {
		rt = &mountsRuntime{fakeRuntime: d.Runtime.(*fakeRuntime), mounts: map[string][]runtime.Mount{}}
		d.Runtime, d.Store, d.Volumes = rt, st, disks
	})
	m, ctx := f.m, t.Context()
	v, err := m.CreateVolume(ctx, "key1", "cache", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != DefaultVolumeBytes || disks.disks[v.ID] != DefaultVolumeBytes || !strings.HasPrefix(v.ID, "vol") {
		t.Errorf("volume %+v, disk %d; want the default size and a vol ID", v, disks.disks[v.ID])
	}
	fieldOf := func(err error) string {
		var fe *FieldError
		if errors.As(err, &fe) {
			return fe.Field
		}
		return ""
	}
	for _, c := range []struct {
		name  string
		size  int64
		field string
		code  error
	}{
		{"cache", 0, "name", errdefs.ErrAlreadyExists},
		{"", 0, "name", errdefs.ErrInvalidArgument},
		{"../x", 0, "name", errdefs.ErrInvalidArgument},
		{"small", 1 << 20, "size_bytes", errdefs.ErrInvalidArgument},
		{"huge", 2 << 40, "size_bytes", errdefs.ErrInvalidArgument},
	} {
		_, err := m.CreateVolume(ctx, "key1", c.name, c.size, 0)
		if !errors.Is(err, c.code) || fieldOf(err) != c.field {
			t.Errorf("CreateVolume(%q, %d) = %v (field %q), want %v on %s", c.name, c.size, err, fieldOf(err), c.code, c.field)
		}
	}
	if len(disks.disks) != 1 {
		t.Errorf("refused creates made disks: %v", disks.disks)
	}
	// The key's quota bounds its volumes' sizes together.
	if _, err := m.CreateVolume(ctx, "key1", "more", 1<<30, DefaultVolumeBytes+(1<<29)); !errors.Is(err, errdefs.ErrResourceExhausted) || fieldOf(err) != "size" {
		t.Errorf("a volume past the key's max = %v (field %q), want resource_exhausted on size", err, fieldOf(err))
	}
	if _, err := m.CreateVolume(ctx, "key1", "fits", 1<<29, DefaultVolumeBytes+(1<<29)); err != nil {
		t.Errorf("a volume within the key's max = %v", err)
	}
	// The same name for another key is another volume.
	v2, err := m.CreateVolume(ctx, "key2", "cache", 32<<20, 0)
	if err != nil || v2.ID == v.ID {
		t.Fatalf("another key's cache = %+v, %v", v2, err)
	}
	// A name of a key's own that is another key's volume ID names its own.
	v3, err := m.CreateVolume(ctx, "key2", v.ID, 32<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.LookupVolume(ctx, "key2", v.ID); err != nil || got.ID != v3.ID {
		t.Errorf("LookupVolume(key2, %s) = %+v, %v; want key2's own %s", v.ID, got, err, v3.ID)
	}
	if got, err := m.LookupVolume(ctx, "key1", v.ID); err != nil || got.ID != v.ID {
		t.Errorf("LookupVolume(key1, %s) = %+v, %v; want it", v.ID, got, err)
	}

	sb, err := m.Create(ctx, CreateRequest{Owner: "key1", Volumes: []VolumeRequest{{Volume: "cache", Path: "/data"}, {Volume: v.ID, Path: "/ro", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []runtime.Mount{{Source: "/volumes/" + v.ID, Destination: "/data"}, {Source: "/volumes/" + v.ID, Destination: "/ro", ReadOnly: true}}
	if got := rt.mounts[sb.ID]; !slices.Equal(got, want) {
		t.Errorf("runtime mounts = %+v, want %+v", got, want)
	}
	if n := disks.mounted[v.ID]; n != 0 {
		t.Errorf("host mounts held after the create: %d", n)
	}
	wantRec := []core.VolumeMount{{Volume: v.ID, Name: "cache", Path: "/data"}, {Volume: v.ID, Name: "cache", Path: "/ro", ReadOnly: true}}
	if got, _ := st.GetSandbox(ctx, sb.ID); !slices.Equal(got.Volumes, wantRec) {
		t.Errorf("record's volumes = %+v, want %+v", got.Volumes, wantRec)
	}
	if users, err := m.VolumeUsers(ctx, v.ID); err != nil || !slices.Equal(users, []string{sb.ID}) {
		t.Errorf("VolumeUsers = %v, %v", users, err)
	}
	if err := m.DeleteVolume(ctx, v.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), sb.ID) {
		t.Errorf("DeleteVolume while bound = %v, want failed_precondition naming %s", err, sb.ID)
	}

	// Refused, naming the field; nothing made.
	before := len(rt.mounts)
	for _, c := range []struct {
		req   CreateRequest
		field string
		code  error
	}{
		{CreateRequest{Owner: "key3", Volumes: []VolumeRequest{{Volume: v.ID, Path: "/data"}}}, "volumes[0].volume", errdefs.ErrNotFound},
		{CreateRequest{Owner: "key1", Volumes: []VolumeRequest{{Volume: "nope", Path: "/data"}}}, "volumes[0].volume", errdefs.ErrNotFound},
		{CreateRequest{Owner: "key1", Volumes: []VolumeRequest{{Volume: "cache", Path: "/proc/x"}}}, "volumes[0].path", errdefs.ErrInvalidArgument},
		{CreateRequest{Owner: "key1", Volumes: []VolumeRequest{{Volume: "cache", Path: "data"}}}, "volumes[0].path", errdefs.ErrInvalidArgument},
		{CreateRequest{Owner: "key1", Volumes: []VolumeRequest{{Volume: "cache", Path: "/a"}, {Volume: "cache", Path: "/a"}}}, "volumes[1].path", errdefs.ErrInvalidArgument},
		{CreateRequest{Owner: "key1", Volumes: []VolumeRequest{{Volume: "", Path: "/a"}}}, "volumes[0].volume", errdefs.ErrInvalidArgument},
		{CreateRequest{Owner: "key1", Volumes: make([]VolumeRequest, MaxVolumeMounts+1)}, "volumes", errdefs.ErrInvalidArgument},
	} {
		_, err := m.Create(ctx, c.req)
		if !errors.Is(err, c.code) || fieldOf(err) != c.field {
			t.Errorf("Create(%+v) = %v (field %q), want %v on %s", c.req.Volumes, err, fieldOf(err), c.code, c.field)
		}
	}
	if len(rt.mounts) != before {
		t.Errorf("refused creates reached the runtime")
	}

	if err := m.Destroy(ctx, sb.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteVolume(ctx, v.ID); err != nil {
		t.Fatalf("DeleteVolume once unbound = %v", err)
	}
	if _, ok := disks.disks[v.ID]; ok {
		t.Error("the disk outlived its volume")
	}
	if _, err := m.LookupVolume(ctx, "key1", "cache"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("LookupVolume after delete = %v, want not found", err)
	}
	if err := m.DeleteVolume(ctx, v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second DeleteVolume = %v, want not found", err)
	}
	// A disk no record names (a create that died half way) goes at start.
	disks.disks["volorphan"] = 1
	m.sweepVolumeDisks(ctx)
	if _, ok := disks.disks["volorphan"]; ok {
		t.Error("an orphan disk survived the sweep")
	}
	if _, ok := disks.disks[v2.ID]; !ok {
		t.Error("the sweep removed a recorded volume's disk")
	}
}

// TestSnapshotVolumes: a create from a snapshot that names no volume binds
// the snapshot's; one from a memory snapshot binds exactly those.
func TestSnapshotVolumes(t *testing.T) {
	vols := []core.VolumeMount{{Volume: "vola", Name: "a", Path: "/data"}}
	for _, c := range []struct {
		kind string
		req  []VolumeRequest
		want []VolumeRequest
		ok   bool
	}{
		{core.SnapshotFilesystem, nil, []VolumeRequest{{Volume: "vola", Path: "/data"}}, true},
		{core.SnapshotFilesystem, []VolumeRequest{{Volume: "b", Path: "/x"}}, []VolumeRequest{{Volume: "b", Path: "/x"}}, true},
		{core.SnapshotMemory, nil, []VolumeRequest{{Volume: "vola", Path: "/data"}}, true},
		{core.SnapshotMemory, []VolumeRequest{{Volume: "a", Path: "/data"}}, []VolumeRequest{{Volume: "a", Path: "/data"}}, true},
		{core.SnapshotMemory, []VolumeRequest{{Volume: "a", Path: "/other"}}, nil, false},
		{core.SnapshotMemory, []VolumeRequest{{Volume: "a", Path: "/data", ReadOnly: true}}, nil, false},
	} {
		req := CreateRequest{Volumes: c.req}
		err := snapshotVolumes(core.Snapshot{ID: "s1", Kind: c.kind, Volumes: vols}, &req)
		if (err == nil) != c.ok {
			t.Errorf("%s snapshot, request %+v: err = %v, want ok %v", c.kind, c.req, err, c.ok)
			continue
		}
		if c.ok && !slices.Equal(req.Volumes, c.want) {
			t.Errorf("%s snapshot, request %+v: volumes %+v, want %+v", c.kind, c.req, req.Volumes, c.want)
		}
	}
}

// TestImportedSnapshotVolumes: an imported snapshot names its volumes by
// name only (an ID is its daemon's): a create from it binds this
// daemon's volumes of those names.
func TestImportedSnapshotVolumes(t *testing.T) {
	req := CreateRequest{}
	imported := core.Snapshot{ID: "s2", Kind: core.SnapshotMemory, Volumes: []core.VolumeMount{{Name: "cache", Path: "/c", ReadOnly: true}}}
	if err := snapshotVolumes(imported, &req); err != nil {
		t.Fatal(err)
	}
	if want := []VolumeRequest{{Volume: "cache", Path: "/c", ReadOnly: true}}; !slices.Equal(req.Volumes, want) {
		t.Errorf("volumes = %+v, want %+v", req.Volumes, want)
	}
}
