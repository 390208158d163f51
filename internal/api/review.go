package api

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/review"
	"github.com/berth-sandbox/berth/internal/worklog"
)

// Worklog reads a sandbox's work log (it outlives the sandbox).
type Worklog interface {
	Read(ctx context.Context, id string) ([]worklog.Entry, error)
}

// Reviewer hands a sandbox's work back: diff, export and commit.
type Reviewer interface {
	Diff(ctx context.Context, id, path string, w io.Writer) error
	Export(ctx context.Context, id, path, format string, w io.Writer) error
	Commit(ctx context.Context, id string, req review.CommitRequest) (review.CommitResult, error)
}

func (s *Server) getWorklog(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	if s.cfg.Worklog == nil {
		writeError(w, fmt.Errorf("work log: %w", errdefs.ErrNotImplemented))
		return
	}
	es, err := s.cfg.Worklog.Read(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	out := types.WorklogEntryList{Entries: make([]types.WorklogEntry, 0, len(es))}
	for _, e := range es {
		out.Entries = append(out.Entries, types.WorklogEntry(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// reviewer checks the id and that review operations are configured.
func (s *Server) reviewer(w http.ResponseWriter, r *http.Request) (Reviewer, string, bool) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return nil, "", false
	}
	if s.cfg.Review == nil {
		writeError(w, fmt.Errorf("review operations: %w", errdefs.ErrNotImplemented))
		return nil, "", false
	}
	return s.cfg.Review, id, true
}

// lazyBody sends the success header with the first byte, so a failure
// before any output still becomes a proper error answer.
type lazyBody struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (b *lazyBody) Write(p []byte) (int, error) {
	if !b.started {
		b.started = true
		b.w.Header().Set("Content-Type", b.contentType)
		b.w.WriteHeader(http.StatusOK)
	}
	return b.w.Write(p)
}

func (b *lazyBody) finish(err error) {
	switch {
	case err != nil && !b.started:
		writeError(b.w, err)
	case err == nil && !b.started:
		// Nothing to show is an empty answer, not an error.
		b.w.Header().Set("Content-Type", b.contentType)
		b.w.WriteHeader(http.StatusOK)
	}
	// An error after output began can only cut the stream short.
}

func (s *Server) getDiff(w http.ResponseWriter, r *http.Request) {
	rv, id, ok := s.reviewer(w, r)
	if !ok {
		return
	}
	b := &lazyBody{w: w, contentType: "text/x-diff"}
	b.finish(rv.Diff(r.Context(), id, r.URL.Query().Get("path"), b))
}

func (s *Server) getExport(w http.ResponseWriter, r *http.Request) {
	rv, id, ok := s.reviewer(w, r)
	if !ok {
		return
	}
	format := r.URL.Query().Get("format")
	ct := "application/mbox"
	switch format {
	case "", review.FormatPatch:
		format = review.FormatPatch
	case review.FormatBundle:
		ct = "application/x-git-bundle"
	default:
		writeError(w, badField("format", fmt.Errorf("export format %q: want patch or bundle: %w", format, errdefs.ErrInvalidArgument)))
		return
	}
	b := &lazyBody{w: w, contentType: ct}
	b.finish(rv.Export(r.Context(), id, r.URL.Query().Get("path"), format, b))
}

func (s *Server) postCommit(w http.ResponseWriter, r *http.Request) {
	rv, id, ok := s.reviewer(w, r)
	if !ok {
		return
	}
	var req types.CommitRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	res, err := rv.Commit(r.Context(), id, review.CommitRequest(req))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, types.CommitResult(res))
}
