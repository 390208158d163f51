package store

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// TestVolumesRoundTrip: volume records survive reopening, a name is unique
// per owner (another owner may use it), lookups by ID and by name work,
// an unknown one is not found, and a sandbox's volume mounts survive the
// store whole.
func TestVolumesRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	ctx := t.Context()
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := core.Volume{ID: "vola", Name: "cache", Owner: "k1", SizeBytes: 1 << 30, CreatedAt: now}
	b := core.Volume{ID: "volb", Name: "cache", Owner: "k2", SizeBytes: 1 << 20, CreatedAt: now.Add(time.Second)}
	for _, v := range []core.Volume{a, b} {
		if err := db.PutVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.PutVolume(ctx, core.Volume{ID: "volc", Name: "cache", Owner: "k1", CreatedAt: now}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("PutVolume of a taken name = %v, want already exists", err)
	}
	a.SizeBytes = 2 << 30 // an update of the same ID is no clash
	if err := db.PutVolume(ctx, a); err != nil {
		t.Fatal(err)
	}
	sb := core.Sandbox{ID: "sb1", State: "ready", Template: "base", Volumes: []core.VolumeMount{{Volume: "vola", Name: "cache", Path: "/data"}, {Volume: "volb", Name: "cache", Path: "/ro", ReadOnly: true}}}
	if err := db.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if db, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got, err := db.GetVolume(ctx, "vola"); err != nil || got != a {
		t.Errorf("GetVolume = %+v, %v; want %+v", got, err, a)
	}
	if got, err := db.VolumeByName(ctx, "k2", "cache"); err != nil || got != b {
		t.Errorf("VolumeByName(k2) = %+v, %v; want %+v", got, err, b)
	}
	if _, err := db.VolumeByName(ctx, "k3", "cache"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("VolumeByName(k3) = %v, want not found", err)
	}
	if all, err := db.ListVolumes(ctx); err != nil || len(all) != 2 || all[0].ID != "vola" {
		t.Errorf("ListVolumes = %+v, %v", all, err)
	}
	if got, err := db.GetSandbox(ctx, "sb1"); err != nil || !slices.Equal(got.Volumes, sb.Volumes) {
		t.Errorf("sandbox volumes = %+v, %v; want %+v", got.Volumes, err, sb.Volumes)
	}
	if err := db.DeleteVolume(ctx, "vola"); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{db.DeleteVolume(ctx, "vola"), func() error { _, err := db.GetVolume(ctx, "vola"); return err }()} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("after delete: %v, want not found", err)
		}
	}
}
