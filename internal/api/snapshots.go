package api

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// Snapshots is what the API needs for snapshots and fork (the Manager's
// snapshot.go, fork.go, snapexport.go).
type Snapshots interface {
	Snapshot(ctx context.Context, id, name string) (core.Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (core.Snapshot, error)
	Snapshots(ctx context.Context) ([]core.Snapshot, error)
	RemoveSnapshot(ctx context.Context, id string) error
	Fork(ctx context.Context, id string, req sandbox.ForkRequest) ([]sandbox.Sandbox, core.Snapshot, error)
	ExportSnapshot(ctx context.Context, id string, w io.Writer) error
	// ImportSnapshot records the archive as a snapshot of owner's, with
	// labels set over the archive's.
	ImportSnapshot(ctx context.Context, r io.Reader, owner string, labels map[string]string, id string) (core.Snapshot, error)
}

// maxImport bounds an uploaded snapshot archive.
const maxImport = 64 << 30

func snapshotToJSON(s core.Snapshot) types.Snapshot {
	return types.Snapshot{
		ID: s.ID, Name: s.Name, Source: s.Source, Kind: s.Kind, Template: s.Template, Isolation: s.Isolation,
		Env: s.Env, Labels: s.Labels, AllowSudo: s.AllowSudo, SizeBytes: s.SizeBytes, Fork: s.Fork, CreatedAt: utc(s.CreatedAt),
	}
}

// snapshotFor returns snapshot id if the caller may see it; one it may
// not is not found, as for sandboxes.
func (s *Server) snapshotFor(r *http.Request, id string) (core.Snapshot, error) {
	if err := types.ValidSandboxID(id); err != nil {
		return core.Snapshot{}, badField("snapshot", fmt.Errorf("snapshot ID: %w", err))
	}
	snap, err := s.cfg.Snapshots.GetSnapshot(r.Context(), id)
	if err != nil {
		return core.Snapshot{}, badField("snapshot", err)
	}
	if !principal(r).Sees(snap.Owner) {
		return core.Snapshot{}, badField("snapshot", fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound))
	}
	return snap, nil
}

// checkSnapshotAccess refuses a create from a snapshot the caller may
// not see ("" names none).
func (s *Server) checkSnapshotAccess(r *http.Request, id string) error {
	if id == "" {
		return nil
	}
	if s.cfg.Snapshots == nil {
		return badField("snapshot", fmt.Errorf("snapshots are not served by this daemon: %w", errdefs.ErrNotImplemented))
	}
	_, err := s.snapshotFor(r, id)
	return err
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	var in types.SnapshotRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	snap, err := s.cfg.Snapshots.Snapshot(r.Context(), id, in.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotToJSON(snap))
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	in := types.ForkRequest{Count: 1}
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	sbs, snap, err := s.cfg.Snapshots.Fork(r.Context(), id, sandbox.ForkRequest{Count: in.Count, Owner: p.Owner(), Quota: p.Key.Quota})
	if err != nil {
		writeError(w, err)
		return
	}
	out := types.ForkResult{Snapshot: snapshotToJSON(snap), Sandboxes: make([]types.Sandbox, 0, len(sbs))}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, toJSON(sb))
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	all, err := s.cfg.Snapshots.Snapshots(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	out := types.SnapshotList{Snapshots: make([]types.Snapshot, 0, len(all))}
	for _, snap := range all {
		if p.Sees(snap.Owner) {
			out.Snapshots = append(out.Snapshots, snapshotToJSON(snap))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snapshotFor(r, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotToJSON(snap))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snapshotFor(r, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.cfg.Snapshots.RemoveSnapshot(r.Context(), snap.ID); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) exportSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snapshotFor(r, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	// The archive is written to a temporary file first only per layer;
	// errors after the first byte can only cut the stream short, which
	// the importer's digests catch.
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", `attachment; filename="`+snap.ID+`.tar"`)
	ew := &startedWriter{w: w}
	if err := s.cfg.Snapshots.ExportSnapshot(r.Context(), snap.ID, ew); err != nil {
		if !ew.started {
			w.Header().Del("Content-Disposition")
			writeError(w, err)
			return
		}
		s.log.Warn("export_snapshot", "snapshot_id", snap.ID, "err", err)
	}
}

// startedWriter records whether anything was written yet (an error can
// still be answered as JSON).
type startedWriter struct {
	w       io.Writer
	started bool
}

func (sw *startedWriter) Write(b []byte) (int, error) {
	sw.started = true
	return sw.w.Write(b)
}

func (s *Server) importSnapshot(w http.ResponseWriter, r *http.Request) {
	labels, err := labelsQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	body := http.MaxBytesReader(w, r.Body, maxImport)
	snap, err := s.cfg.Snapshots.ImportSnapshot(r.Context(), body, principal(r).Owner(), labels, r.URL.Query().Get("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotToJSON(snap))
}
