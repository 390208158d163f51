package api

import (
	"context"
	"net/http"

	"github.com/berth-sandbox/berth/api/types"
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

func apiKeyToJSON(k core.APIKey) types.APIKey {
	return types.APIKey{ID: k.ID, Name: k.Name, Mask: k.Mask, CreatedAt: utc(k.CreatedAt), RevokedAt: utc(k.RevokedAt)}
}

func (s *Server) createAPIKey(w http.ResponseWriter, r *http.Request) {
	var in types.CreateAPIKeyRequest
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
	out := types.APIKeyList{APIKeys: make([]types.APIKey, 0, len(keys))}
	for _, k := range keys {
		out.APIKeys = append(out.APIKeys, apiKeyToJSON(k))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokeAPIKey(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.APIKeys.Revoke(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
