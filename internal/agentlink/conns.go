package agentlink

import (
	"errors"
	"net"
	"sync"
)

// connSet is every open connection the Link holds into sandboxes (to
// their agents and, for the data plane, their other ports), by sandbox
// address (the host part of the dialed address), so that a sandbox about to be checkpointed can be cut off from
// the host first: gVisor (runsc 2022) refuses to save a network stack
// with a connected endpoint, and a failed save ends the sandbox.
type connSet struct {
	mu sync.Mutex
	m  map[string]map[*trackedConn]struct{}
}

// trackedConn is a connection that leaves its set when it is closed.
type trackedConn struct {
	net.Conn
	set  *connSet
	host string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.set.remove(c) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection, when it can be.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// add tracks c, dialed to addr (host:port).
func (s *connSet) add(addr string, c net.Conn) net.Conn {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	t := &trackedConn{Conn: c, set: s, host: host}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]map[*trackedConn]struct{}{}
	}
	if s.m[host] == nil {
		s.m[host] = map[*trackedConn]struct{}{}
	}
	s.m[host][t] = struct{}{}
	return t
}

func (s *connSet) remove(c *trackedConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m[c.host], c)
	if len(s.m[c.host]) == 0 {
		delete(s.m, c.host)
	}
}

// open counts the connections to host.
func (s *connSet) open(host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m[host])
}

// CloseTo closes every connection the Link has to the sandbox at host
// (an IP address), to its agent or another of its ports, idle or
// carrying a request or stream (which then fails), and returns once they
// are closed: each ends with a reset (see New), so the sandbox's end is
// closed too, not left connected. A sandbox's pause calls it before the
// checkpoint. Connections dialed after it are not affected.
func (l *Link) CloseTo(host string) {
	l.conns.mu.Lock()
	var cs []*trackedConn
	for c := range l.conns.m[host] {
		cs = append(cs, c)
	}
	l.conns.mu.Unlock()
	for _, c := range cs {
		_ = c.Close() // already closed by its user is fine
	}
}
