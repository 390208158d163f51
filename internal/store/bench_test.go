package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
)

// BenchmarkPutSandboxEvents: a record and two events in one write, as a
// create makes them.
func BenchmarkPutSandboxEvents(b *testing.B) {
	db, err := Open(b.Context(), filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	rec := core.Sandbox{ID: "sb1", State: "ready", Template: "minimal", CreatedAt: time.Now(), Env: map[string]string{"A": "b"}, Labels: map[string]string{"x": "y"}}
	for i := 0; b.Loop(); i++ {
		rec.ID = fmt.Sprint("sb", i)
		if _, err := db.PutSandboxEvents(b.Context(), rec, core.Event{SandboxID: rec.ID, Time: time.Now(), Type: "created", Message: "template minimal"}, core.Event{SandboxID: rec.ID, Time: time.Now(), Type: "ready"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutSandboxThenEvents: the same as three writes, as before.
func BenchmarkPutSandboxThenEvents(b *testing.B) {
	db, err := Open(b.Context(), filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	rec := core.Sandbox{ID: "sb1", State: "ready", Template: "minimal", CreatedAt: time.Now(), Env: map[string]string{"A": "b"}, Labels: map[string]string{"x": "y"}}
	for i := 0; b.Loop(); i++ {
		rec.ID = fmt.Sprint("sb", i)
		db.PutSandbox(b.Context(), rec)
		db.AddEvent(b.Context(), core.Event{SandboxID: rec.ID, Time: time.Now(), Type: "created", Message: "template minimal"})
		db.AddEvent(b.Context(), core.Event{SandboxID: rec.ID, Time: time.Now(), Type: "ready"})
	}
}
