package store

import (
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// TestMigrateOldDatabase opens a database made before owners and metadata
// existed: Open adds the columns and old rows read back with defaults.
func TestMigrateOldDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Exec(schema); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Exec(`INSERT INTO sandboxes (id, state, template, cpu_millis, memory_bytes, disk_bytes, pids_limit, env, labels, token, created_at, deadline)
		VALUES ('old1', 'ready', 'base', 1000, 1, 1, 1, '{}', '{}', 't', 1, 2)`); err != nil {
		t.Fatal(err)
	}
	old.Close()
	for range 2 { // a second Open must find nothing left to do
		db, err := Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := db.GetSandbox(t.Context(), "old1")
		if err != nil || got.Owner != "" || len(got.Metadata) != 0 || got.User != "" || got.Isolation != core.IsolationRunc || got.RuntimeVersion != "" {
			t.Errorf("GetSandbox(old1) = %+v, %v, want empty owner, metadata, user and runtime version, isolation runc", got, err)
		}
		got.Owner, got.Metadata, got.User = "key1", map[string]string{"any key": "v"}, "user"
		got.Isolation, got.RuntimeVersion = core.IsolationGVisor, "runsc 1"
		if err := db.PutSandbox(t.Context(), got); err != nil {
			t.Fatal(err)
		}
		back, _ := db.GetSandbox(t.Context(), "old1")
		if back.Owner != "key1" || back.Metadata["any key"] != "v" || back.User != "user" || back.Isolation != core.IsolationGVisor || back.RuntimeVersion != "runsc 1" {
			t.Errorf("round trip = %+v", back)
		}
		got.Owner, got.Metadata, got.User = "", nil, ""
		got.Isolation, got.RuntimeVersion = "", ""
		db.PutSandbox(t.Context(), got)
		db.Close()
	}
}

func TestAPIKeys(t *testing.T) {
	db, err := Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	k := core.APIKey{ID: "key1", Name: "n", Hash: "h1", Mask: "e2b_…1", CreatedAt: time.Now().UTC()}
	if err := db.PutAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if got, err := db.APIKeyByHash(ctx, "h1"); err != nil || got.ID != "key1" {
		t.Errorf("APIKeyByHash(h1) = %+v, %v", got, err)
	}
	if _, err := db.APIKeyByHash(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("APIKeyByHash(nope) err = %v, want not found", err)
	}
	if err := db.RevokeAPIKey(ctx, "key1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.APIKeyByHash(ctx, "h1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("revoked key still authenticates: %v", err)
	}
	if err := db.RevokeAPIKey(ctx, "key1", time.Now()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second revoke err = %v, want not found", err)
	}
	keys, err := db.ListAPIKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].RevokedAt.IsZero() {
		t.Errorf("ListAPIKeys = %+v, %v, want the one revoked key", keys, err)
	}
}
