package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/units"
)

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.cfg.Manager.Pause(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(sb))
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	var in types.ResumeRequest
	// The body is optional: an empty one means no timeout.
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	var d time.Duration
	if in.Timeout != "" {
		var err error
		if d, err = units.ParseDuration(in.Timeout); err != nil {
			writeError(w, badField("timeout", fmt.Errorf("timeout: %w", err)))
			return
		}
	}
	sb, err := s.cfg.Manager.Resume(r.Context(), id, d)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(sb))
}
