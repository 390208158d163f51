package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
)

// benchCreates runs write once per iteration on a fresh store, with a
// sandbox record of a new ID each time and its two events.
func benchCreates(b *testing.B, write func(db *DB, rec core.Sandbox, created, ready core.Event) error) {
	db, err := Open(b.Context(), filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	rec := core.Sandbox{State: "ready", Template: "minimal", CreatedAt: time.Now(), Env: map[string]string{"A": "b"}, Labels: map[string]string{"x": "y"}}
	for i := 0; b.Loop(); i++ {
		rec.ID = fmt.Sprint("sb", i)
		created := core.Event{SandboxID: rec.ID, Time: time.Now(), Type: "created", Message: "template minimal"}
		ready := core.Event{SandboxID: rec.ID, Time: time.Now(), Type: "ready"}
		if err := write(db, rec, created, ready); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutSandboxEvents: a record and two events in one write, as a
// create makes them.
func BenchmarkPutSandboxEvents(b *testing.B) {
	benchCreates(b, func(db *DB, rec core.Sandbox, created, ready core.Event) error {
		_, err := db.PutSandboxEvents(b.Context(), rec, created, ready)
		return err
	})
}

// BenchmarkPutSandboxThenEvents: the same as three writes, as before.
func BenchmarkPutSandboxThenEvents(b *testing.B) {
	benchCreates(b, func(db *DB, rec core.Sandbox, created, ready core.Event) error {
		if err := db.PutSandbox(b.Context(), rec); err != nil {
			return err
		}
		if _, err := db.AddEvent(b.Context(), created); err != nil {
			return err
		}
		_, err := db.AddEvent(b.Context(), ready)
		return err
	})
}
