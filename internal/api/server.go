// Package api serves Berth's native REST control plane under /v1, its
// OpenAPI document, and the data-plane proxy that carries requests to a
// sandbox's agent, so clients never route to sandbox addresses. It
// translates requests and calls the sandbox Manager; it owns no lifecycle.
package api

import (
	"context"
	_ "embed"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/template"
)

//go:embed openapi.json
var openapiDoc []byte

// Templates is what the API needs from the template store.
type Templates interface {
	List(ctx context.Context) ([]template.Template, error)
	Build(ctx context.Context, name string, log io.Writer) (template.Template, error)
	SetIsolation(ctx context.Context, name, isolation string) (template.Template, error)
	CheckImageRef(ref string) error
	BuildImage(ctx context.Context, name, ref string, start template.StartOptions, log io.Writer) (template.Template, error)
	Remove(ctx context.Context, name string) error
	PruneLayers(ctx context.Context) (int, int64, error)
	Export(ctx context.Context, name string, w io.Writer) error
	Import(ctx context.Context, r io.Reader, name string) (template.Template, error)
	ImportOver(ctx context.Context, r io.Reader, name string) (template.Template, error)
}

// WarmPools is the Manager's warm pools (sandbox/pool.go).
type WarmPools interface {
	Warm() map[sandbox.WarmKey]sandbox.WarmStatus
	SetWarm(ctx context.Context, name sandbox.WarmKey, n int) (sandbox.WarmStatus, error)
	// TemplateChanged drains a template's pool before its layers go or
	// after they changed.
	TemplateChanged(ctx context.Context, name string) error
}

// Records removes an ended sandbox's record and logs.
type Records interface {
	Remove(ctx context.Context, id string) error
}

// Usage lists metered usage records.
type Usage interface {
	List(ctx context.Context, since time.Time) ([]core.Usage, error)
}

// History is the sandboxes' usage over time (usage.History).
type History interface {
	Series(sb sandbox.Sandbox, since, until, now time.Time) []types.MetricSample
}

// Config wires the API to the daemon's subsystems.
type Config struct {
	Manager Manager
	// Snapshots, when set, serves snapshots and fork (snapshots.go).
	Snapshots Snapshots
	// Volumes, when set, serves volumes (volumes.go).
	Volumes   Volumes
	Templates Templates
	// Transport carries proxied requests to agents.
	Transport http.RoundTripper
	// Dial, when set, connects to a sandbox's address and port for the
	// port tunnels (tunnel.go); its connections can be half-closed.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// APIKeys, when set, serves /v1/apikeys and authenticates callers
	// (auth.go); without it every caller is the operator.
	APIKeys APIKeys
	// RequireAuth refuses callers without a key (but on the local socket).
	// Without it a caller that sends no key is the operator; one that
	// sends a key is that key.
	RequireAuth bool
	// Metrics, when set, serves GET /metrics (Prometheus text format).
	Metrics http.Handler
	// Dockerfiles, when set, builds templates from Dockerfiles.
	Dockerfiles Dockerfiles
	// Registries, when set, serves /v1/registries (registry logins).
	Registries Registries
	// Usage, when set, serves GET /v1/usage.
	Usage Usage
	// History, when set, serves GET /v1/sandboxes/{id}/metrics.
	History History
	// Records, when set, removes ended sandboxes' records and logs.
	Records Records
	// Workspaces, when set, serves workspaces, environments and secrets.
	Workspaces Workspaces
	// Worklog and Review, when set, serve the work log, diff, export and
	// commit endpoints.
	Worklog Worklog
	Review  Reviewer
	// Warm, when set, serves the templates' warm pools.
	Warm    WarmPools
	Version string
	// Isolation is the isolation levels the daemon knows, as GET
	// /v1/health reports them.
	Isolation []types.IsolationLevel
	Logger    *slog.Logger
}

// Server is the HTTP API.
type Server struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	proxy *httputil.ReverseProxy
	// tunnels counts the port tunnels open per sandbox.
	tunnels tunnelCounts
}

// New builds the API server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	s.proxy = s.agentProxy()
	s.routes()
	return s
}

// Handler returns the root HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, types.Health{Status: "ok", Version: s.cfg.Version, Isolation: s.cfg.Isolation})
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	s.cfg.Metrics.ServeHTTP(w, r)
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapiDoc)
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// utc is t as the wire carries it: in UTC, the zero time kept zero (and so
// left out by omitzero).
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}
