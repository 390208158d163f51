package store

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
)

// TestPauseFieldsRoundTrip: what a paused sandbox keeps (how it was paused,
// the time its deadline had left) and its timeout settings survive the
// store, and a record without them reads back as not paused, killed at
// its deadline, not resumed on demand.
func TestPauseFieldsRoundTrip(t *testing.T) {
	db, err := Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	s := core.Sandbox{ID: "p1", State: "paused", Template: "base", Token: "t", CreatedAt: time.Now().UTC(),
		Pause: core.PauseMemory, Remaining: 90*time.Second + 5*time.Millisecond, OnTimeout: core.OnTimeoutPause, AutoResume: true,
		IdlePause: 5 * time.Minute, AllowSudo: true}
	if err := db.PutSandbox(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetSandbox(ctx, "p1")
	if err != nil || got.Pause != s.Pause || got.Remaining != s.Remaining || got.OnTimeout != s.OnTimeout || !got.AutoResume || !got.Deadline.IsZero() || got.IdlePause != s.IdlePause || !got.AllowSudo {
		t.Errorf("GetSandbox = %+v, %v; want pause fields %+v", got, err, s)
	}
	if err := db.PutSandbox(ctx, core.Sandbox{ID: "p2", State: "ready", Template: "base", Token: "t", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	got, err = db.GetSandbox(ctx, "p2")
	if err != nil || got.Pause != "" || got.Remaining != 0 || got.OnTimeout != "" || got.AutoResume || got.AllowSudo {
		t.Errorf("GetSandbox(p2) = %+v, %v; want no pause fields", got, err)
	}
}
