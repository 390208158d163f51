package api

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/netpolicy"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/units"
)

// Manager is what the API needs from the sandbox Manager.
type Manager interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.Sandbox, error)
	Destroy(ctx context.Context, id, reason string) error
	SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error)
	Events(ctx context.Context, id string) ([]store.Event, error)
	FollowEvents(ctx context.Context, id string, fn func(store.Event) error) error
	Agent(ctx context.Context, id string) (addr, token string, err error)
}

type createRequest struct {
	Template string            `json:"template"`
	CPU      *float64          `json:"cpu"`
	Memory   string            `json:"memory"`
	Disk     string            `json:"disk"`
	Pids     int64             `json:"pids"`
	Timeout  string            `json:"timeout"`
	Env      map[string]string `json:"env"`
	Labels   map[string]string `json:"labels"`
	// Network is the egress policy (see internal/netpolicy.Policy).
	Network *netpolicy.Policy `json:"network,omitempty"`
}

type usageJSON struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes"`
	DiskUsedBytes   int64   `json:"disk_used_bytes"`
	Pids            int64   `json:"pids"`
	OOMKills        int64   `json:"oom_kills"`
	// The daemon's own work for the sandbox, outside its cgroup.
	ProxyConnections int64 `json:"proxy_connections"`
	ProxyRefused     int64 `json:"proxy_refused"`
	ProxyOpen        int64 `json:"proxy_open"`
	ProxyBytesOut    int64 `json:"proxy_bytes_out"`
	ProxyBytesIn     int64 `json:"proxy_bytes_in"`
	DNSQueries       int64 `json:"dns_queries"`
	DNSDropped       int64 `json:"dns_dropped"`
}

type sandboxJSON struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Template    string            `json:"template"`
	CPU         float64           `json:"cpu"`
	MemoryBytes int64             `json:"memory_bytes"`
	DiskBytes   int64             `json:"disk_bytes"`
	PidsLimit   int64             `json:"pids_limit"`
	Env         map[string]string `json:"env"`
	Labels      map[string]string `json:"labels"`
	CreatedAt   string            `json:"created_at"`
	Deadline    string            `json:"deadline"`
	EndedAt     string            `json:"ended_at,omitempty"`
	Reason      string            `json:"reason,omitempty"`
	Usage       *usageJSON        `json:"usage,omitempty"`
	Network     *networkJSON      `json:"network,omitempty"`
}

// networkJSON is where a live sandbox sits on the host's network.
type networkJSON struct {
	Address  string `json:"address"`
	Gateway  string `json:"gateway"`
	HostLink string `json:"host_link"`
}

func toJSON(s sandbox.Sandbox) sandboxJSON {
	out := sandboxJSON{
		ID: s.ID, State: s.State, Template: s.Template,
		CPU:         float64(s.CPUMillis) / 1000,
		MemoryBytes: s.MemoryBytes, DiskBytes: s.DiskBytes, PidsLimit: s.PidsLimit,
		Env: s.Env, Labels: s.Labels,
		CreatedAt: rfc3339(s.CreatedAt), Deadline: rfc3339(s.Deadline), EndedAt: rfc3339(s.EndedAt),
		Reason: s.Reason,
	}
	if n := s.Network; n != nil {
		out.Network = &networkJSON{Address: n.Address.String(), Gateway: n.Gateway.String(), HostLink: n.HostLink}
	}
	if s.Usage != nil {
		out.Usage = &usageJSON{
			CPUSeconds:      s.Usage.CPUUsage.Seconds(),
			MemoryBytes:     s.Usage.MemoryBytes,
			MemoryPeakBytes: s.Usage.MemoryMax,
			DiskUsedBytes:   s.Usage.DiskUsedBytes,
			Pids:            s.Usage.PidsCurrent,
			OOMKills:        s.Usage.OOMKills,
		}
	}
	if d := s.Daemon; d != nil {
		if out.Usage == nil {
			out.Usage = &usageJSON{}
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
	out := sandbox.CreateRequest{Template: in.Template, Env: in.Env, Labels: in.Labels, Limits: sandbox.Limits{PidsLimit: in.Pids}, Network: in.Network}
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
	if in.Pids < 0 {
		return out, badField("pids", fmt.Errorf("pids %d is negative: %w", in.Pids, errdefs.ErrInvalidArgument))
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
	sb, err := s.cfg.Manager.Create(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, toJSON(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := sandbox.ListOptions{Labels: map[string]string{}}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeError(w, badField("label", fmt.Errorf("label %q: want key=value: %w", l, errdefs.ErrInvalidArgument)))
			return
		}
		opts.Labels[k] = v
	}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			switch sandbox.State(one) {
			case sandbox.StateCreating, sandbox.StateReady, sandbox.StatePaused, sandbox.StateStopping, sandbox.StateStopped, sandbox.StateFailed:
				opts.States = append(opts.States, one)
			default:
				writeError(w, badField("state", fmt.Errorf("state %q is not one of creating, ready, paused, stopping, stopped, failed: %w", one, errdefs.ErrInvalidArgument)))
				return
			}
		}
	}
	sbs, err := s.cfg.Manager.List(r.Context(), opts)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]sandboxJSON, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, toJSON(sb))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// validID checks a sandbox ID from a path before it reaches the Manager.
func validID(id string) error {
	if id == "" || len(id) > 64 {
		return badField("id", fmt.Errorf("sandbox ID %q: want 1-64 characters of [a-z0-9]: %w", id, errdefs.ErrInvalidArgument))
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return badField("id", fmt.Errorf("sandbox ID %q: want only [a-z0-9]: %w", id, errdefs.ErrInvalidArgument))
		}
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

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	var in struct {
		Timeout string `json:"timeout"`
	}
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

type eventJSON struct {
	Time      string `json:"time"`
	SandboxID string `json:"sandbox_id"`
	Type      string `json:"type"`
	Message   string `json:"message,omitempty"`
}

func eventToJSON(e store.Event) eventJSON {
	return eventJSON{Time: rfc3339(e.Time), SandboxID: e.SandboxID, Type: e.Type, Message: e.Message}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	follow := r.URL.Query().Get("follow")
	switch follow {
	case "", "false", "0":
		evs, err := s.cfg.Manager.Events(r.Context(), id)
		if err != nil {
			writeError(w, err)
			return
		}
		out := make([]eventJSON, 0, len(evs))
		for _, e := range evs {
			out = append(out, eventToJSON(e))
		}
		writeJSON(w, http.StatusOK, map[string]any{"events": out})
		return
	case "true", "1":
	default:
		writeError(w, badField("follow", fmt.Errorf("follow %q: want true or false: %w", follow, errdefs.ErrInvalidArgument)))
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
	err := s.cfg.Manager.FollowEvents(r.Context(), id, func(e store.Event) error {
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
