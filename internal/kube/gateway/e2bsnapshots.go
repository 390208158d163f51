package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
)

// E2B's snapshots and fork on the gateway's snapshots (snapshots.go), as
// a daemon's E2B API serves them: a snapshot is named by its ID
// (snapshotID), a create whose templateID is one of the caller's
// snapshots makes the sandbox from it (e2bCreate), DELETE
// /templates/{id} removes one, and a fork's copies carry the parent's E2B
// settings.

// e2bCreateSnapshot is POST /sandboxes/{id}/snapshots ({name}, optional):
// 201 with the snapshot. A paused sandbox is refused (409: resume it
// first).
func (g *Gateway) e2bCreateSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in struct {
		Name string `json:"name"`
	}
	if _, ok := g.e2bPodWith(w, r, p, &in); !ok {
		return
	}
	rec, _, err := g.takeSnapshot(r.Context(), p, r.PathValue("id"), in.Name, false)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	e2bwire.WriteJSON(w, http.StatusCreated, e2bwire.InfoOf(rec.snap.ID, rec.snap.Name))
}

// e2bListSnapshots is GET /snapshots: the caller's snapshots, newest
// first, a page at a time (GET /v2/sandboxes' cursor), filtered by
// sandboxID (the sandbox a snapshot was taken of) and name (its name or
// ID); a fork's own snapshots are left out, as on a daemon.
func (g *Gateway) e2bListSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	limit, after, ok := e2bwire.PageQuery(w, q)
	if !ok {
		return
	}
	recs, err := g.snapshotRecords(r.Context(), p)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	source, name := q.Get("sandboxID"), q.Get("name")
	recs = slices.DeleteFunc(recs, func(rec snapshotRecord) bool {
		return rec.snap.Fork || source != "" && rec.snap.Source != source ||
			name != "" && rec.snap.Name != name && rec.snap.ID != name
	})
	page := make([]apitypes.Snapshot, 0, len(recs))
	for _, rec := range recs {
		page = append(page, rec.api())
	}
	e2bwire.WriteSnapshotPage(w, page, after, limit)
}

// e2bDeleteSnapshot is DELETE /templates/{templateID}, the SDK's
// deleteSnapshot: 204 once gone, 404 when the caller has no such
// snapshot, 409 while a sandbox sits on it. Templates are not deleted
// through the E2B API.
func (g *Gateway) e2bDeleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("templateID")
	rec, err := g.snapshotFor(r.Context(), p, id, "templateID")
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		e2bwire.WriteError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not served by the Kubernetes gateway: %s", r.Method, r.URL.Path, e2bNotServed["/templates/"]))
		return
	case errors.Is(err, errdefs.ErrNotFound):
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found (templates are not deleted through the E2B API)", id))
		return
	case err != nil:
		e2bwire.WriteErr(w, err)
		return
	}
	if err := g.removeSnapshot(r.Context(), rec); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bForkResult is E2B's SandboxForkResult; the gateway makes every copy
// or none, so each entry it answers is a sandbox.
type e2bForkResult struct {
	Sandbox *e2bwire.SandboxBody `json:"sandbox,omitempty"`
}

// e2bFork is POST /sandboxes/{id}/fork ({count} (1 to 64, default 1),
// {timeout} seconds to live, E2B's default when omitted): the native
// fork's snapshot and copies, each with the parent's E2B network
// settings, metadata and (where the parent requires one) a traffic token
// of its own. A copy that fails fails the fork as a whole.
func (g *Gateway) e2bFork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	parent, ok := g.e2bPodWith(w, r, p, &in)
	if !ok {
		return
	}
	count := 1
	if in.Count != nil {
		count = *in.Count
	}
	if count < 1 || count > maxFork {
		e2bFieldErr(w, http.StatusBadRequest, "count", "%d: want 1 to %d", count, maxFork)
		return
	}
	timeout, ok := g.e2bTimeout(w, in.Timeout)
	if !ok {
		return
	}
	id := sandboxID(parent)
	rec, src, err := g.takeSnapshot(r.Context(), p, id, "fork of "+id, true)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	made, err := g.forkCopies(r.Context(), p, rec, src, count, timeout, func(pod *corev1.Pod) {
		g.e2bAnnotate(pod, src.Annotations[AnnotationE2BNetwork], src.Annotations[AnnotationE2BMetadata], src.Annotations[AnnotationTrafficTokenSHA256] != "")
	})
	g.forkDone(r.Context(), rec)
	if err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("fork of %s: %w", id, err))
		return
	}
	out := make([]e2bForkResult, 0, len(made))
	for _, pod := range made {
		body := g.e2bBody(pod, g.envdToken(sandboxID(pod)))
		out = append(out, e2bForkResult{Sandbox: &body})
	}
	e2bwire.WriteJSON(w, http.StatusCreated, out)
}
