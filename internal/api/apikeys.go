package api

import (
	"context"
	"fmt"
	"math"
	"net/http"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/units"
)

// APIKeys is what the API needs to manage API keys, which authenticate
// both the native and the E2B-compatible API.
type APIKeys interface {
	Create(ctx context.Context, name string) (core.APIKey, string, error)
	CreateWith(ctx context.Context, name string, admin bool, q core.Quota) (core.APIKey, string, error)
	List(ctx context.Context) ([]core.APIKey, error)
	Revoke(ctx context.Context, id string) error
	SetQuota(ctx context.Context, id string, q core.Quota) (core.APIKey, error)
	Verify(ctx context.Context, secret string) (core.APIKey, error)
}

func apiKeyToJSON(k core.APIKey) types.APIKey {
	out := types.APIKey{ID: k.ID, Name: k.Name, Mask: k.Mask, CreatedAt: utc(k.CreatedAt), RevokedAt: utc(k.RevokedAt), Admin: k.Admin}
	if q := k.Quota; q != (core.Quota{}) {
		out.Quota = &types.Quota{MaxSandboxes: q.MaxSandboxes, MaxCPU: float64(q.MaxCPUMillis) / 1000}
		if q.MaxMemoryBytes > 0 {
			out.Quota.MaxMemory = units.FormatSize(q.MaxMemoryBytes)
		}
		if q.MaxTimeout > 0 {
			out.Quota.MaxTimeout = q.MaxTimeout.String()
		}
		if q.MaxVolumeBytes > 0 {
			out.Quota.MaxVolumeSize = units.FormatSize(q.MaxVolumeBytes)
		}
	}
	return out
}

// quotaFromWire applies the wire fields that are set onto q, naming a bad
// field.
func quotaFromWire(q core.Quota, maxSandboxes *int64, maxCPU *float64, maxMemory, maxTimeout, maxVolumeSize *string) (core.Quota, error) {
	if maxSandboxes != nil {
		if *maxSandboxes < 0 {
			return q, badField("max_sandboxes", fmt.Errorf("max_sandboxes %d is negative: %w", *maxSandboxes, errdefs.ErrInvalidArgument))
		}
		q.MaxSandboxes = *maxSandboxes
	}
	if maxCPU != nil {
		if *maxCPU < 0 || *maxCPU > 1<<20 || math.IsNaN(*maxCPU) {
			return q, badField("max_cpu", fmt.Errorf("max_cpu %v: want a number of cores: %w", *maxCPU, errdefs.ErrInvalidArgument))
		}
		q.MaxCPUMillis = int64(math.Ceil(*maxCPU * 1000))
	}
	if maxMemory != nil {
		n, err := units.ParseSize(*maxMemory)
		if err != nil {
			return q, badField("max_memory", fmt.Errorf("max_memory: %w", err))
		}
		q.MaxMemoryBytes = n
	}
	if maxVolumeSize != nil {
		n, err := units.ParseSize(*maxVolumeSize)
		if err != nil {
			return q, badField("max_volume_size", fmt.Errorf("max_volume_size: %w", err))
		}
		q.MaxVolumeBytes = n
	}
	if maxTimeout != nil {
		d, err := units.ParseDuration(*maxTimeout)
		if err != nil {
			return q, badField("max_timeout", fmt.Errorf("max_timeout: %w", err))
		}
		q.MaxTimeout = d
	}
	return q, nil
}

func (s *Server) createAPIKey(w http.ResponseWriter, r *http.Request) {
	var in types.CreateAPIKeyRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	var quota core.Quota
	if q := in.Quota; q != nil {
		var mem, timeout, vols *string
		if q.MaxMemory != "" {
			mem = &q.MaxMemory
		}
		if q.MaxTimeout != "" {
			timeout = &q.MaxTimeout
		}
		if q.MaxVolumeSize != "" {
			vols = &q.MaxVolumeSize
		}
		var err error
		if quota, err = quotaFromWire(core.Quota{}, &q.MaxSandboxes, &q.MaxCPU, mem, timeout, vols); err != nil {
			writeError(w, err)
			return
		}
	}
	k, secret, err := s.cfg.APIKeys.CreateWith(r.Context(), in.Name, in.Admin, quota)
	if err != nil {
		writeError(w, err)
		return
	}
	out := apiKeyToJSON(k)
	out.Key = secret
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) updateAPIKey(w http.ResponseWriter, r *http.Request) {
	var in types.UpdateAPIKeyRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	keys, err := s.cfg.APIKeys.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	var cur *core.APIKey
	for i := range keys {
		if keys[i].ID == id && keys[i].RevokedAt.IsZero() {
			cur = &keys[i]
		}
	}
	if cur == nil {
		writeError(w, fmt.Errorf("api key %s (or it is revoked): %w", id, errdefs.ErrNotFound))
		return
	}
	q, err := quotaFromWire(cur.Quota, in.MaxSandboxes, in.MaxCPU, in.MaxMemory, in.MaxTimeout, in.MaxVolumeSize)
	if err != nil {
		writeError(w, err)
		return
	}
	k, err := s.cfg.APIKeys.SetQuota(r.Context(), id, q)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, apiKeyToJSON(k))
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
