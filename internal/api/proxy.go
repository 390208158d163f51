package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	// port is a server of the sandbox's own (ports.go), not its agent:
	// no token goes to it, and it sees the Host the client used.
	port bool
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
			// client sent is replaced, and a server of the sandbox's own
			// gets none.
			pr.Out.Header.Del("X-Access-Token")
			if t.port {
				forwardTo(pr)
			} else {
				pr.Out.Header.Set("X-Access-Token", t.token)
			}
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
			if t, _ := r.Context().Value(targetKey{}).(agentTarget); t.port {
				// 502, as a proxy answers when nothing serves behind it.
				_, port, _ := net.SplitHostPort(t.addr)
				writeJSON(w, http.StatusBadGateway, errorBody{Code: errdefs.CodeUnavailable, Field: "port",
					Message: "nothing answers on port " + port + " in sandbox " + t.id + ": " + err.Error()})
				return
			}
			writeError(w, fmt.Errorf("sandbox agent unreachable: %v: %w", err, errdefs.ErrUnavailable))
		},
	}
}

func (s *Server) proxyAgent(w http.ResponseWriter, r *http.Request) {
	s.proxyInto(w, r, func(id string, agent sandbox.AgentEndpoint) (agentTarget, error) {
		return agentTarget{id: id, addr: agent.Addr, token: agent.Token, path: "/" + r.PathValue("rest")}, nil
	}, func(ctx context.Context, id string) context.Context { return worklog.WithSandbox(ctx, id, "native") })
}

// agentSession is the session of sandbox {id} of r (Manager.AgentSession)
// for a data-plane route; ok is false once it answered w with the error.
// The context is bound to the sandbox's ready period: a call into a
// sandbox that dies ends with the reason instead of waiting on a
// connection its dead network stack will never reset (gVisor).
func (s *Server) agentSession(w http.ResponseWriter, r *http.Request) (string, context.Context, sandbox.AgentEndpoint, context.CancelFunc, bool) {
	id := r.PathValue("id")
	if err := validID(id); err != nil {
		writeError(w, err)
		return "", nil, sandbox.AgentEndpoint{}, nil, false
	}
	ctx, agent, release, err := s.cfg.Manager.AgentSession(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return "", nil, sandbox.AgentEndpoint{}, nil, false
	}
	return id, ctx, agent, release, true
}

// proxyInto proxies r to the target that target makes of sandbox {id}'s
// agent endpoint, in a context wrap may add to.
func (s *Server) proxyInto(w http.ResponseWriter, r *http.Request, target func(string, sandbox.AgentEndpoint) (agentTarget, error), wrap func(context.Context, string) context.Context) {
	id, ctx, agent, release, ok := s.agentSession(w, r)
	if !ok {
		return
	}
	defer release()
	t, err := target(id, agent)
	if err != nil {
		writeError(w, err)
		return
	}
	// Clients stream request bodies (stdin, uploads) while the answer
	// streams back; without full duplex the HTTP/1 server cuts the body
	// off once response headers are flushed.
	// HTTP/2 is full duplex already and answers ErrNotSupported.
	_ = http.NewResponseController(w).EnableFullDuplex()
	if wrap != nil {
		ctx = wrap(ctx, id)
	}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, t)))
}
