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
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/splice"
	"github.com/berth-sandbox/berth/proto/datagram"
)

// TunnelProtocol is the Upgrade token of a port tunnel: after the daemon
// answers 101 Switching Protocols, the connection carries the bytes of a
// TCP connection to the sandbox's port, both ways. With Upgrade: udp
// (datagram.Protocol) it carries datagrams to and from the sandbox's UDP
// port instead, each framed as package datagram says.
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
//
// With Upgrade: udp the tunnel carries datagrams to and from a UDP port
// of the sandbox (a DNS server, a game server, a metrics collector), each
// framed as package datagram says, from one host socket: the sandbox sees
// one peer per tunnel. Nothing listening is not known at the upgrade (UDP
// has no handshake): such datagrams go unanswered.
func (s *Server) tunnelPort(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		writeError(w, err)
		return
	}
	proto := strings.ToLower(r.Header.Get("Upgrade"))
	if !headerHasToken(r.Header, "Connection", "upgrade") || (proto != TunnelProtocol && proto != datagram.Protocol) {
		writeError(w, badField("upgrade", fmt.Errorf("a port tunnel is an HTTP/1.1 upgrade: want headers Connection: Upgrade and Upgrade: %s or %s (got Upgrade %q): %w",
			TunnelProtocol, datagram.Protocol, r.Header.Get("Upgrade"), errdefs.ErrInvalidArgument)))
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
	// A UDP socket connects without asking the sandbox: nothing
	// listening shows as datagrams that get no answer.
	back, err := s.cfg.Dial(dctx, proto, net.JoinHostPort(host, strconv.Itoa(port)))
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
	if _, err := buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + proto + "\r\n\r\n"); err != nil {
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
	client := &hijacked{Conn: front, buf: buf.Reader}
	var up, down int64
	if proto == datagram.Protocol {
		up, down = relayDatagrams(client, back)
	} else {
		up, down = splice.Conns(client, back)
	}
	s.log.Info("port_tunnel", "sandbox_id", id, "port", port, "protocol", proto, "bytes_in", up, "bytes_out", down,
		"duration_ms", time.Since(start).Milliseconds(), "cut", context.Cause(ctx) != nil)
}

// relayDatagrams carries framed datagrams from client to the sandbox's
// UDP socket back, and back's datagrams to client framed, until client
// ends its stream or either side fails; it closes both and returns the
// payload bytes carried each way. A datagram the sandbox refused (ICMP
// port unreachable, which a connected UDP socket reports at its next
// call) is dropped, as UDP drops it.
func relayDatagrams(client net.Conn, back net.Conn) (up, down int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer client.Close()
		buf := make([]byte, datagram.MaxSize)
		for {
			n, err := back.Read(buf)
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			if err != nil {
				return
			}
			if datagram.Write(client, buf[:n]) != nil {
				return
			}
			down += int64(n)
		}
	}()
	buf, in := make([]byte, datagram.MaxSize), bufio.NewReader(client)
	for {
		n, err := datagram.Read(in, buf)
		if err != nil {
			break
		}
		if _, err := back.Write(buf[:n]); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		up += int64(n)
	}
	back.Close()
	client.Close()
	wg.Wait()
	return up, down
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
