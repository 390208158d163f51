package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/splice"
)

// TunnelProtocol is the Upgrade token of a port tunnel: after the daemon
// answers 101 Switching Protocols, the connection carries the bytes of a
// TCP connection to the sandbox's port, both ways.
const TunnelProtocol = "tcp"

// maxTunnels bounds the tunnels open into one sandbox at once: each holds
// two of the daemon's descriptors, which every sandbox shares.
const maxTunnels = 256

// tunnelDialTimeout bounds the connection to the sandbox's port.
const tunnelDialTimeout = 10 * time.Second

// tunnelCounts is the number of open tunnels per sandbox.
type tunnelCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// take counts one more tunnel into id, or reports false at the bound.
func (c *tunnelCounts) take(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[id] >= maxTunnels {
		return false
	}
	c.n[id]++
	return true
}

// open is the number of tunnels open into id.
func (c *tunnelCounts) open(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func (c *tunnelCounts) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[id]--; c.n[id] <= 0 {
		delete(c.n, id)
	}
}

// tunnelPort is GET /v1/sandboxes/{id}/tunnel/{port} with Connection:
// Upgrade and Upgrade: tcp: a TCP connection to whatever listens on port
// in the sandbox (a database, a debugger, a language server, anything
// that is not HTTP; the ports route carries HTTP), as `ssh -L` or
// `kubectl port-forward` would give. The daemon connects first, so a port
// nobody listens on is a 502 JSON error and no upgrade; then it answers
// 101 and copies bytes both ways until both sides have closed, passing a
// half-close on (a client that shuts down its writing still reads the
// answer). The tunnel counts as an attached stream (a sandbox that pauses
// when idle does not while one is open; one that resumes on demand
// resumes for it) and ends with the sandbox: a pause, a kill or its
// timeout closes it. HTTP/1.1 only (HTTP/2 has no upgrade).
func (s *Server) tunnelPort(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		writeError(w, err)
		return
	}
	if !headerHasToken(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), TunnelProtocol) {
		writeError(w, badField("upgrade", fmt.Errorf("a port tunnel is an HTTP/1.1 upgrade: want headers Connection: Upgrade and Upgrade: %s (got Upgrade %q): %w",
			TunnelProtocol, r.Header.Get("Upgrade"), errdefs.ErrInvalidArgument)))
		return
	}
	id, ctx, agent, release, ok := s.agentSession(w, r)
	if !ok {
		return
	}
	defer release()
	if !s.tunnels.take(id) {
		writeError(w, fmt.Errorf("sandbox %s has %d port tunnels open, the most it may: %w", id, maxTunnels, errdefs.ErrResourceExhausted))
		return
	}
	defer s.tunnels.drop(id)
	host, _, err := net.SplitHostPort(agent.Addr)
	if err != nil {
		writeError(w, err)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, tunnelDialTimeout)
	back, err := s.cfg.Dial(dctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	cancel()
	if err != nil {
		writeJSON(w, http.StatusBadGateway, errorBody{Code: errdefs.CodeUnavailable, Field: "port",
			Message: fmt.Sprintf("nothing answers on port %d in sandbox %s: %v", port, id, err)})
		return
	}
	defer back.Close()
	front, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, badField("upgrade", fmt.Errorf("a port tunnel needs HTTP/1.1 (this connection cannot be taken over: %v): %w", err, errdefs.ErrInvalidArgument)))
		return
	}
	defer front.Close()
	// Hijacked connections keep the server's deadlines; a tunnel has none.
	_ = front.SetDeadline(time.Time{})
	if _, err := buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + TunnelProtocol + "\r\n\r\n"); err != nil {
		return
	}
	if err := buf.Flush(); err != nil {
		return
	}
	// The sandbox's end (a kill, a pause) or the daemon's closes both.
	stop := context.AfterFunc(ctx, func() {
		front.Close()
		back.Close()
	})
	defer stop()
	start := time.Now()
	up, down := splice.Conns(&hijacked{Conn: front, buf: buf.Reader}, back)
	s.log.Info("port_tunnel", "sandbox_id", id, "port", port, "bytes_in", up, "bytes_out", down,
		"duration_ms", time.Since(start).Milliseconds(), "cut", context.Cause(ctx) != nil)
}

// hijacked is a taken-over client connection. What the server's buffer
// holds (bytes the client sent with its request) is read first, then the
// connection itself: reading on through the server's reader would hand
// the client's half-close to the server, which ends the request's context
// at that end of input, and with it the tunnel.
type hijacked struct {
	net.Conn
	buf *bufio.Reader
}

func (h *hijacked) Read(p []byte) (int, error) {
	if n := h.buf.Buffered(); n > 0 {
		return h.buf.Read(p[:min(len(p), n)])
	}
	return h.Conn.Read(p)
}

func (h *hijacked) CloseWrite() error {
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// headerHasToken reports whether header name of h lists token (comma
// separated, any case).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
