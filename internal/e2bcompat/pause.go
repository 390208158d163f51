package e2bcompat

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// E2B's pause and resume on Berth's (internal/sandbox pause.go): what a
// pause keeps depends on the sandbox's runtime, memory or files, and
// GET /sandboxes/{id} and the native API say which.

// onTimeoutOf maps E2B's autoPause (lifecycle.onTimeout "pause") onto
// Berth's on-timeout action.
func onTimeoutOf(b e2bwire.CreateBody) string {
	if b.AutoPause != nil && *b.AutoPause {
		return core.OnTimeoutPause
	}
	return ""
}

// lifecycleOnTimeout is E2B's lifecycle.onTimeout of a sandbox.
func lifecycleOnTimeout(sb sandbox.Sandbox) string {
	if sb.OnTimeout == core.OnTimeoutPause {
		return core.OnTimeoutPause
	}
	return core.OnTimeoutKill
}

// pause answers E2B's POST /sandboxes/{id}/pause: 204 once paused, 409 if
// it already was (the SDK's pause() then returns false).
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	if sandbox.State(sb.State) == sandbox.StatePaused {
		writeError(w, http.StatusConflict, "sandbox "+sb.ID+" is already paused")
		return
	}
	if _, err := s.cfg.Manager.Pause(r.Context(), sb.ID); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resume answers E2B's deprecated POST /sandboxes/{id}/resume: 201 with
// the sandbox once it runs, 409 if it was not paused.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var in e2bwire.TimeoutBody
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	if sandbox.State(sb.State) != sandbox.StatePaused {
		writeError(w, http.StatusConflict, "sandbox "+sb.ID+" is not paused")
		return
	}
	s.resumeAndAnswer(w, r, sb, in.Timeout)
}

// resumeAndAnswer resumes a paused sandbox (timeout seconds, when given,
// set its deadline) and answers 201 with it, as E2B's connect does for a
// sandbox it resumed.
func (s *Server) resumeAndAnswer(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, timeout *int64) {
	var d time.Duration
	if timeout != nil && *timeout > 0 {
		d = time.Duration(*timeout) * time.Second
	}
	// The resume must not die with a client that gives up waiting.
	resumed, err := s.cfg.Manager.Resume(context.WithoutCancel(r.Context()), sb.ID, d)
	if err != nil {
		writeErr(w, err)
		return
	}
	ext, err := s.cfg.Store.GetE2BSandbox(r.Context(), resumed.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(resumed, ext))
}
