package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/worklog"
)

type agentTarget struct {
	id, addr, token, path string
}

type targetKey struct{}

// agentProxy forwards data-plane requests to a sandbox's agent. The target
// comes from the Manager, never from the request, so a client can reach
// only the sandbox it names, through the daemon.
func (s *Server) agentProxy() *httputil.ReverseProxy {
	// A Connect stream its sandbox's end cut ends with that end as a
	// Connect error (agentlink.EndStreams).
	endStreams := agentlink.EndStreams(func(cause error) bool {
		return errors.Is(cause, errdefs.ErrFailedPrecondition)
	}, func(r *http.Request) {
		t, _ := r.Context().Value(targetKey{}).(agentTarget)
		s.cfg.Manager.CheckRunning(r.Context(), t.id)
	})
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(agentTarget)
			pr.Out.URL = &url.URL{Scheme: "http", Host: t.addr, Path: t.path, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = t.addr
			// The daemon authenticates to the agent; whatever token the
			// client sent is replaced.
			pr.Out.Header.Set("X-Access-Token", t.token)
			// The caller's API key never reaches code in the sandbox.
			pr.Out.Header.Del("X-API-Key")
			if a := pr.Out.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
				pr.Out.Header.Del("Authorization")
			}
		},
		Transport: s.cfg.Transport,
		// Stream process output and watch events as they come.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			_ = agentlink.CloseAfterRefusal(resp)
			return endStreams(resp)
		},
		// A client that goes away mid-stream is routine, not an error.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The sandbox ended (died, OOM-killed, stopped, paused)
			// before its agent answered: say so, with the reason.
			if cause := sandbox.EndCause(r.Context()); cause != nil {
				writeError(w, cause)
				return
			}
			if errors.Is(err, context.Canceled) {
				return
			}
			writeError(w, fmt.Errorf("sandbox agent unreachable: %v: %w", err, errdefs.ErrUnavailable))
		},
	}
}

func (s *Server) proxyAgent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return
	}
	// Bound to the sandbox's ready period: a call into a sandbox that
	// dies ends with the reason instead of waiting on a connection its
	// dead network stack will never reset (gVisor).
	ctx, agent, release, err := s.cfg.Manager.AgentSession(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	// Clients stream request bodies (stdin, uploads) while the answer
	// streams back; without full duplex the HTTP/1 server cuts the body
	// off once response headers are flushed.
	// HTTP/2 is full duplex already and answers ErrNotSupported.
	_ = http.NewResponseController(w).EnableFullDuplex()
	t := agentTarget{id: id, addr: agent.Addr, token: agent.Token, path: "/" + r.PathValue("rest")}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(worklog.WithSandbox(ctx, id, "native"), targetKey{}, t)))
}
