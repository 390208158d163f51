package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/datagram"
)

// PortConn is a TCP connection to a port in a sandbox, through the daemon
// (DialPort). Closing it closes the connection; CloseWrite half-closes it
// (the sandbox's server reads an end of input and can still answer).
type PortConn struct {
	rwc    io.ReadWriteCloser
	cancel context.CancelFunc
	once   sync.Once
}

func (c *PortConn) Read(p []byte) (int, error)  { return c.rwc.Read(p) }
func (c *PortConn) Write(p []byte) (int, error) { return c.rwc.Write(p) }

// Close closes the connection, both ways.
func (c *PortConn) Close() error {
	err := c.rwc.Close()
	c.once.Do(c.cancel)
	return err
}

// CloseWrite ends what is sent: the sandbox's server reads the end of its
// input, and what it sends still arrives.
func (c *PortConn) CloseWrite() error {
	if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("half-close: %w", errdefs.ErrNotImplemented)
}

// DialPort opens a TCP connection to port in the sandbox, through the
// daemon's port tunnel (GET /v1/sandboxes/{id}/tunnel/{port}, an HTTP/1.1
// upgrade), for servers that do not speak HTTP (PortTransport carries
// HTTP): a database, a debugger, a language server. ctx bounds the dial
// only; the connection lasts until it is closed or the sandbox ends (a
// pause, a kill or its timeout close it). Nothing listening on the port is
// an unavailable error naming the field port. The daemon must be reached
// over HTTP/1.1 (http:// or unix://; an https:// daemon that negotiates
// HTTP/2 cannot upgrade).
func (s *Sandbox) DialPort(ctx context.Context, port int) (*PortConn, error) {
	rwc, cancel, err := s.dialTunnel(ctx, port, "tcp")
	if err != nil {
		return nil, err
	}
	return &PortConn{rwc: rwc, cancel: cancel}, nil
}

// UDPConn is a UDP port of a sandbox, through the daemon (DialUDP): each
// Write sends one datagram to the port, each Read returns one the
// sandbox's server sent back (cut to the buffer, as a UDP socket cuts
// it). The sandbox's server sees one peer per UDPConn.
type UDPConn struct {
	c      *datagram.Conn
	cancel context.CancelFunc
	once   sync.Once
}

// Read reads one datagram into p.
func (c *UDPConn) Read(p []byte) (int, error) { return c.c.Read(p) }

// Write sends p, at most datagram.MaxSize bytes, as one datagram.
func (c *UDPConn) Write(p []byte) (int, error) { return c.c.Write(p) }

// Close ends the tunnel.
func (c *UDPConn) Close() error {
	err := c.c.Close()
	c.once.Do(c.cancel)
	return err
}

// DialUDP opens a UDP tunnel to port in the sandbox, through the daemon
// (the port tunnel upgraded to udp): a DNS server, a game server, a
// metrics collector. As with DialPort, ctx bounds the dial only and the
// tunnel ends with the sandbox. UDP has no handshake: a port nobody
// listens on is not an error here; its datagrams get no answer.
func (s *Sandbox) DialUDP(ctx context.Context, port int) (*UDPConn, error) {
	rwc, cancel, err := s.dialTunnel(ctx, port, datagram.Protocol)
	if err != nil {
		return nil, err
	}
	return &UDPConn{c: datagram.NewConn(rwc), cancel: cancel}, nil
}

// dialTunnel opens a port tunnel of protocol proto (tcp or udp) and
// returns its connection and what ends its request.
func (s *Sandbox) dialTunnel(ctx context.Context, port int, proto string) (io.ReadWriteCloser, context.CancelFunc, error) {
	c, err := s.client()
	if err != nil {
		return nil, nil, err
	}
	if port < 1 || port > 65535 {
		return nil, nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "port", Message: fmt.Sprintf("port %d: want 1 to 65535", port)}
	}
	// The request's context outlives the dial: a transport may tie an
	// upgraded connection to it. ctx ends the dial only.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.endpoint(sandboxPath(s.ID)+"/tunnel/"+strconv.Itoa(port), nil), nil)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	resp, err := c.hc.Do(req)
	if !stop() {
		// ctx ended during the dial.
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, nil, c.unreachable(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		cancel()
		if resp.StatusCode/100 == 2 {
			return nil, nil, fmt.Errorf("port tunnel to %s port %d: the daemon answered %s instead of switching protocols (an HTTP/2 connection cannot upgrade): %w",
				s.ID, port, resp.Status, errdefs.ErrUnavailable)
		}
		return nil, nil, decodeError(resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok || !strings.EqualFold(resp.Header.Get("Upgrade"), proto) {
		resp.Body.Close()
		cancel()
		return nil, nil, fmt.Errorf("port tunnel to %s port %d: the daemon switched to %q, not %s: %w", s.ID, port, resp.Header.Get("Upgrade"), proto, errdefs.ErrUnavailable)
	}
	return rwc, cancel, nil
}
