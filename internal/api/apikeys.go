package api

import (
	"context"
	"net/http"

	"github.com/berth-sandbox/berth/internal/core"
)

// APIKeys is what the API needs to manage the keys of the E2B-compatible
// API. The native API itself is not authenticated yet: it listens on
// loopback, and whoever reaches it is the host's operator.
type APIKeys interface {
	Create(ctx context.Context, name string) (core.APIKey, string, error)
	List(ctx context.Context) ([]core.APIKey, error)
	Revoke(ctx context.Context, id string) error
}

type apiKeyJSON struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Mask      string `json:"mask"`
	CreatedAt string `json:"created_at"`
	RevokedAt string `json:"revoked_at,omitempty"`
	// Key is the secret, present only in the answer to create.
	Key string `json:"key,omitempty"`
}

func apiKeyToJSON(k core.APIKey) apiKeyJSON {
	return apiKeyJSON{ID: k.ID, Name: k.Name, Mask: k.Mask, CreatedAt: rfc3339(k.CreatedAt), RevokedAt: rfc3339(k.RevokedAt)}
}

// apiKeyRoutes mounts /v1/apikeys when the daemon manages keys.
func (s *Server) apiKeyRoutes() {
	if s.cfg.APIKeys == nil {
		return
	}
	s.mux.HandleFunc("POST /v1/apikeys", s.createAPIKey)
	s.mux.HandleFunc("GET /v1/apikeys", s.listAPIKeys)
	s.mux.HandleFunc("DELETE /v1/apikeys/{id}", s.revokeAPIKey)
}

func (s *Server) createAPIKey(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	k, secret, err := s.cfg.APIKeys.Create(r.Context(), in.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	out := apiKeyToJSON(k)
	out.Key = secret
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listAPIKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.cfg.APIKeys.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]apiKeyJSON, 0, len(keys))
	for _, k := range keys {
		out = append(out, apiKeyToJSON(k))
	}
	writeJSON(w, http.StatusOK, map[string]any{"api_keys": out})
}

func (s *Server) revokeAPIKey(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.APIKeys.Revoke(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
