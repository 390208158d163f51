package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// NetworkManager is what the network endpoints need from the Manager.
type NetworkManager interface {
	NetworkPolicy(ctx context.Context, id string) (policy.Policy, error)
	SetNetworkPolicy(ctx context.Context, id string, p policy.Policy) (policy.Policy, error)
	NetworkLog(ctx context.Context, id string, f audit.Filter) ([]audit.Record, error)
	FollowNetworkLog(ctx context.Context, id string, f audit.Filter, fn func(audit.Record) error) error
	SuggestPolicy(ctx context.Context, id string) (policy.Policy, error)
}

// netManager returns the Manager's network side, or writes an error.
func (s *Server) netManager(w http.ResponseWriter, r *http.Request) (NetworkManager, string, bool) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return nil, "", false
	}
	nm, ok := s.cfg.Manager.(NetworkManager)
	if !ok {
		writeError(w, fmt.Errorf("network policy is not supported by this daemon: %w", errdefs.ErrNotImplemented))
		return nil, "", false
	}
	return nm, id, true
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	nm, id, ok := s.netManager(w, r)
	if !ok {
		return
	}
	p, err := nm.NetworkPolicy(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, policy.ToWire(p))
}

// putNetwork replaces the policy. The body is a policy document (JSON);
// a bad entry answers 400 naming it and the old policy stays.
func (s *Server) putNetwork(w http.ResponseWriter, r *http.Request) {
	nm, id, ok := s.netManager(w, r)
	if !ok {
		return
	}
	var in types.NetworkPolicy
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	p := policy.FromWire(in)
	if err := p.Validate(); err != nil {
		writeError(w, policyError(err))
		return
	}
	out, err := nm.SetNetworkPolicy(r.Context(), id, p)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, policy.ToWire(out))
}

// policyError names the bad entry of a policy in the error body.
func policyError(err error) error {
	var re *policy.RuleError
	if errors.As(err, &re) {
		return badField(re.Field, err)
	}
	return err
}

// networkLog answers the decisions as JSON, or with follow=true streams
// them as NDJSON.
func (s *Server) networkLog(w http.ResponseWriter, r *http.Request) {
	nm, id, ok := s.netManager(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var f audit.Filter
	switch v := q.Get("denied"); v {
	case "", "false", "0":
	case "true", "1":
		f.DeniedOnly = true
	default:
		writeError(w, badField("denied", fmt.Errorf("denied %q: want true or false: %w", v, errdefs.ErrInvalidArgument)))
		return
	}
	if v := q.Get("since"); v != "" {
		since, err := parseSince(v, time.Now())
		if err != nil {
			writeError(w, badField("since", err))
			return
		}
		f.Since = since
	}
	follow, err := boolParam(q, "follow")
	if err != nil {
		writeError(w, err)
		return
	}
	if !follow {
		recs, err := nm.NetworkLog(r.Context(), id, f)
		if err != nil {
			writeError(w, err)
			return
		}
		out := types.NetworkRecordList{Records: make([]types.NetworkRecord, 0, len(recs))}
		for _, rec := range recs {
			out.Records = append(out.Records, types.NetworkRecord(rec))
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	if _, err := nm.NetworkLog(r.Context(), id, audit.Filter{DeniedOnly: true}); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	err = nm.FollowNetworkLog(r.Context(), id, f, func(rec audit.Record) error {
		if err := enc.Encode(types.NetworkRecord(rec)); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("follow_network_log", "sandbox_id", id, "err", err)
	}
}

func (s *Server) suggestNetwork(w http.ResponseWriter, r *http.Request) {
	nm, id, ok := s.netManager(w, r)
	if !ok {
		return
	}
	p, err := nm.SuggestPolicy(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, policy.ToWire(p))
}

// parseSince reads a log's since parameter: an RFC 3339 time, or a
// duration (such as 10m) back from now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time or a duration such as 10m: %w", v, errdefs.ErrInvalidArgument)
}
