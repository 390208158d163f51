package e2bcompat

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

func (f *fakeManager) Snapshot(ctx context.Context, id, name string) (core.Snapshot, error) {
	sb, ok := f.sbs[id]
	if !ok {
		return core.Snapshot{}, errdefs.ErrNotFound
	}
	if sandbox.State(sb.State) != sandbox.StateReady {
		return core.Snapshot{}, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errdefs.ErrFailedPrecondition)
	}
	return f.addSnapshot(core.Snapshot{Name: name, Source: id, Owner: sb.Owner, Template: sb.Template}), nil
}

func (f *fakeManager) addSnapshot(snap core.Snapshot) core.Snapshot {
	if f.snaps == nil {
		f.snaps = map[string]core.Snapshot{}
	}
	snap.ID = fmt.Sprintf("snap%d", len(f.snaps))
	snap.CreatedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(len(f.snaps)) * time.Second)
	f.snaps[snap.ID] = snap
	return snap
}

func (f *fakeManager) GetSnapshot(ctx context.Context, id string) (core.Snapshot, error) {
	snap, ok := f.snaps[id]
	if !ok {
		return core.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return snap, nil
}

func (f *fakeManager) Snapshots(ctx context.Context) ([]core.Snapshot, error) {
	var out []core.Snapshot
	for _, snap := range f.snaps {
		out = append(out, snap)
	}
	return out, nil
}

func (f *fakeManager) RemoveSnapshot(ctx context.Context, id string) error {
	if _, ok := f.snaps[id]; !ok {
		return errdefs.ErrNotFound
	}
	delete(f.snaps, id)
	return nil
}

func (f *fakeManager) Fork(ctx context.Context, id string, req sandbox.ForkRequest) ([]sandbox.Sandbox, core.Snapshot, error) {
	if req.Count < 1 || req.Count > sandbox.MaxForkCount {
		return nil, core.Snapshot{}, &sandbox.FieldError{Field: "count", Err: fmt.Errorf("count %d: %w", req.Count, errdefs.ErrInvalidArgument)}
	}
	parent := f.sbs[id]
	snap := f.addSnapshot(core.Snapshot{Name: "fork of " + id, Source: id, Owner: parent.Owner, Template: parent.Template, Fork: true})
	var out []sandbox.Sandbox
	for range req.Count {
		sb, _ := f.Create(ctx, sandbox.CreateRequest{Template: parent.Template, Snapshot: snap.ID, Owner: req.Owner, Metadata: parent.Metadata})
		out = append(out, sb)
	}
	return out, snap, nil
}

func TestSnapshotsAndFork(t *testing.T) {
	mgr := &fakeManager{sbs: map[string]sandbox.Sandbox{}}
	srv, key1, _ := newTestServer(t, mgr)
	_, key2, err := srv.cfg.Keys.Create(t.Context(), "two")
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, key, body string) (int, string, *httptest.ResponseRecorder) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		return w.Code, w.Body.String(), w
	}
	snapIDs := func(body string) []string {
		t.Helper()
		var out []e2bwire.SnapshotInfo
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		ids := []string{}
		for _, s := range out {
			ids = append(ids, s.SnapshotID)
		}
		return ids
	}

	code, body, _ := do("POST", "/v2/sandboxes", key1, `{"templateID":"base","metadata":{"k":"v"}}`)
	if code != 201 {
		t.Fatalf("create = %d %s", code, body)
	}
	var sb e2bwire.SandboxBody
	_ = json.Unmarshal([]byte(body), &sb)

	// Another key's sandbox is not found, for a snapshot as for the rest.
	if code, body, _ := do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", key2, `{}`); code != 404 {
		t.Errorf("snapshot of another key's sandbox = %d %s, want 404", code, body)
	}
	code, body, _ = do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", key1, `{"name":"first"}`)
	var info e2bwire.SnapshotInfo
	if err := json.Unmarshal([]byte(body), &info); code != 201 || err != nil || info.SnapshotID == "" || strings.Join(info.Names, ",") != "first" {
		t.Fatalf("snapshot = %d %s, want 201 with the ID and name", code, body)
	}
	snap := info.SnapshotID
	if code, body, _ := do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", key1, ``); code != 201 || !strings.Contains(body, `"names":[]`) {
		t.Errorf("unnamed snapshot = %d %s, want 201 with names []", code, body)
	}

	// Listing: only the caller's, filtered by source and name.
	if _, body, _ := do("GET", "/snapshots", key2, ""); len(snapIDs(body)) != 0 {
		t.Errorf("another key lists %s", body)
	}
	if _, body, _ := do("GET", "/snapshots", key1, ""); strings.Join(snapIDs(body), ",") != "snap1,snap0" {
		t.Errorf("list = %s, want snap1,snap0 (newest first)", body)
	}
	if _, body, _ := do("GET", "/snapshots?name=first", key1, ""); strings.Join(snapIDs(body), ",") != snap {
		t.Errorf("list ?name=first = %s", body)
	}
	if _, body, _ := do("GET", "/snapshots?sandboxID=other", key1, ""); len(snapIDs(body)) != 0 {
		t.Errorf("list ?sandboxID=other = %s", body)
	}
	code, body, w := do("GET", "/snapshots?limit=1", key1, "")
	next := w.Header().Get("X-Next-Token")
	if code != 200 || strings.Join(snapIDs(body), ",") != "snap1" || next == "" {
		t.Fatalf("page 1 = %d %s next %q", code, body, next)
	}
	_, body, w = do("GET", "/snapshots?limit=1&nextToken="+next, key1, "")
	if strings.Join(snapIDs(body), ",") != "snap0" || w.Header().Get("X-Next-Token") != "" {
		t.Errorf("page 2 = %s next %q", body, w.Header().Get("X-Next-Token"))
	}
	for _, bad := range []string{"limit=0", "nextToken=zz"} {
		if code, _, _ := do("GET", "/snapshots?"+bad, key1, ""); code != 400 {
			t.Errorf("list ?%s = %d, want 400", bad, code)
		}
	}

	// A create naming the snapshot starts from it; for another key the
	// name is just a template name.
	if code, body, _ := do("POST", "/v2/sandboxes", key1, `{"templateID":"`+snap+`"}`); code != 201 || mgr.lastCreate.Snapshot != snap || mgr.lastCreate.Template != "" {
		t.Errorf("create from snapshot = %d %s, request %+v", code, body, mgr.lastCreate)
	}
	if do("POST", "/v2/sandboxes", key2, `{"templateID":"`+snap+`"}`); mgr.lastCreate.Snapshot != "" || mgr.lastCreate.Template != snap {
		t.Errorf("another key's create naming the snapshot = %+v, want a template create", mgr.lastCreate)
	}

	// Fork: count copies, each the caller's, with the parent's metadata.
	if code, body, _ := do("POST", "/sandboxes/"+sb.SandboxID+"/fork", key2, `{}`); code != 404 {
		t.Errorf("fork of another key's sandbox = %d %s, want 404", code, body)
	}
	if code, body, _ := do("POST", "/sandboxes/"+sb.SandboxID+"/fork", key1, `{"count":0}`); code != 400 || !strings.Contains(body, "count") {
		t.Errorf("fork count 0 = %d %s, want 400 naming count", code, body)
	}
	if code, body, _ := do("POST", "/sandboxes/"+sb.SandboxID+"/fork", key1, `{"timeout":-1}`); code != 400 {
		t.Errorf("fork timeout -1 = %d %s, want 400", code, body)
	}
	code, body, _ = do("POST", "/sandboxes/"+sb.SandboxID+"/fork", key1, `{"count":2,"timeout":60}`)
	var forks []forkResult
	if err := json.Unmarshal([]byte(body), &forks); code != 201 || err != nil || len(forks) != 2 {
		t.Fatalf("fork = %d %s, want 201 with 2 results", code, body)
	}
	seen := map[string]bool{sb.SandboxID: true}
	for _, f := range forks {
		if f.Sandbox == nil || f.Error != nil || seen[f.Sandbox.SandboxID] || f.Sandbox.EnvdAccessToken == "" {
			t.Fatalf("fork result %+v: want a sandbox of its own", f)
		}
		seen[f.Sandbox.SandboxID] = true
		if code, body, _ := do("GET", "/sandboxes/"+f.Sandbox.SandboxID, key1, ""); code != 200 || !strings.Contains(body, `"k":"v"`) {
			t.Errorf("get copy = %d %s, want the caller's with the parent's metadata", code, body)
		}
	}
	if _, body, _ := do("GET", "/snapshots", key1, ""); strings.Join(snapIDs(body), ",") != "snap1,snap0" {
		t.Errorf("list after fork = %s: the fork's own snapshot is not listed", body)
	}

	// Delete through DELETE /templates/{id}: the caller's only.
	if code, body, _ := do("DELETE", "/templates/"+snap, key2, ""); code != 404 {
		t.Errorf("delete another key's snapshot = %d %s, want 404", code, body)
	}
	if code, body, _ := do("DELETE", "/templates/"+snap, key1, ""); code != 204 {
		t.Errorf("delete = %d %s, want 204", code, body)
	}
	if code, body, _ := do("DELETE", "/templates/"+snap, key1, ""); code != 404 || !strings.Contains(body, "not found") {
		t.Errorf("delete again = %d %s, want 404", code, body)
	}
	if _, ok := mgr.snaps[snap]; ok {
		t.Error("the snapshot is still there")
	}

	// A paused sandbox is refused (resume it first), as Berth does.
	_, _ = mgr.Pause(t.Context(), sb.SandboxID) // the fake cannot fail
	if code, body, _ := do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", key1, `{}`); code != 409 {
		t.Errorf("snapshot of a paused sandbox = %d %s, want 409", code, body)
	}
}
