package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/usage"
)

const gib = float64(1 << 30)

// getUsage answers GET /v1/usage?by=key|sandbox&since=RFC3339: the usage
// of sandboxes metered since then. A plain key sees its own only.
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	by := q.Get("by")
	if by == "" {
		by = "key"
	}
	if by != "key" && by != "sandbox" {
		writeError(w, badField("by", fmt.Errorf("by %q: want key or sandbox: %w", by, errdefs.ErrInvalidArgument)))
		return
	}
	since, err := timeParam(q, "since")
	if err != nil {
		writeError(w, err)
		return
	}
	all, err := s.cfg.Usage.List(r.Context(), since)
	if err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	var us []core.Usage
	for _, u := range all {
		if p.Sees(u.Owner) {
			us = append(us, u)
		}
	}
	names := map[string]string{}
	if s.cfg.APIKeys != nil {
		keys, err := s.cfg.APIKeys.List(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		for _, k := range keys {
			names[k.ID] = k.Name
		}
	}
	out := types.UsageList{Usage: []types.UsageRecord{}}
	if by == "sandbox" {
		for _, u := range us {
			out.Usage = append(out.Usage, types.UsageRecord{
				Key: names[u.Owner], KeyID: u.Owner, Sandbox: u.SandboxID,
				CPUSeconds: u.CPU.Seconds(), MemoryGiBSeconds: u.MemoryByteSeconds / gib, MemoryPeakBytes: u.MemoryPeakBytes,
				DiskBytes: u.DiskBytes, EgressBytes: u.EgressBytes, SandboxSeconds: u.Seconds,
				StartedAt: utc(u.StartedAt), UpdatedAt: utc(u.UpdatedAt),
			})
		}
	} else {
		for _, t := range usage.ByOwner(us) {
			out.Usage = append(out.Usage, types.UsageRecord{
				Key: names[t.Owner], KeyID: t.Owner, Sandboxes: t.Sandboxes,
				CPUSeconds: t.CPU.Seconds(), MemoryGiBSeconds: t.MemoryByteSeconds / gib, MemoryPeakBytes: t.MemoryPeakBytes,
				DiskBytes: t.DiskBytes, EgressBytes: t.EgressBytes, SandboxSeconds: t.Seconds,
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxMetrics answers GET /v1/sandboxes/{id}/metrics?since=&until=
// (RFC 3339, both optional): the sandbox's usage readings in that range,
// oldest first, and when the range is open at its end a reading taken
// now.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	since, err := timeParam(q, "since")
	if err != nil {
		writeError(w, err)
		return
	}
	until, err := timeParam(q, "until")
	if err != nil {
		writeError(w, err)
		return
	}
	if !since.IsZero() && !until.IsZero() && until.Before(since) {
		writeError(w, badField("until", fmt.Errorf("until %s is before since %s: %w", until.Format(time.RFC3339Nano), since.Format(time.RFC3339Nano), errdefs.ErrInvalidArgument)))
		return
	}
	sb, err := s.cfg.Manager.Get(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.History.Series(sb, since, until, time.Now()))
}
