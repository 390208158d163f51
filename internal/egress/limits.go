package egress

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/audit"
)

// Limits bound what one sandbox can make the daemon hold or do on its
// behalf: every connection it opens is a descriptor (two once dialed) and
// a goroutine in the daemon, every DNS query is work outside its cgroup.
// Past a limit the sandbox is refused, cheaply and at once; its
// neighbours, and the daemon's API, keep their share.
type Limits struct {
	// MaxConns bounds a sandbox's open proxied connections (default 256).
	MaxConns int
	// MaxPending bounds its connections to ports 80 and 443 that have not
	// sent a byte yet (default 32); FirstByte is how long one may stay
	// silent before it is closed (default 5 s).
	MaxPending int
	FirstByte  time.Duration
	// TotalConns bounds the proxied connections of all sandboxes together
	// (default: what the daemon's descriptor limit leaves after a reserve
	// for the API, the store and the agents; see FDBudget).
	TotalConns int
	// ConnRate and ConnBurst bound the connections a sandbox opens per
	// second (default 100, burst 200): each costs the daemon a name
	// resolution, a dial and, when intercepted, a TLS handshake, so
	// opening and closing them fast must not be free either.
	ConnRate  float64
	ConnBurst int
	// DNSRate and DNSBurst bound a sandbox's DNS queries per second
	// (default 100, burst 200); queries past them are dropped unanswered,
	// as a congested resolver would.
	DNSRate  float64
	DNSBurst int
	// DNSTCPConns bounds its concurrent DNS-over-TCP connections (default
	// 8).
	DNSTCPConns int
}

func (l Limits) withDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = 256
	}
	if l.MaxPending <= 0 {
		l.MaxPending = 32
	}
	if l.FirstByte <= 0 {
		l.FirstByte = 5 * time.Second
	}
	if l.TotalConns <= 0 {
		l.TotalConns = FDBudget()
	}
	if l.ConnRate <= 0 {
		l.ConnRate = 100
	}
	if l.ConnBurst <= 0 {
		l.ConnBurst = 200
	}
	if l.DNSRate <= 0 {
		l.DNSRate = 100
	}
	if l.DNSBurst <= 0 {
		l.DNSBurst = 200
	}
	if l.DNSTCPConns <= 0 {
		l.DNSTCPConns = 8
	}
	return l
}

// fdReserve is how many descriptors the proxy leaves to everything else
// in the daemon (API clients, the store, agent connections, log files).
const fdReserve = 2048

// FDBudget is how many proxied connections the daemon's descriptor limit
// allows (two descriptors each) after the reserve.
func FDBudget() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return max(int(lim.Cur)-fdReserve, 512) / 2
}

// RaiseFDLimit lifts the daemon's soft descriptor limit to its hard one,
// for headroom (the per-sandbox limits are what keep one sandbox from
// using it up).
func RaiseFDLimit() (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}

// Usage is the daemon's work for one sandbox's egress since its services
// started.
type Usage struct {
	// ProxyConns are connections accepted; ProxyRefused those closed at
	// once for being over a limit (or silent too long), DNS-over-TCP ones
	// included; ProxyOpen is how many are open now.
	ProxyConns   int64
	ProxyRefused int64
	ProxyOpen    int64
	// BytesOut and BytesIn are what the proxy relayed each way.
	BytesOut int64
	BytesIn  int64
	// DNSQueries are queries received; DNSDropped those over the rate.
	DNSQueries int64
	DNSDropped int64
}

// meter counts one sandbox's usage and enforces its limits.
type meter struct {
	conns, refused, open, pending atomic.Int64
	bytesOut, bytesIn             atomic.Int64
	queries, dropped              atomic.Int64

	dns, conn bucket
}

// bucket is a token bucket: take reports whether one more event fits
// rate per second with burst at once.
type bucket struct {
	mu       sync.Mutex
	tokens   float64
	refilled time.Time
}

func (b *bucket) take(now time.Time, rate float64, burst int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refilled.IsZero() {
		b.tokens = float64(burst)
	}
	b.tokens = min(float64(burst), b.tokens+now.Sub(b.refilled).Seconds()*rate)
	b.refilled = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (m *meter) usage() Usage {
	return Usage{
		ProxyConns: m.conns.Load(), ProxyRefused: m.refused.Load(), ProxyOpen: m.open.Load(),
		BytesOut: m.bytesOut.Load(), BytesIn: m.bytesIn.Load(),
		DNSQueries: m.queries.Load(), DNSDropped: m.dropped.Load(),
	}
}

// Usage reports a running sandbox's egress usage; ok is false when its
// services are not running.
func (e *Egress) Usage(id string) (Usage, bool) {
	e.mu.Lock()
	b := e.boxes[id]
	e.mu.Unlock()
	if b == nil {
		return Usage{}, false
	}
	return b.meter.usage(), true
}

// admitConn decides whether a just-accepted connection may be served:
// it must fit the sandbox's and the daemon's connection limits, and its
// pending limit. On true the caller must call release when done.
func (b *box) admitConn(c *net.TCPConn) (release func(), ok bool) {
	lim := b.e.limits
	m := &b.meter
	m.conns.Add(1)
	if !m.conn.take(time.Now(), lim.ConnRate, lim.ConnBurst) {
		b.refuse(c, "over the sandbox's rate of new connections")
		return nil, false
	}
	reason := ""
	switch {
	case m.open.Add(1) > int64(lim.MaxConns):
		reason = "over the sandbox's limit of open connections"
	case b.e.open.Add(1) > int64(lim.TotalConns):
		b.e.open.Add(-1)
		reason = "over the daemon's limit of proxied connections"
	}
	if reason != "" {
		m.open.Add(-1)
		b.refuse(c, reason)
		return nil, false
	}
	return func() {
		m.open.Add(-1)
		b.e.open.Add(-1)
	}, true
}

// refuse resets c at once (no lingering state in the daemon) and records
// why; the audit log aggregates the repeats.
func (b *box) refuse(c *net.TCPConn, reason string) {
	b.meter.refused.Add(1)
	_ = c.SetLinger(0)
	c.Close()
	b.audit(audit.Record{Proto: "tcp", Decision: "deny", Rule: "limit", Reason: reason})
}

// awaitFirstByte waits, without reading, until a client of port 80 or 443
// (where the client speaks first) has sent something, within the pending
// limit and FirstByte. Other ports pass at once: their servers may speak
// first.
func (b *box) awaitFirstByte(c *net.TCPConn) bool {
	orig, err := originalDst(c)
	if err != nil || (orig.Port() != 80 && orig.Port() != 443) {
		return true
	}
	m := &b.meter
	if m.pending.Add(1) > int64(b.e.limits.MaxPending) {
		m.pending.Add(-1)
		b.refuse(c, "over the sandbox's limit of connections waiting for their first byte")
		return false
	}
	defer m.pending.Add(-1)
	_ = c.SetReadDeadline(time.Now().Add(b.e.limits.FirstByte))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var perr error
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, perr = unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return !errors.Is(perr, unix.EAGAIN)
	})
	if err != nil {
		// The deadline: a client that stays silent is closed.
		b.refuse(c, "sent nothing within the first-byte timeout")
		return false
	}
	return true
}

// allowQuery is the DNS servers' accept function: a query over the
// sandbox's rate is dropped before it is even unpacked.
func (b *box) allowQuery(h dns.Header) dns.MsgAcceptAction {
	m := &b.meter
	m.queries.Add(1)
	now := time.Now()
	if !m.dns.take(now, b.e.limits.DNSRate, b.e.limits.DNSBurst) {
		m.dropped.Add(1)
		b.audit(audit.Record{Time: now, Proto: "dns", Decision: "deny", Rule: "rate-limit", Reason: "query over the sandbox's DNS rate limit dropped"})
		return dns.MsgIgnore
	}
	return dns.DefaultMsgAcceptFunc(h)
}

// limitListener accepts at most n connections at a time, closing the
// ones past it at once (DNS over TCP: each is a descriptor).
type limitListener struct {
	net.Listener
	sem chan struct{}
	b   *box
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &releaseConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			l.b.meter.refused.Add(1)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
	}
}

type releaseConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
