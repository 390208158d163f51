package e2bcompat

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/worklog"
	"github.com/berth-sandbox/berth/proto/envd"
)

// TrafficTokenHeader carries a sandbox's traffic access token on preview
// traffic when the sandbox was created with allowPublicTraffic: false.
const TrafficTokenHeader = e2bwire.TrafficTokenHeader

type target struct {
	id   string
	addr string // sandbox IP:port
	// token replaces whatever X-Access-Token the client sent; "" removes
	// it (signed /files URLs, preview traffic).
	token   string
	preview bool
}

type targetKey struct{}

// sandboxProxy forwards data-plane requests into sandboxes. The address
// comes from the Manager, never from the request: a client reaches only the
// sandbox and port it names, and only through the daemon.
func (s *Server) sandboxProxy() *httputil.ReverseProxy {
	// A Connect stream its sandbox's end cut ends with that end as a
	// Connect error (agentlink.EndStreams), which the SDKs raise.
	endStreams := agentlink.EndStreams(func(cause error) bool {
		return errors.Is(cause, errdefs.ErrFailedPrecondition)
	}, func(r *http.Request) {
		t, _ := r.Context().Value(targetKey{}).(target)
		s.cfg.Manager.CheckRunning(r.Context(), t.id)
	})
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.Out.URL = &url.URL{Scheme: "http", Host: t.addr, Path: pr.In.URL.Path, RawPath: pr.In.URL.RawPath, RawQuery: pr.In.URL.RawQuery}
			h := pr.Out.Header
			// Berth's own credentials never reach code in the sandbox.
			h.Del("X-API-Key")
			h.Del(TrafficTokenHeader)
			h.Del("E2b-Sandbox-Id")
			h.Del("E2b-Sandbox-Port")
			h.Del("X-Access-Token")
			if t.token != "" {
				h.Set("X-Access-Token", t.token)
			}
			if t.preview {
				// Servers in the sandbox see the host the client used.
				pr.Out.Host = pr.In.Host
				pr.SetXForwarded()
			} else {
				pr.Out.Host = t.addr
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
			t, _ := r.Context().Value(targetKey{}).(target)
			if sandbox.EndCause(r.Context()) != nil {
				// The sandbox ended (died, OOM-killed, stopped, paused)
				// before it answered.
				sandboxGone(w, t.id)
				return
			}
			if errors.Is(err, context.Canceled) {
				return
			}
			_, port, _ := net.SplitHostPort(t.addr)
			// 502 is what E2B's proxy answers when nothing serves the port;
			// the SDKs read it as "sandbox gone or port closed".
			writeJSON(w, http.StatusBadGateway, map[string]any{
				"code": http.StatusBadGateway, "message": "nothing answers on port " + port + " in the sandbox: " + err.Error(), "port": port,
			})
		},
	}
}

// serveSandbox authorizes a data-plane request and proxies it.
//
// Port 49983 (the agent) needs the sandbox's envdAccessToken in
// X-Access-Token, or the API key that owns the sandbox in X-API-Key, or (for
// /files) a URL signature made with the token, which the agent checks
// itself. Other ports are preview traffic: open, as on E2B, unless the
// sandbox was created with allowPublicTraffic: false, in which case the
// trafficAccessToken from create must come in E2b-Traffic-Access-Token (the
// SDKs do not send it themselves; the caller adds it, as on E2B).
func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, id string, port int) {
	if !validID(id) {
		sandboxGone(w, id)
		return
	}
	// Bound to the sandbox's ready period: a call into a sandbox that
	// dies ends instead of waiting on a connection its dead network stack
	// will never reset (gVisor).
	ctx, agent, release, err := s.cfg.Manager.AgentSession(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		sandboxGone(w, id)
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	defer release()
	token := agent.Token
	host, _, err := net.SplitHostPort(agent.Addr)
	if err != nil {
		writeErr(w, err)
		return
	}
	t := target{id: id, addr: net.JoinHostPort(host, strconv.Itoa(port))}
	if port == envd.Port {
		switch {
		case equal(r.Header.Get("X-Access-Token"), token), s.ownerKey(r, id):
			t.token = token
		case r.URL.Path == "/files" && r.URL.Query().Get("signature") != "":
			// The agent verifies the signature against its token.
		default:
			writeError(w, http.StatusUnauthorized, "unauthorized access to sandbox "+id+": send its envdAccessToken in X-Access-Token")
			return
		}
	} else {
		t.preview = true
		ext, err := s.cfg.Store.GetE2BSandbox(r.Context(), id)
		if err != nil {
			writeErr(w, err)
			return
		}
		if ext.TrafficToken != "" && !equal(r.Header.Get(TrafficTokenHeader), ext.TrafficToken) {
			writeError(w, http.StatusForbidden, "sandbox "+id+" does not allow public traffic: send its trafficAccessToken in "+TrafficTokenHeader)
			return
		}
	}
	// The SDKs stream request bodies (chunked); the agent may answer before
	// the last chunk is copied. Without full duplex, Go's HTTP/1 server
	// cuts the request body off once the response headers are flushed, the
	// copy to the agent fails and the stream dies mid-way ("terminated").
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.log.Debug("full_duplex_unavailable", "err", err)
	}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(worklog.WithSandbox(ctx, id, "e2b"), targetKey{}, t)))
}

// ownerKey reports whether the request carries the API key that owns
// sandbox id.
func (s *Server) ownerKey(r *http.Request, id string) bool {
	if auth.Secret(r) == "" && !auth.IsLocal(r.Context()) {
		return false
	}
	p, err := auth.Identify(r, s.cfg.Keys, true)
	if err != nil {
		return false
	}
	sb, err := s.cfg.Manager.Get(r.Context(), id)
	return err == nil && p.Sees(sb.Owner)
}

func equal(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// serveSignedFiles serves a signed /files URL that names no sandbox (the
// SDKs build them against E2B_SANDBOX_URL, with only path, username and
// signature in them): the sandbox is the one whose access token made the
// signature. Every live sandbox's signature is computed and compared in
// constant time, with no early exit, so the answer's timing says nothing
// about which sandbox or how many; the agent then checks the signature
// again itself. Expired and unknown signatures are 401, as the agent
// answers them.
func (s *Server) serveSignedFiles(w http.ResponseWriter, r *http.Request) {
	op, exp, err := e2bwire.SignedFiles(r)
	if op == "" {
		w.Header().Set("Allow", "GET, HEAD, POST")
		writeError(w, http.StatusMethodNotAllowed, r.Method+" /files: want GET (download) or POST (upload)")
		return
	}
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	q := r.URL.Query()
	if exp != 0 && exp < time.Now().Unix() {
		writeError(w, http.StatusUnauthorized, "signature is already expired")
		return
	}
	sbs, err := s.cfg.Manager.List(r.Context(), sandbox.ListOptions{States: []string{string(sandbox.StateReady)}})
	if err != nil {
		writeErr(w, err)
		return
	}
	sig := []byte(q.Get("signature"))
	path, user := q.Get("path"), q.Get("username")
	found := ""
	for _, sb := range sbs {
		if sb.Token == "" {
			continue
		}
		want := envd.FileSignature(path, op, user, sb.Token, exp)
		if subtle.ConstantTimeCompare([]byte(want), sig) == 1 {
			found = sb.ID
		}
	}
	if found == "" {
		writeError(w, http.StatusUnauthorized, "invalid signature: it was not made for this path and operation by any running sandbox's access token")
		return
	}
	s.serveSandbox(w, r, found, envd.Port)
}
