package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// TestTemplateBuilds: a build and its log survive reopening the store;
// the log reads from an offset and as a tail; a restart ends builds that
// were building; pruning keeps the newest builds and any still building.
func TestTemplateBuilds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	db, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	b := core.TemplateBuild{ID: "b1", Template: "app", Target: "app-b1", Tags: []string{"v1"}, Status: "building", CreatedAt: now, UpdatedAt: now}
	if err := db.PutTemplateBuild(ctx, b); err != nil {
		t.Fatal(err)
	}
	var lines []core.BuildLogEntry
	for i := range 5 {
		lines = append(lines, core.BuildLogEntry{Time: now, Level: "info", Message: fmt.Sprint("line ", i)})
	}
	if err := db.AppendBuildLog(ctx, "b1", 0, lines[:3]); err != nil {
		t.Fatal(err)
	}
	if err := db.AppendBuildLog(ctx, "b1", 3, lines[3:]); err != nil {
		t.Fatal(err)
	}
	db.Close()

	db, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, err := db.GetTemplateBuild(ctx, "b1")
	if err != nil || got.Target != "app-b1" || len(got.Tags) != 1 || got.Tags[0] != "v1" || !got.CreatedAt.Equal(now) {
		t.Fatalf("GetTemplateBuild = %+v, %v", got, err)
	}
	log, err := db.BuildLog(ctx, "b1", 2)
	if err != nil || len(log) != 3 || log[0].Message != "line 2" || log[2].Message != "line 4" {
		t.Fatalf("BuildLog from 2 = %+v, %v", log, err)
	}
	if log, _ := db.BuildLog(ctx, "b1", 9); log == nil || len(log) != 0 {
		t.Errorf("BuildLog past the end = %#v, want empty and not nil", log)
	}
	tail, err := db.BuildLogTail(ctx, "b1", 2)
	if err != nil || len(tail) != 2 || tail[0].Message != "line 3" || tail[1].Message != "line 4" {
		t.Fatalf("BuildLogTail 2 = %+v, %v", tail, err)
	}
	if n, err := db.InterruptBuilds(ctx, "the daemon restarted", now); err != nil || n != 1 {
		t.Fatalf("InterruptBuilds = %d, %v", n, err)
	}
	if got, _ := db.GetTemplateBuild(ctx, "b1"); got.Status != "error" || got.Reason != "the daemon restarted" {
		t.Errorf("after interrupt: %+v", got)
	}
	if _, err := db.GetTemplateBuild(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown build: %v", err)
	}

	// Prune: b1 (oldest, ended) goes; b2 is building and stays though
	// old; the newest two stay.
	for i, st := range []string{"building", "ready", "ready"} {
		id := fmt.Sprint("b", i+2)
		if err := db.PutTemplateBuild(ctx, core.TemplateBuild{ID: id, Template: "app", Status: st, CreatedAt: now.Add(time.Duration(i+1) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.PutTemplateBuild(ctx, core.TemplateBuild{ID: "other", Template: "other", Status: "ready", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := db.PruneBuilds(ctx, "app", 2); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"b1": false, "b2": true, "b3": true, "b4": true, "other": true} {
		_, err := db.GetTemplateBuild(ctx, id)
		if (err == nil) != want {
			t.Errorf("after prune, build %s kept = %v, want %v", id, err == nil, want)
		}
	}
	if log, _ := db.BuildLog(ctx, "b1", 0); len(log) != 0 {
		t.Errorf("a pruned build's log stayed: %d lines", len(log))
	}
}
