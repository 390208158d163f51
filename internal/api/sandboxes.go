package api

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/units"
)

// Manager is what the API needs from the sandbox Manager.
type Manager interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.Sandbox, error)
	Destroy(ctx context.Context, id, reason string) error
	SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error)
	Events(ctx context.Context, id string) ([]core.Event, error)
	FollowEvents(ctx context.Context, id string, fn func(core.Event) error) error
	AgentSession(ctx context.Context, id string) (context.Context, sandbox.AgentEndpoint, context.CancelFunc, error)
	CheckRunning(ctx context.Context, id string)
	Pause(ctx context.Context, id string) (sandbox.Sandbox, error)
	Resume(ctx context.Context, id string, timeout time.Duration) (sandbox.Sandbox, error)
}

// createRequest is the wire CreateRequest with CPU as a pointer, so an
// explicit 0 is refused rather than read as "the default".
type createRequest struct {
	types.CreateRequest
	CPU *float64 `json:"cpu"`
}

func toJSON(s sandbox.Sandbox) types.Sandbox {
	out := types.Sandbox{
		ID: s.ID, State: s.State, Template: s.Template,
		CPU:         float64(s.CPUMillis) / 1000,
		MemoryBytes: s.MemoryBytes, DiskBytes: s.DiskBytes, PIDsLimit: s.PidsLimit,
		Env: s.Env, Labels: s.Labels,
		CreatedAt: utc(s.CreatedAt), Deadline: utc(s.Deadline), EndedAt: utc(s.EndedAt),
		Reason:    s.Reason,
		Isolation: s.Isolation, RuntimeVersion: s.RuntimeVersion,
	}
	out.Pause, out.OnTimeout, out.AutoResume = s.Pause, s.OnTimeout, s.AutoResume
	out.AllowSudo = s.AllowSudo
	for _, v := range s.Volumes {
		out.Volumes = append(out.Volumes, types.VolumeMount{Volume: v.Volume, Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	if s.IdlePause > 0 {
		out.IdlePause = s.IdlePause.String()
	}
	if s.Pause != "" {
		out.Remaining = s.Remaining.String()
	}
	if n := s.Network; n != nil {
		out.Network = &types.SandboxNetwork{Address: n.Address.String(), Gateway: n.Gateway.String(), HostLink: n.HostLink}
	}
	if s.Usage != nil {
		out.Usage = &types.Usage{
			CPUSeconds:      s.Usage.CPUUsage.Seconds(),
			MemoryBytes:     s.Usage.MemoryBytes,
			MemoryPeakBytes: s.Usage.MemoryMax,
			DiskUsedBytes:   s.Usage.DiskUsedBytes,
			PIDs:            s.Usage.PidsCurrent,
			OOMKills:        s.Usage.OOMKills,
		}
	}
	if d := s.Daemon; d != nil {
		if out.Usage == nil {
			out.Usage = &types.Usage{}
		}
		u := out.Usage
		u.ProxyConnections, u.ProxyRefused, u.ProxyOpen = d.ProxyConns, d.ProxyRefused, d.ProxyOpen
		u.ProxyBytesOut, u.ProxyBytesIn = d.BytesOut, d.BytesIn
		u.DNSQueries, u.DNSDropped = d.DNSQueries, d.DNSDropped
	}
	return out
}

// parseCreate turns the wire request into the Manager's, naming any bad field.
func parseCreate(in createRequest) (sandbox.CreateRequest, error) {
	out := sandbox.CreateRequest{Template: in.Template, Env: in.Env, Labels: in.Labels, Limits: sandbox.Limits{PidsLimit: in.PIDs}, Isolation: in.Isolation, Snapshot: in.Snapshot}
	if in.OnNodeLost != "" {
		// One daemon is one host: there is no other node to lose it to
		// or make it again on.
		return out, badField("on_node_lost", fmt.Errorf("on_node_lost %q: a Berth daemon runs its sandboxes on its own host and places nothing; the field is the Kubernetes gateway's (berth serve --kubernetes): %w", in.OnNodeLost, errdefs.ErrNotImplemented))
	}
	if in.Network != nil {
		p := policy.FromWire(*in.Network)
		out.Network = &p
	}
	out.OnTimeout, out.AutoResume = in.OnTimeout, in.AutoResume
	out.AllowSudo, out.User = in.AllowSudo, in.User
	for _, v := range in.Volumes {
		out.Volumes = append(out.Volumes, sandbox.VolumeRequest{Volume: v.Volume, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	if in.IdlePause != "" {
		var err error
		if out.IdlePause, err = units.ParseDuration(in.IdlePause); err != nil {
			return out, badField("idle_pause", fmt.Errorf("idle_pause: %w", err))
		}
		if out.IdlePause <= 0 {
			return out, badField("idle_pause", fmt.Errorf("idle_pause must be positive: %w", errdefs.ErrInvalidArgument))
		}
	}
	if in.CPU != nil {
		// The range (0.1 up to the host's cores) is the Manager's check;
		// this one only keeps the conversion to millicores meaningful.
		if !(*in.CPU > 0 && *in.CPU <= 1<<20) {
			return out, badField("cpu", fmt.Errorf("cpu %v: want a number of cores, at least %v: %w",
				*in.CPU, float64(sandbox.MinLimits.CPUMillis)/1000, errdefs.ErrInvalidArgument))
		}
		// Round up, so 0.0999 is refused as below 0.1 rather than
		// passing as 0 millicores (the default).
		out.Limits.CPUMillis = int64(math.Ceil(*in.CPU * 1000))
	}
	if in.PIDs < 0 {
		return out, badField("pids", fmt.Errorf("pids %d is negative: %w", in.PIDs, errdefs.ErrInvalidArgument))
	}
	var err error
	if in.Memory != "" {
		if out.Limits.MemoryBytes, err = units.ParseSize(in.Memory); err != nil {
			return out, badField("memory", fmt.Errorf("memory: %w", err))
		}
		// 0 would read as "unset" further in and silently become the
		// default.
		if out.Limits.MemoryBytes == 0 {
			return out, badField("memory", fmt.Errorf("memory %q: want at least %s: %w", in.Memory, units.FormatSize(sandbox.MinLimits.MemoryBytes), errdefs.ErrInvalidArgument))
		}
	}
	if in.Disk != "" {
		if out.Limits.DiskBytes, err = units.ParseSize(in.Disk); err != nil {
			return out, badField("disk", fmt.Errorf("disk: %w", err))
		}
		if out.Limits.DiskBytes == 0 {
			return out, badField("disk", fmt.Errorf("disk %q: want at least %s: %w", in.Disk, units.FormatSize(sandbox.MinLimits.DiskBytes), errdefs.ErrInvalidArgument))
		}
	}
	if in.Timeout != "" {
		if out.Timeout, err = units.ParseDuration(in.Timeout); err != nil {
			return out, badField("timeout", fmt.Errorf("timeout: %w", err))
		}
		if out.Timeout == 0 {
			return out, badField("timeout", fmt.Errorf("timeout must be positive: %w", errdefs.ErrInvalidArgument))
		}
	}
	return out, nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var in createRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	req, err := parseCreate(in)
	if err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	req.Owner, req.Quota = p.Owner(), p.Key.Quota
	if err := s.checkSnapshotAccess(r, req.Snapshot); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.cfg.Manager.Create(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, toJSON(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	labels, err := labelsQuery(q)
	if err != nil {
		writeError(w, err)
		return
	}
	opts := sandbox.ListOptions{Labels: labels}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			if !slices.Contains(types.States, one) {
				writeError(w, badField("state", fmt.Errorf("state %q is not one of %s: %w", one, strings.Join(types.States, ", "), errdefs.ErrInvalidArgument)))
				return
			}
			opts.States = append(opts.States, one)
		}
	}
	sbs, err := s.cfg.Manager.List(r.Context(), opts)
	if err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	out := types.SandboxList{Sandboxes: make([]types.Sandbox, 0, len(sbs))}
	for _, sb := range sbs {
		if !p.Sees(sb.Owner) {
			continue
		}
		out.Sandboxes = append(out.Sandboxes, toJSON(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

// validID checks a sandbox ID from a path before it reaches the Manager.
func validID(id string) error {
	if err := types.ValidSandboxID(id); err != nil {
		return badField("id", err)
	}
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.cfg.Manager.Get(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	if err := s.cfg.Manager.Destroy(r.Context(), id, "killed through the API"); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) removeRecord(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	if err := s.cfg.Records.Remove(r.Context(), id); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	var in types.SetTimeoutRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	if in.Timeout == "" {
		writeError(w, badField("timeout", fmt.Errorf("timeout is required: %w", errdefs.ErrInvalidArgument)))
		return
	}
	d, err := units.ParseDuration(in.Timeout)
	if err != nil {
		writeError(w, badField("timeout", fmt.Errorf("timeout: %w", err)))
		return
	}
	sb, err := s.cfg.Manager.SetTimeout(r.Context(), id, d)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(sb))
}

func eventToJSON(e core.Event) types.Event {
	return types.Event{Time: utc(e.Time), SandboxID: e.SandboxID, Type: e.Type, Message: e.Message}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	follow, err := boolParam(r.URL.Query(), "follow")
	if err != nil {
		writeError(w, err)
		return
	}
	if !follow {
		evs, err := s.cfg.Manager.Events(r.Context(), id)
		if err != nil {
			writeError(w, err)
			return
		}
		out := types.EventList{Events: make([]types.Event, 0, len(evs))}
		for _, e := range evs {
			out.Events = append(out.Events, eventToJSON(e))
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	if _, err := s.cfg.Manager.Get(r.Context(), id); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	err = s.cfg.Manager.FollowEvents(r.Context(), id, func(e core.Event) error {
		if err := enc.Encode(eventToJSON(e)); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("follow_events", "sandbox_id", id, "err", err)
	}
}

func notFoundRoute(r *http.Request) error {
	return fmt.Errorf("no route for %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
}

// labelsQuery reads the repeated query parameter label=key=value.
func labelsQuery(q url.Values) (map[string]string, error) {
	labels := map[string]string{}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, badField("label", fmt.Errorf("label %q: want key=value: %w", l, errdefs.ErrInvalidArgument))
		}
		labels[k] = v
	}
	return labels, nil
}
