package egress

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// A policy change is a kill switch: SetPolicy closes every open connection
// of the sandbox that the new policy would refuse (flows), and the HTTP
// proxy decides every request against the policy in force, not the one the
// connection started under.

// flow is one open proxied connection, with what it was decided on.
type flow struct {
	name  string // SNI or Host; "" when decided by address
	ip    netip.Addr
	port  uint16
	proto string
	// passthrough: TLS relayed unread, so HTTP rules could not see it.
	passthrough bool
	client      net.Conn
	up          net.Conn
}

// flows are a box's open proxied connections.
type flows struct {
	mu  sync.Mutex
	set map[*flow]struct{}
}

func (b *box) addFlow(f *flow) func() {
	b.flows.mu.Lock()
	if b.flows.set == nil {
		b.flows.set = map[*flow]struct{}{}
	}
	b.flows.set[f] = struct{}{}
	b.flows.mu.Unlock()
	return func() {
		b.flows.mu.Lock()
		delete(b.flows.set, f)
		b.flows.mu.Unlock()
	}
}

// allowedUnder reports whether pol would still let f through, and if not,
// the decision that refuses it.
func (b *box) allowedUnder(pol *policy.Compiled, f *flow) (policy.Decision, bool) {
	var d policy.Decision
	if f.name == "" {
		if d = pol.DecideAddr(f.ip, f.port); !d.Allow {
			return d, false
		}
	} else {
		if d = pol.DecideName(f.name); !d.Allow {
			return d, false
		}
		if dd, denied := pol.DeniedAddr(f.ip, f.port); denied {
			return dd, false
		}
	}
	// TLS relayed unread to a name (or an address of a name) that now has
	// HTTP rules would carry requests those rules never see.
	if f.passthrough {
		if f.name != "" && pol.Ruled(f.name) {
			return policy.Decision{Rule: d.Rule}, false
		}
		if ruled, ok := b.knownRuled(pol, f.ip); ok {
			return policy.Decision{Rule: "http rules for " + ruled}, false
		}
	}
	return d, true
}

// knownRuled returns the ruled name ip was last seen to serve, if pol
// still has rules for it (no lookups: the cache only).
func (b *box) knownRuled(pol *policy.Compiled, ip netip.Addr) (string, bool) {
	b.ruled.mu.Lock()
	defer b.ruled.mu.Unlock()
	v, ok := b.ruled.addrs[ip.Unmap()]
	if ok && time.Now().Before(v.until) && pol.Ruled(v.name) {
		return v.name, true
	}
	return "", false
}

// enforce closes the flows pol refuses and records each as a denial.
func (b *box) enforce(pol *policy.Compiled) {
	b.flows.mu.Lock()
	var kill []*flow
	var why []policy.Decision
	for f := range b.flows.set {
		if d, ok := b.allowedUnder(pol, f); !ok {
			kill = append(kill, f)
			why = append(why, d)
		}
	}
	b.flows.mu.Unlock()
	for i, f := range kill {
		resetConn(f.client)
		f.up.Close()
		b.audit(audit.Record{Proto: f.proto, Name: f.name, IP: f.ip.String(), Port: f.port, Decision: "deny",
			Rule: why[i].Rule, Reason: "connection closed: the policy changed"})
	}
}

// resetConn closes c with a TCP reset, so the client sees "connection
// reset" at once instead of a clean end of stream or a timeout.
func resetConn(c net.Conn) {
	for {
		switch v := c.(type) {
		case *net.TCPConn:
			_ = v.SetLinger(0)
			v.Close()
			return
		case *replayConn:
			c = v.Conn
		case interface{ NetConn() net.Conn }: // *tls.Conn
			c = v.NetConn()
		default:
			c.Close()
			return
		}
	}
}

// tlsAccessDenied is a fatal TLS alert, access_denied: a client that sent
// a ClientHello reads it as the server refusing it (curl: "tlsv1 alert
// access denied") rather than an unexplained end of the connection.
var tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}

// refuseTLS answers a ClientHello with access_denied and closes.
func refuseTLS(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(tlsAccessDenied)
	closeWrite(c)
	c.Close()
}

// ruledAddrs are the addresses names with HTTP rules were seen to resolve
// to (by the proxy, or by the sandbox's resolver), for a while. A TLS
// connection to such an address under another name could carry a request
// for the ruled name that its rules forbid, so it is intercepted too.
type ruledAddrs struct {
	mu    sync.Mutex
	addrs map[netip.Addr]ruledAddr
	// resolved is when each exact ruled name was last resolved.
	resolved map[string]time.Time
}

type ruledAddr struct {
	name  string
	until time.Time
}

// ruledTTL is how long an address counts as a ruled name's after it was
// last seen; maxRuled bounds the set.
const (
	ruledTTL     = 10 * time.Minute
	ruledRefresh = 30 * time.Second
	maxRuled     = 4096
)

func (b *box) noteRuled(name string, ips []netip.Addr) {
	r := &b.ruled
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.addrs == nil {
		r.addrs = map[netip.Addr]ruledAddr{}
	}
	for _, ip := range ips {
		if len(r.addrs) >= maxRuled {
			for a, v := range r.addrs {
				if now.After(v.until) {
					delete(r.addrs, a)
				}
			}
			if len(r.addrs) >= maxRuled {
				return
			}
		}
		r.addrs[ip.Unmap()] = ruledAddr{name: name, until: now.Add(ruledTTL)}
	}
}

// sharedWithRuled returns the ruled name any of ips also serves, if any.
// It first resolves the exact ruled names it has not resolved lately, so
// an address shared with one is known even if nobody asked for that name.
func (b *box) sharedWithRuled(ctx context.Context, pol *policy.Compiled, ips []netip.Addr) (string, bool) {
	if len(pol.Policy.HTTP) == 0 {
		return "", false
	}
	now := time.Now()
	var stale []string
	b.ruled.mu.Lock()
	if b.ruled.resolved == nil {
		b.ruled.resolved = map[string]time.Time{}
	}
	for _, r := range pol.Policy.HTTP {
		if strings.HasPrefix(r.Host, "*.") || len(stale) >= 16 {
			continue
		}
		if t, ok := b.ruled.resolved[r.Host]; !ok || now.Sub(t) > ruledRefresh {
			stale = append(stale, r.Host)
			b.ruled.resolved[r.Host] = now
		}
	}
	b.ruled.mu.Unlock()
	for _, name := range stale {
		if addrs, err := b.e.resolve(ctx, name); err == nil {
			b.noteRuled(name, addrs)
		}
	}
	b.ruled.mu.Lock()
	defer b.ruled.mu.Unlock()
	for _, ip := range ips {
		if v, ok := b.ruled.addrs[ip.Unmap()]; ok && now.Before(v.until) && pol.Ruled(v.name) {
			return v.name, true
		}
	}
	return "", false
}
