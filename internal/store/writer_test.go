package store

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
)

// TestGroupCommit: concurrent writes (grouped into shared transactions)
// all land, each event gets its own sequence number, and a failing
// statement fails only its own caller, not the group it was in.
func TestGroupCommit(t *testing.T) {
	ctx := t.Context()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const n = 200
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seqs = map[int64]bool{}
	)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("sb%d", i%10)
			e, err := db.AddEvent(ctx, core.Event{SandboxID: id, Time: time.Now(), Type: "t", Message: fmt.Sprint(i)})
			if err != nil {
				t.Errorf("AddEvent %d: %v", i, err)
				return
			}
			mu.Lock()
			if seqs[e.Seq] {
				t.Errorf("sequence number %d handed out twice", e.Seq)
			}
			seqs[e.Seq] = true
			mu.Unlock()
		})
		if i%20 == 0 {
			wg.Go(func() {
				if _, err := db.exec(ctx, `INSERT INTO no_such_table VALUES (1)`); err == nil {
					t.Error("a write to a missing table succeeded")
				}
			})
		}
	}
	wg.Wait()
	total := 0
	for i := range 10 {
		evs, err := db.Events(ctx, fmt.Sprintf("sb%d", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		total += len(evs)
	}
	if total != n {
		t.Errorf("%d events stored, want %d", total, n)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.AddEvent(ctx, core.Event{SandboxID: "late", Time: time.Now(), Type: "t"}); err == nil {
		t.Error("AddEvent after Close succeeded")
	}
}

// TestPutSandboxEvents: a record and its events land together, in order,
// with the sequence numbers handed back; a write whose later statement
// fails leaves nothing of its earlier ones, beside concurrent writes that
// land.
func TestPutSandboxEvents(t *testing.T) {
	ctx := t.Context()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec := core.Sandbox{ID: "sb1", State: "ready", Template: "minimal", CreatedAt: time.Now()}
	evs, err := db.PutSandboxEvents(ctx, rec,
		core.Event{SandboxID: "sb1", Time: time.Now(), Type: "created", Message: "template minimal"},
		core.Event{SandboxID: "sb1", Time: time.Now(), Type: "ready"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := db.Events(ctx, "sb1", 0)
	if err != nil || len(got) != 2 || got[0].Type != "created" || got[1].Type != "ready" {
		t.Fatalf("Events = %+v, %v; want created, ready", got, err)
	}
	for i := range got {
		if got[i].Seq != evs[i].Seq || evs[i].Seq == 0 {
			t.Errorf("event %d: stored seq %d, handed back %d", i, got[i].Seq, evs[i].Seq)
		}
	}
	if s, err := db.GetSandbox(ctx, "sb1"); err != nil || s.State != "ready" {
		t.Errorf("GetSandbox = %+v, %v", s, err)
	}

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			id := fmt.Sprintf("ok%d", i)
			if _, err := db.PutSandboxEvents(ctx, core.Sandbox{ID: id, State: "ready"}, core.Event{SandboxID: id, Time: time.Now(), Type: "ready"}); err != nil {
				t.Errorf("PutSandboxEvents %s: %v", id, err)
			}
		})
		wg.Go(func() {
			id := fmt.Sprintf("bad%d", i)
			_, err := db.execAll(ctx, putSandbox(core.Sandbox{ID: id, State: "ready"}), stmt{`INSERT INTO no_such_table VALUES (1)`, nil})
			if err == nil {
				t.Errorf("%s: a write with a failing statement succeeded", id)
			}
		})
	}
	wg.Wait()
	all, err := db.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 21 {
		t.Errorf("%d sandboxes stored, want 21 (sb1 and ok0…ok19, no bad*)", len(all))
	}
	for _, s := range all {
		if s.ID[:3] == "bad" {
			t.Errorf("%s stored though its write failed", s.ID)
		}
	}
}
