// Package agentlink is how the host reaches a sandbox's agent: a readiness
// probe, the HTTP transport the daemon's data-plane proxy uses, a file
// write, and Run, the one way the host runs a command in a sandbox
// (workspace setup, review). It never trusts what the agent answers beyond
// its status codes, and bounds what it reads.
package agentlink

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// Link probes and dials agents.
type Link struct {
	probe     *http.Client
	transport *http.Transport
	conns     *connSet
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
}

// New returns a Link.
func New() *Link {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	// The host ends every connection to an agent with a reset (SO_LINGER
	// 0), so the sandbox's end is closed at once and never lingers in
	// TIME_WAIT or another connected state: gVisor (runsc 2022) refuses
	// to checkpoint a sandbox whose network stack holds a connected
	// endpoint, and a probe's Connection: close would otherwise leave
	// the agent's end in TIME_WAIT for a minute.
	conns := &connSet{}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		return conns.add(addr, c), nil
	}
	return &Link{
		conns: conns,
		dial:  dial,
		probe: &http.Client{
			Timeout: 2 * time.Second,
			// Probes must not keep idle connections into sandboxes.
			Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
		},
		transport: &http.Transport{
			DialContext:         dial,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     30 * time.Second,
			// Streams (process output, watches) are long-lived; no response
			// header timeout for them, but the dial is bounded.
			ForceAttemptHTTP2: false,
		},
	}
}

// Dial opens a connection into a sandbox (addr is its address and a
// port), tracked as the transport's are: CloseTo cuts it. The connection
// can be half-closed (CloseWrite).
func (l *Link) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return l.dial(ctx, network, addr)
}

// Transport is the round tripper for proxied data-plane requests.
func (l *Link) Transport() http.RoundTripper { return l.transport }

// WaitReady polls the agent's /health until it answers 204 or ctx ends.
func (l *Link) WaitReady(ctx context.Context, addr string) error {
	// Poll tightly at first: the agent listens a few milliseconds after
	// it starts. Then the interval grows with the time waited (a tenth of
	// it, at most 20 ms), which bounds what polling adds to a slow start
	// to about 10 % while a burst of creates on a loaded host, each
	// waiting hundreds of milliseconds, does not spend its CPU on
	// thousands of refused connections.
	start := time.Now()
	var last error
	for {
		err := health(ctx, l.probe, addr)
		if err == nil {
			return nil
		}
		last = err
		wait := min(max(time.Since(start)/10, time.Millisecond), 20*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("agent at %s: %v: %w", addr, last, errdefs.ErrUnavailable)
		case <-t.C:
		}
	}
}

// Connect opens a connection to the agent at addr and leaves it idle in
// the transport's pool (a GET /health over it), so the next request there
// skips the dial: a warm sandbox's claim and its first command then
// start on a connection made while it waited (a dial into a sandbox's
// network namespace costs ~0.2 ms). The pool drops it after its idle
// timeout; a later request dials as usual.
func (l *Link) Connect(ctx context.Context, addr string) error {
	return health(ctx, &http.Client{Transport: l.transport}, addr)
}

// health asks the agent at addr for GET /health through hc. The answer is
// read to its end (bounded), so a client that keeps connections keeps
// this one.
func health(ctx context.Context, hc *http.Client, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health answered %s", resp.Status)
	}
	return nil
}

// CloseIdle drops idle connections to agents (after a sandbox ends, and
// before one is checkpointed).
func (l *Link) CloseIdle() { l.transport.CloseIdleConnections() }

// CloseAfterRefusal is a ReverseProxy ModifyResponse hook: when the agent
// refuses a request that carries a body (an upload to a full disk, say),
// the client may still be sending that body, so the client's connection to
// the daemon cannot be reused; Connection: close tells both the daemon's
// server and the client so, instead of leaving the client to discover it
// with its next request.
func CloseAfterRefusal(resp *http.Response) error {
	if resp.StatusCode >= 400 && resp.Request != nil && resp.Request.ContentLength != 0 && resp.Request.Body != nil && resp.Request.Body != http.NoBody {
		resp.Header.Set("Connection", "close")
	}
	return nil
}
