// Package e2bcompat lets the official E2B SDKs drive Berth unchanged. It
// serves E2B's REST control plane (authenticated by API keys, each seeing
// only the sandboxes it created) and E2B's data-plane routing: requests
// naming a sandbox by the E2b-Sandbox-Id/E2b-Sandbox-Port headers or by a
// preview Host "<port>-<id>.<domain>" are proxied to that port of the
// sandbox (49983 is the agent). It is mounted as the daemon's root handler
// and hands everything under /v1 to the native API. It owns no lifecycle: it
// translates and calls the sandbox Manager.
package e2bcompat

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/proto/envd"
)

// Manager is what the E2B API needs from the sandbox Manager.
type Manager interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	ListOwned(ctx context.Context, opts sandbox.OwnedListOptions) ([]sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.Sandbox, error)
	Destroy(ctx context.Context, id, reason string) error
	SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error)
	AgentSession(ctx context.Context, id string) (context.Context, sandbox.AgentEndpoint, context.CancelFunc, error)
	CheckRunning(ctx context.Context, id string)
	SetNetworkPolicy(ctx context.Context, id string, p policy.Policy) (policy.Policy, error)
	Pause(ctx context.Context, id string) (sandbox.Sandbox, error)
	Resume(ctx context.Context, id string, timeout time.Duration) (sandbox.Sandbox, error)
	Snapshots
}

// Store persists what only this API knows about a sandbox.
type Store interface {
	PutE2BSandbox(ctx context.Context, s core.E2BSandbox) error
	GetE2BSandbox(ctx context.Context, id string) (core.E2BSandbox, error)
}

// Config wires the E2B API to the daemon's subsystems.
type Config struct {
	Manager Manager
	Store   Store
	Keys    *Keys
	// Transport carries proxied requests into sandboxes.
	Transport http.RoundTripper
	// Domain is the preview domain: getHost(port) is "<port>-<id>.<Domain>".
	Domain string
	// DefaultNetwork is what allow_internet_access: true means: "open"
	// (or empty: the internet, within the operator's egress ceiling) or
	// "none" (no egress; allowOut entries are still let out).
	DefaultNetwork string
	// NoSudo creates E2B sandboxes with no_new_privs like native ones.
	// By default they get sandbox.CreateRequest.AllowSudo: E2B's base
	// image lets its user sudo, and E2B's SDK tests and users' agents
	// rely on it.
	NoSudo bool
	// Native serves everything under /v1 (Berth's own API).
	Native http.Handler
	// History, when set, holds the sandboxes' usage over time for
	// getMetrics; without it getMetrics answers [].
	History History
	// Records, when set, reads what the host recorded of a sandbox (its
	// lifecycle events and its work log) for E2B's sandbox logs; without
	// it they answer 501.
	Records func(ctx context.Context, id string) ([]types.Event, []types.WorklogEntry, error)
	// Templates, when set, serves E2B's template API (templates.go) with
	// its uploads and tags kept in TemplateDir.
	Templates   TemplateBuilder
	TemplateDir string
	// Builds keeps the template builds and their logs; without it (and
	// a Store that keeps them) the template API answers 501.
	Builds BuildStore
	// BuildContext bounds the builds the template API runs in the
	// background (the daemon's lifetime).
	BuildContext context.Context
	// Volumes, when set, serves E2B's volumes (volumes.go); without it
	// they answer 501.
	Volumes Volumes
	Logger  *slog.Logger
}

// Server is the daemon's root handler.
type Server struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	proxy *httputil.ReverseProxy

	// tpl serves E2B's template API; nil answers it with 501.
	tpl *templateAPI
}

// New builds the root handler.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Domain == "" {
		cfg.Domain = DefaultDomain
	}
	cfg.Domain = strings.ToLower(strings.TrimSuffix(cfg.Domain, "."))
	if cfg.Native == nil {
		cfg.Native = http.NotFoundHandler()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	s.proxy = s.sandboxProxy()
	if cfg.Templates != nil {
		bctx := cfg.BuildContext
		if bctx == nil {
			bctx = context.Background()
		}
		if cfg.Builds == nil {
			// The daemon's store keeps both.
			cfg.Builds, _ = cfg.Store.(BuildStore)
		}
		if cfg.Builds != nil {
			s.tpl = newTemplateAPI(bctx, cfg.Templates, cfg.Builds, cfg.TemplateDir, cfg.Logger)
		}
	}
	s.routes()
	return s
}

// ServeHTTP dispatches: sandbox traffic (by header, then by preview Host)
// first, then the native API under /v1, then the E2B control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok, err := e2bwire.Target(r, s.cfg.Domain, envd.Port); err != nil {
		writeErr(w, err)
		return
	} else if ok {
		s.serveSandbox(w, r, id, port)
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		// A signed URL built against E2B_SANDBOX_URL names no sandbox.
		s.serveSignedFiles(w, r)
		return
	}
	if r.URL.Path == "/v1" || strings.HasPrefix(r.URL.Path, "/v1/") {
		s.cfg.Native.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// DefaultDomain is the preview domain when the daemon configures none.
const DefaultDomain = e2bwire.DefaultDomain

// DefaultUser is the user E2B sandboxes run commands as when a request
// names none.
const DefaultUser = e2bwire.DefaultUser

// ParseHost splits a preview host "<port>-<id>.<domain>[:listen-port]"
// (e2bwire.ParseHost).
func ParseHost(host, domain string) (id string, port int, ok bool) {
	return e2bwire.ParseHost(host, domain)
}

// validID is the sandbox-ID grammar every layer shares.
func validID(id string) bool { return types.ValidSandboxID(id) == nil }

// The wire helpers every route of this API answers with (e2bwire's).
func writeError(w http.ResponseWriter, status int, msg string) { e2bwire.WriteError(w, status, msg) }
func writeErr(w http.ResponseWriter, err error)                { e2bwire.WriteErr(w, err) }
func writeJSON(w http.ResponseWriter, status int, v any)       { e2bwire.WriteJSON(w, status, v) }
func sandboxGone(w http.ResponseWriter, id string)             { e2bwire.SandboxGone(w, id) }
func decode(r *http.Request, v any) error                      { return e2bwire.Decode(r, v) }
