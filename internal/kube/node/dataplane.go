package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// DataPlanePrefix is where the kubelet API's TLS server also carries
// Berth's data plane for the gateway (berth serve --kubernetes):
// DataPlanePrefix + /v1/sandboxes/{sandbox}/agent/… reaches that sandbox's
// agent through the daemon on this host, …/ports/{port}/… a server
// listening on that port in the sandbox (with the X-Forwarded headers of
// the gateway, so it sees the client's Host), …/tunnel/{port} a TCP
// connection to that port, and the ReviewRoutes read what
// the daemon recorded of it. It is served only to clients whose
// certificate the node's --client-ca signed (the kubelet API's mutual
// TLS), and only for the sandboxes of pods on this node.
const DataPlanePrefix = "/berth"

// ReviewRoutes are the daemon's read-only routes of a sandbox (under
// /v1/sandboxes/{id}/) the data plane also carries: its events, its
// egress policy, the egress decisions the host logged and the policy they
// suggest, its work log, its diff and its usage over time.
var ReviewRoutes = []string{"events", "network", "network/log", "network/suggest", "worklog", "diff", "metrics"}

// dataPath is the daemon path a data-plane request goes to, set by the
// route that took it.
type dataPath struct{}

// forwarded marks a request to a sandbox's port: its X-Forwarded headers
// (the gateway's, naming the client and the Host it used) go on to the
// daemon, which gives the sandbox's server that Host.
type forwarded struct{}

// handleDataPlane registers the data plane's routes on mux.
func handleDataPlane(mux *http.ServeMux, socket string, owns func(id string) bool, log *slog.Logger) {
	h := dataPlane(socket, owns, log)
	route := func(pattern string, rest func(*http.Request) string) {
		mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			path := "/v1/sandboxes/" + r.PathValue("id") + "/" + rest(r)
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), dataPath{}, path)))
		}))
	}
	route(DataPlanePrefix+"/v1/sandboxes/{id}/agent/{rest...}", func(r *http.Request) string { return "agent/" + r.PathValue("rest") })
	// The daemon checks the port (a number, not the agent's).
	mux.Handle(DataPlanePrefix+"/v1/sandboxes/{id}/ports/{port}/{rest...}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := "/v1/sandboxes/" + r.PathValue("id") + "/ports/" + url.PathEscape(r.PathValue("port")) + "/" + r.PathValue("rest")
		ctx := context.WithValue(context.WithValue(r.Context(), dataPath{}, path), forwarded{}, true)
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
	// A TCP connection to a port of the sandbox (an HTTP/1.1 upgrade the
	// proxy carries through); the daemon checks the port.
	route("GET "+DataPlanePrefix+"/v1/sandboxes/{id}/tunnel/{port}", func(r *http.Request) string { return "tunnel/" + url.PathEscape(r.PathValue("port")) })
	// A snapshot of the sandbox, taken by its daemon (snapshots.go).
	route("POST "+DataPlanePrefix+"/v1/sandboxes/{id}/snapshots", func(*http.Request) string { return "snapshots" })
	for _, rt := range ReviewRoutes {
		route("GET "+DataPlanePrefix+"/v1/sandboxes/{id}/"+rt, func(*http.Request) string { return rt })
	}
	// The daemon's view of the sandbox: its usage now, for the gateway's
	// get.
	mux.Handle("GET "+DataPlanePrefix+"/v1/sandboxes/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), dataPath{}, "/v1/sandboxes/"+r.PathValue("id"))))
	}))
}

// ownsSandbox reports whether id is the sandbox of a pod this node runs
// (and has not been told to delete).
func (p *Pods) ownsSandbox(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ps := range p.pods {
		if ps.sandboxID == id && !ps.deleted {
			return true
		}
	}
	return false
}

// dataPlane proxies the gateway's data-plane requests to the daemon's
// root-only socket. The daemon answers there as to the operator, so the
// checks that matter are here: the client's certificate (the TLS server's)
// and that the sandbox is one of this node's pods', never any other
// sandbox of the host.
func dataPlane(socket string, owns func(id string) bool, log *slog.Logger) http.Handler {
	proxy := daemonProxy(socket, log)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := types.ValidSandboxID(id); err != nil {
			writeError(w, err)
			return
		}
		if !owns(id) {
			writeError(w, fmt.Errorf("sandbox %s is no pod's on this node: %w", id, errdefs.ErrNotFound))
			return
		}
		// Request bodies (stdin, uploads) stream while the answer does;
		// HTTP/2 is full duplex already.
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})
}

// daemonProxy forwards a request to the daemon's socket at its dataPath,
// streaming both ways, the caller's key dropped.
func daemonProxy(socket string, log *slog.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: "http", Host: "berth",
				Path:     pr.In.Context().Value(dataPath{}).(string),
				RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = "berth"
			if fwd, _ := pr.In.Context().Value(forwarded{}).(bool); fwd {
				for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
					if v := pr.In.Header.Values(h); len(v) > 0 {
						pr.Out.Header[h] = v
					}
				}
			}
			DropAPIKey(pr.Out.Header)
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			MaxIdleConnsPerHost: 64,
		},
		// Process output and watch events stream as they come.
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			writeError(w, fmt.Errorf("berth daemon unreachable: %v: %w", err, errdefs.ErrUnavailable))
		},
	}
}

// DropAPIKey removes a caller's API key from a request going on to a
// sandbox's agent: the X-API-Key header and a bearer Authorization. A
// key is for the hop that checks it (the gateway); the Basic
// Authorization that names the agent's user goes on.
func DropAPIKey(h http.Header) {
	h.Del("X-API-Key")
	if a := h.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		h.Del("Authorization")
	}
}

// writeError answers err as the Berth API does: its class's status and
// a JSON errdefs.Error.
func writeError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errdefs.HTTPStatus(err))
	_ = json.NewEncoder(w).Encode(errdefs.Body(err)) // the client went away: nobody to tell
}
