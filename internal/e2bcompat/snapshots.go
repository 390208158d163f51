package e2bcompat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// E2B's snapshots and fork on Berth's (internal/sandbox snapshot.go,
// fork.go).
//
// E2B models a snapshot as a template: the SDK creates one with
// POST /sandboxes/{id}/snapshots, lists them with GET /snapshots, starts a
// sandbox from one by passing its ID as the templateID of a create, and
// deletes one with DELETE /templates/{id}. Here the snapshot ID is Berth's
// own; a snapshot's name (free text in Berth, not unique) is reported in
// names but does not name it on create. A key sees only its own snapshots:
// another key's are "not found", as its sandboxes are.

// Snapshots is what snapshots and fork need from the sandbox Manager.
type Snapshots interface {
	Snapshot(ctx context.Context, id, name string) (core.Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (core.Snapshot, error)
	Snapshots(ctx context.Context) ([]core.Snapshot, error)
	RemoveSnapshot(ctx context.Context, id string) error
	Fork(ctx context.Context, id string, req sandbox.ForkRequest) ([]sandbox.Sandbox, core.Snapshot, error)
}

// createSnapshot answers POST /sandboxes/{id}/snapshots: 201 with the
// snapshot. The sandbox keeps running (its processes are frozen while its
// files are copied); a paused one is refused with 409 (resume it first).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name string `json:"name"`
	}
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	snap, err := s.cfg.Manager.Snapshot(r.Context(), sandboxOf(r).ID, in.Name)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, e2bwire.InfoOf(snap.ID, snap.Name))
}

// visibleSnapshot returns snapshot id if the caller may see it. ok is
// false (and err nil) when there is no such snapshot for the caller:
// another key's, or snapshots not configured on this daemon.
func (s *Server) visibleSnapshot(r *http.Request, id string) (snap core.Snapshot, ok bool, err error) {
	if !validID(id) {
		return core.Snapshot{}, false, nil
	}
	snap, err = s.cfg.Manager.GetSnapshot(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrNotImplemented) {
		return core.Snapshot{}, false, nil
	}
	if err != nil {
		return core.Snapshot{}, false, err
	}
	if !callerOf(r).Sees(snap.Owner) {
		return core.Snapshot{}, false, nil
	}
	return snap, true, nil
}

// listSnapshots answers GET /snapshots: the caller's snapshots, newest
// first, a page at a time (the same cursor as GET /v2/sandboxes), filtered
// by sandboxID (the sandbox a snapshot was taken of) and name (its name
// or ID). The snapshots a fork takes for itself are not listed: they go
// with their last copy.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, after, ok := e2bwire.PageQuery(w, q)
	if !ok {
		return
	}
	all, err := s.cfg.Manager.Snapshots(r.Context())
	if errors.Is(err, errdefs.ErrNotImplemented) {
		all, err = nil, nil // none can exist
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	source, name, caller := q.Get("sandboxID"), q.Get("name"), callerOf(r)
	all = slices.DeleteFunc(all, func(snap core.Snapshot) bool {
		return !caller.Sees(snap.Owner) || snap.Fork ||
			(source != "" && snap.Source != source) ||
			(name != "" && snap.Name != name && snap.ID != name)
	})
	page := make([]types.Snapshot, 0, len(all))
	for _, snap := range all {
		page = append(page, types.Snapshot{ID: snap.ID, Name: snap.Name, CreatedAt: snap.CreatedAt})
	}
	e2bwire.WriteSnapshotPage(w, page, after, limit)
}

// deleteTemplate answers DELETE /templates/{templateID}, which the SDK's
// deleteSnapshot calls: 204 once the snapshot is gone, 404 if the caller
// has no such snapshot (the SDK then returns false), 409 while a sandbox
// still stands on it. Templates themselves are not deleted through the
// E2B API.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("templateID")
	snap, ok, err := s.visibleSnapshot(r, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	if !ok {
		if !validID(id) {
			writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not implemented by Berth: %s", r.Method, r.URL.Path, templatesMissing))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found (templates are not deleted through the E2B API: `berth template rm NAME`)", id))
		return
	}
	if err := s.cfg.Manager.RemoveSnapshot(r.Context(), snap.ID); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is E2B's SandboxForkResult: exactly one of the two is set.
type forkResult struct {
	Sandbox *e2bwire.SandboxBody `json:"sandbox,omitempty"`
	Error   *e2bwire.ErrorBody   `json:"error,omitempty"`
}

// fork answers POST /sandboxes/{id}/fork: count live copies of a running
// sandbox (Berth's fork: the parent keeps running; each copy has its own
// ID, token, files and network identity), each with the parent's E2B
// network settings and metadata and timeout seconds to live (E2B's
// default: 15). Berth makes every copy or none, so a fork that fails
// answers its error as a whole; only what fails after the copies stand
// (recording one's settings, setting its deadline) is reported in that
// copy's entry, and that copy is removed.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	parent := sandboxOf(r)
	var in struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	count := 1
	if in.Count != nil {
		count = *in.Count
	}
	timeout := e2bwire.DefaultTimeout
	if in.Timeout != nil {
		if *in.Timeout <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout %d: want a positive number of seconds", *in.Timeout))
			return
		}
		timeout = time.Duration(*in.Timeout) * time.Second
	}
	ext, err := s.cfg.Store.GetE2BSandbox(r.Context(), parent.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	// The copies must not be left half made by a client that gives up.
	ctx := context.WithoutCancel(r.Context())
	copies, _, err := s.cfg.Manager.Fork(ctx, parent.ID, sandbox.ForkRequest{Count: count, Owner: keyOf(r).ID, Quota: keyOf(r).Quota})
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]forkResult, 0, len(copies))
	for _, sb := range copies {
		body, err := s.finishFork(ctx, sb, ext, timeout)
		if err != nil {
			if derr := s.cfg.Manager.Destroy(ctx, sb.ID, "e2b: fork could not be finished"); derr != nil {
				err = errors.Join(err, derr)
			}
			status := errdefs.HTTPStatus(err)
			out = append(out, forkResult{Error: &e2bwire.ErrorBody{Code: status, Message: err.Error()}})
			continue
		}
		out = append(out, forkResult{Sandbox: &body})
	}
	writeJSON(w, http.StatusCreated, out)
}

// finishFork gives a copy its E2B record (the parent's network settings;
// a traffic token of its own where the parent required one) and its
// deadline.
func (s *Server) finishFork(ctx context.Context, sb sandbox.Sandbox, parent core.E2BSandbox, timeout time.Duration) (e2bwire.SandboxBody, error) {
	ext := core.E2BSandbox{ID: sb.ID, Network: parent.Network}
	if parent.TrafficToken != "" {
		ext.TrafficToken = randHex(20)
	}
	if err := s.cfg.Store.PutE2BSandbox(ctx, ext); err != nil {
		return e2bwire.SandboxBody{}, err
	}
	updated, err := s.cfg.Manager.SetTimeout(ctx, sb.ID, timeout)
	if err != nil {
		return e2bwire.SandboxBody{}, err
	}
	return s.sandboxBody(updated, ext), nil
}
