package api

import (
	"cmp"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/proto/envd"
)

// proxyPort is /v1/sandboxes/{id}/ports/{port}/…: the request goes on to
// whatever listens on port in the sandbox (a web app's preview, an API
// the agent started), with the rest of the path, its query and its Host,
// streaming both ways and upgrades (WebSocket) included. The caller needs
// the sandbox as for any of its routes; the server gets neither the
// caller's API key nor the agent's token. This is the route the
// Kubernetes gateway reaches a sandbox's ports by, through its node, and
// E2B's preview hosts on the daemon do the same on the preview listener.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		writeError(w, err)
		return
	}
	s.proxyInto(w, r, func(id string, agent sandbox.AgentEndpoint) (agentTarget, error) {
		host, _, err := net.SplitHostPort(agent.Addr)
		if err != nil {
			return agentTarget{}, err
		}
		return agentTarget{id: id, addr: net.JoinHostPort(host, strconv.Itoa(port)), path: "/" + r.PathValue("rest"), port: true}, nil
	}, nil)
}

// parsePort reads a sandbox port of the ports route: 1 to 65535, not the
// agent's (which /agent/ reaches, with the daemon's token).
func parsePort(s string) (int, error) {
	port, err := strconv.Atoi(s)
	switch {
	case err != nil || port < 1 || port > 65535:
		return 0, badField("port", fmt.Errorf("port %q: want a number from 1 to 65535: %w", s, errdefs.ErrInvalidArgument))
	case port == envd.Port:
		return 0, badField("port", fmt.Errorf("port %d is the agent's: reach it under /agent/: %w", port, errdefs.ErrInvalidArgument))
	}
	return port, nil
}

// forwardTo sets the X-Forwarded headers of a request to a sandbox's
// server, and its Host: the client's, as an earlier proxy (the
// Kubernetes gateway and node) reports it in X-Forwarded-Host, else the
// request's own. An API caller that names another host changes only what
// the sandbox's server is told, which the caller could tell it anyway.
func forwardTo(pr *httputil.ProxyRequest) {
	in := pr.In.Header
	host := cmp.Or(in.Get("X-Forwarded-Host"), pr.In.Host)
	if v := in.Values("X-Forwarded-For"); len(v) > 0 {
		pr.Out.Header["X-Forwarded-For"] = slices.Clone(v)
	}
	pr.SetXForwarded()
	if p := in.Get("X-Forwarded-Proto"); p != "" {
		pr.Out.Header.Set("X-Forwarded-Proto", p)
	}
	pr.Out.Header.Set("X-Forwarded-Host", host)
	pr.Out.Host = host
}
