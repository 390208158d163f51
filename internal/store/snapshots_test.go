package store

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// TestSnapshotsRoundTrip: a snapshot record survives the store whole,
// lists oldest first, survives reopening the database, and an unknown one
// is not found on get and delete.
func TestSnapshotsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	db, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := core.Snapshot{ID: "snapa", Name: "first", Source: "sb1", Kind: core.SnapshotFilesystem, Template: "base", Isolation: "runc",
		CPUMillis: 1000, MemoryBytes: 1 << 28, DiskBytes: 1 << 30, PidsLimit: 64, Env: map[string]string{"A": "1"}, Labels: map[string]string{"l": "v"},
		Policy: `{"mode":"none"}`, BaseLayers: []string{"/t/1", "/t/2"}, SizeBytes: 4096, CreatedAt: now}
	b := core.Snapshot{ID: "snapb", Source: "sb2", Kind: core.SnapshotMemory, Fork: true, CreatedAt: now.Add(time.Second)}
	for _, s := range []core.Snapshot{b, a} {
		if err := db.PutSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	if db, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, err := db.GetSnapshot(ctx, "snapa")
	if err != nil || got.Name != "first" || got.Env["A"] != "1" || len(got.BaseLayers) != 2 || !got.CreatedAt.Equal(now) || got.SizeBytes != 4096 {
		t.Errorf("GetSnapshot(snapa) = %+v, %v; want %+v", got, err, a)
	}
	list, err := db.ListSnapshots(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "snapa" || list[1].ID != "snapb" || !list[1].Fork {
		t.Errorf("ListSnapshots = %+v, %v; want snapa then snapb (fork)", list, err)
	}
	if err := db.DeleteSnapshot(ctx, "snapa"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.GetSnapshot(ctx, "snapa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSnapshot after delete: %v, want not found", err)
	}
	if err := db.DeleteSnapshot(ctx, "snapa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteSnapshot twice: %v, want not found", err)
	}
}
