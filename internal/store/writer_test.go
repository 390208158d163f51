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
