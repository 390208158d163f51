package store

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

func TestSandboxRoundTrip(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "berth.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	in := core.Sandbox{ID: "abc123", State: "ready", Template: "minimal", CPUMillis: 500, MemoryBytes: 1 << 29,
		DiskBytes: 1 << 31, PidsLimit: 100, Env: map[string]string{"A": "b"}, Labels: map[string]string{"team": "x"},
		Token: "tok", CreatedAt: now, Deadline: now.Add(time.Minute)}
	if err := db.PutSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetSandbox(ctx, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	if got.Env["A"] != "b" || got.Labels["team"] != "x" || !got.CreatedAt.Equal(now) || !got.Deadline.Equal(in.Deadline) || got.CPUMillis != 500 {
		t.Errorf("GetSandbox = %+v, want %+v", got, in)
	}
	if _, err := db.GetSandbox(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSandbox(nope) err = %v, want not found", err)
	}
	in.State = "stopped"
	if err := db.PutSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	ready, err := db.ListSandboxes(ctx, "ready", "creating")
	if err != nil || len(ready) != 0 {
		t.Errorf("ListSandboxes(ready) = %v, %v; want none", ready, err)
	}
	all, err := db.ListSandboxes(ctx)
	if err != nil || len(all) != 1 {
		t.Errorf("ListSandboxes() = %v, %v; want one", all, err)
	}
	db.Close()

	// Reopen: state survives.
	db, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got, err := db.GetSandbox(ctx, "abc123"); err != nil || got.State != "stopped" {
		t.Errorf("after reopen GetSandbox = %+v, %v", got, err)
	}
}

func TestEvents(t *testing.T) {
	ctx := t.Context()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, typ := range []string{"created", "ready", "destroyed"} {
		if _, err := db.AddEvent(ctx, core.Event{SandboxID: "s1", Time: time.Now(), Type: typ}); err != nil {
			t.Fatal(err)
		}
	}
	db.AddEvent(ctx, core.Event{SandboxID: "s2", Time: time.Now(), Type: "created"})
	evs, err := db.Events(ctx, "s1", 0)
	if err != nil || len(evs) != 3 || evs[2].Type != "destroyed" {
		t.Fatalf("Events(s1) = %+v, %v", evs, err)
	}
	later, err := db.Events(ctx, "s1", evs[0].Seq)
	if err != nil || len(later) != 2 {
		t.Errorf("Events(s1, after first) = %+v, %v; want 2", later, err)
	}
}
