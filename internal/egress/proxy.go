package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// The egress proxy receives every TCP connection a sandbox opens (the
// firewall redirects them) and decides:
//
//   - ports 80 and 443: by the name the client states (TLS SNI, HTTP Host).
//     An IP literal or no name at all is decided by address (CIDR rules).
//     The proxy resolves the name itself, drops forbidden addresses from
//     the answer (so DNS rebinding gains nothing), and dials a vetted one.
//     Names with HTTP rules are TLS-terminated with the sandbox's CA and
//     each request's Host (which must equal the SNI), method and path are
//     checked; other TLS passes through untouched.
//   - any other port: by the original destination address and port.
//
// Every decision goes to the audit log with the bytes moved each way.

const peekTimeout = 10 * time.Second

func (b *box) accept() {
	backoff := time.Duration(0)
	for {
		c, err := b.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors (EMFILE, ENFILE) or an aborted
			// connection: the proxy must outlive it, not stop serving
			// the sandbox for good. Back off so a full table is not spun on.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			b.e.log.Warn("egress_accept_failed", "sandbox_id", b.id, "err", err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		tc := c.(*net.TCPConn)
		release, ok := b.admitConn(tc)
		if !ok {
			continue
		}
		if !b.track(c) {
			release()
			c.Close()
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer release()
			defer b.untrack(c)
			defer c.Close()
			if !b.awaitFirstByte(tc) {
				return
			}
			b.handle(tc)
		}()
	}
}

// originalDst reads the destination the sandbox dialed before the
// redirect (SO_ORIGINAL_DST; the sandbox speaks IPv4 only).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.RawSockaddrInet4
	var serr error
	err = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(sa))
		const soOriginalDst = 80
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, soOriginalDst, uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			serr = e
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	port := uint16(sa.Port>>8 | sa.Port<<8)
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), nil
}

// counted counts bytes each way of one proxied connection.
type counted struct {
	out, in atomic.Int64
}

func (b *box) handle(c *net.TCPConn) {
	orig, err := originalDst(c)
	if err != nil {
		b.audit(audit.Record{Proto: "tcp", Decision: "deny", Rule: "proxy", Reason: err.Error()})
		return
	}
	pol := b.policy.Load()
	rec := audit.Record{Proto: "tcp", IP: orig.Addr().String(), Port: orig.Port()}
	if orig.Port() != 80 && orig.Port() != 443 {
		d, addrs, why := b.decideTarget("", orig, pol)
		rec.Reason = why
		b.relayTo(c, rec, d, addrs, orig.Port())
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
	br := bufio.NewReaderSize(c, 4096)
	first, err := br.Peek(1)
	if err != nil {
		rec.Decision, rec.Rule, rec.Reason = "deny", "proxy", "no data from client"
		b.audit(rec)
		return
	}
	if first[0] == 0x16 { // TLS handshake record
		b.handleTLS(c, br, orig, pol)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	b.handleHTTP(c, br, orig, "", nil)
}

// peekSNI reads the ClientHello through a throwaway TLS server and
// returns the server name and every byte it consumed, for replay.
func peekSNI(c net.Conn, r io.Reader) (string, []byte, error) {
	var buf bytes.Buffer
	var sni string
	seen := false
	errDone := errors.New("hello read")
	srv := tls.Server(sniffConn{Conn: c, r: io.TeeReader(r, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = h.ServerName, true
			return nil, errDone
		},
	})
	err := srv.Handshake()
	if !seen {
		return "", buf.Bytes(), fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	return sni, buf.Bytes(), nil
}

// sniffConn reads from r and swallows writes (the alert the aborted
// handshake would send).
type sniffConn struct {
	net.Conn
	r io.Reader
}

func (s sniffConn) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s sniffConn) Write(p []byte) (int, error) { return len(p), nil }

// replayConn reads the replayed bytes, then the connection.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (r *replayConn) Read(p []byte) (int, error) { return r.r.Read(p) }

func (b *box) handleTLS(c *net.TCPConn, br *bufio.Reader, orig netip.AddrPort, pol *policy.Compiled) {
	sni, hello, err := peekSNI(c, br)
	rec := audit.Record{Proto: "tls", Name: strings.ToLower(sni), IP: orig.Addr().String(), Port: orig.Port()}
	if err != nil {
		rec.Decision, rec.Rule, rec.Reason = "deny", "proxy", err.Error()
		b.audit(rec)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	client := &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), br)}
	d, addrs, reason := b.decideTarget(rec.Name, orig, pol)
	if d.Allow && !d.Intercept {
		// HTTP rules must not end at a shared address: TLS under another
		// name could carry a request for the ruled name. Such a connection
		// is intercepted (its Host held to its SNI) or, without a name to
		// intercept under, refused.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ruled, shared := b.sharedWithRuled(ctx, pol, addrs)
		cancel()
		switch {
		case shared && policy.ValidDomain(rec.Name):
			d.Intercept = true
		case shared:
			d = policy.Decision{Rule: d.Rule}
			reason = fmt.Sprintf("address also serves %s, which has HTTP rules; connect by name", ruled)
		}
	}
	if d.Allow && d.Intercept && rec.Name != "" {
		b.intercept(client, rec.Name, addrs, orig)
		return
	}
	rec.Reason = reason
	b.relayTo(client, rec, d, addrs, orig.Port())
}

// decideTarget decides a connection naming name (SNI or Host; "" when
// none) and returns the vetted addresses to dial.
func (b *box) decideTarget(name string, orig netip.AddrPort, pol *policy.Compiled) (policy.Decision, []netip.Addr, string) {
	byAddr := func(ip netip.Addr) (policy.Decision, []netip.Addr, string) {
		d := pol.DecideAddr(ip, orig.Port())
		if !d.Allow {
			return d, nil, ""
		}
		if bad, why := b.e.cfg.Guard.Forbidden(ip); bad {
			return policy.Decision{Rule: d.Rule}, nil, ip.String() + ": " + why
		}
		return d, []netip.Addr{ip.Unmap()}, ""
	}
	if name == "" {
		return byAddr(orig.Addr())
	}
	if ip, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return byAddr(ip)
	}
	if !policy.ValidDomain(name) {
		return policy.Decision{Rule: "proxy"}, nil, "invalid name"
	}
	d := pol.DecideName(name)
	if !d.Allow {
		return d, nil, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := b.e.resolve(ctx, name)
	if err != nil {
		return policy.Decision{Rule: d.Rule}, nil, "resolve: " + err.Error()
	}
	var ok []netip.Addr
	var why string
	for _, ip := range ips {
		if bad, r := b.e.cfg.Guard.Forbidden(ip); bad {
			why = fmt.Sprintf("%s resolves to %s (%s)", name, ip, r)
			continue
		}
		if dd, denied := pol.DeniedAddr(ip, orig.Port()); denied {
			why = fmt.Sprintf("%s resolves to %s (%s)", name, ip, dd.Rule)
			continue
		}
		ok = append(ok, ip.Unmap())
	}
	if len(ok) == 0 {
		return policy.Decision{Rule: d.Rule}, nil, why
	}
	if d.Intercept {
		b.noteRuled(name, ok)
	}
	return d, ok, ""
}

// dial connects to the first address that answers, refusing forbidden
// ones (the last line of defence: every path ends here).
func (b *box) dial(ctx context.Context, addrs []netip.Addr, port uint16) (net.Conn, error) {
	var last error = errors.New("no address")
	for _, ip := range addrs {
		if bad, why := b.e.cfg.Guard.Forbidden(ip); bad {
			last = fmt.Errorf("%s: %s", ip, why)
			continue
		}
		d := net.Dialer{Timeout: b.e.cfg.DialTimeout}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(ip, port).String())
		if err == nil {
			return c, nil
		}
		last = err
	}
	return nil, last
}

// relayTo applies decision d: on allow it dials addrs and copies both
// ways. A refusal is immediate: a TLS alert for TLS, a reset otherwise.
func (b *box) relayTo(client net.Conn, rec audit.Record, d policy.Decision, addrs []netip.Addr, port uint16) {
	rec.Rule = d.Rule
	refuse := func() {
		rec.Decision = "deny"
		b.audit(rec)
		if rec.Proto == "tls" {
			refuseTLS(client)
		} else {
			resetConn(client)
		}
	}
	if !d.Allow || len(addrs) == 0 {
		refuse()
		return
	}
	if len(addrs) == 1 {
		if bad, why := b.e.cfg.Guard.Forbidden(addrs[0]); bad {
			rec.Reason = why
			refuse()
			return
		}
	}
	up, err := b.dial(context.Background(), addrs, port)
	if err != nil {
		rec.Reason = "dial: " + err.Error()
		refuse()
		return
	}
	defer up.Close()
	if !b.track(up) {
		return
	}
	defer b.untrack(up)
	ip := addrs[0]
	if ra, ok := netip.ParseAddrPort(up.RemoteAddr().String()); ok == nil {
		ip = ra.Addr().Unmap()
		rec.IP = ip.String()
	}
	f := &flow{name: rec.Name, ip: ip, port: port, proto: rec.Proto, passthrough: rec.Proto == "tls", client: client, up: up}
	if _, literal := netip.ParseAddr(strings.Trim(rec.Name, "[]")); literal == nil {
		f.name = ""
	}
	defer b.addFlow(f)()
	// A policy change between the decision and addFlow would miss it.
	if _, ok := b.allowedUnder(b.policy.Load(), f); !ok {
		rec.Reason = "policy changed"
		refuse()
		return
	}
	rec.Decision = "allow"
	var n counted
	splice(client, up, &n)
	rec.BytesOut, rec.BytesIn = n.out.Load(), n.in.Load()
	b.audit(rec)
}

// splice copies both ways until both directions end.
func splice(client, up net.Conn, n *counted) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		w, _ := io.Copy(up, client)
		n.out.Add(w)
		closeWrite(up)
	}()
	go func() {
		defer wg.Done()
		w, _ := io.Copy(client, up)
		n.in.Add(w)
		closeWrite(client)
	}()
	wg.Wait()
}

func closeWrite(c net.Conn) {
	type cw interface{ CloseWrite() error }
	switch v := c.(type) {
	case cw:
		_ = v.CloseWrite()
	case *replayConn:
		closeWrite(v.Conn)
	default:
		c.Close()
	}
}

// intercept terminates TLS for name with the sandbox's CA and serves the
// HTTP requests inside, each checked against the HTTP rules.
func (b *box) intercept(client net.Conn, name string, addrs []netip.Addr, orig netip.AddrPort) {
	cfg := &tls.Config{
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return b.ca.leaf(name)
		},
	}
	tc := tls.Server(client, cfg)
	_ = tc.SetDeadline(time.Now().Add(peekTimeout))
	if err := tc.Handshake(); err != nil {
		b.audit(audit.Record{Proto: "https", Name: name, IP: orig.Addr().String(), Port: orig.Port(), Decision: "deny", Rule: "proxy", Reason: "client handshake: " + err.Error()})
		return
	}
	_ = tc.SetDeadline(time.Time{})
	dialUp := func(ctx context.Context) (net.Conn, error) {
		raw, err := b.dial(ctx, addrs, orig.Port())
		if err != nil {
			return nil, err
		}
		uc := tls.Client(raw, &tls.Config{ServerName: name, RootCAs: b.e.cfg.UpstreamRoots, NextProtos: []string{"http/1.1"}})
		if err := uc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("upstream TLS: %w", err)
		}
		return uc, nil
	}
	b.handleHTTP(tc, bufio.NewReader(tc), orig, name, dialUp)
}

// handleHTTP serves HTTP/1.x requests from client one by one, each
// decided against the policy in force when it arrives. sni is the TLS name
// for intercepted connections ("" for plain HTTP); dialUp, when set, dials
// the upstream (intercepted TLS). The path is decided in its normalized
// form (policy.NormalizePath) and forwarded in exactly that form.
func (b *box) handleHTTP(client net.Conn, br *bufio.Reader, orig netip.AddrPort, sni string, dialUp func(context.Context) (net.Conn, error)) {
	proto := "http"
	if sni != "" {
		proto = "https"
	}
	var up net.Conn
	var upr *bufio.Reader
	var upIP netip.Addr
	defer func() {
		if up != nil {
			up.Close()
			b.untrack(up)
		}
	}()
	firstHost := ""
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			if firstHost == "" {
				b.audit(audit.Record{Proto: proto, Name: sni, IP: orig.Addr().String(), Port: orig.Port(), Decision: "deny", Rule: "proxy", Reason: "not HTTP: " + err.Error()})
			}
			return
		}
		pol := b.policy.Load()
		host := strings.ToLower(req.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(host, ".")
		path, perr := requestPath(req)
		rec := audit.Record{Proto: proto, Name: host, IP: orig.Addr().String(), Port: orig.Port(), Method: req.Method, Path: truncate(path, 512)}
		if upIP.IsValid() {
			rec.IP = upIP.String()
		}
		refuse := func(status int, d policy.Decision, reason string) {
			rec.Decision, rec.Rule, rec.Reason = "deny", d.Rule, reason
			body := "berth egress: " + status2text(status) + ": " + reason + "\n"
			resp := &http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Content-Type": {"text/plain"}, "Connection": {"close"}},
				Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Close: true}
			_ = resp.Write(client)
			b.audit(rec)
		}
		var d policy.Decision
		switch {
		case perr != nil:
			rec.Path = truncate(req.RequestURI, 512)
			refuse(http.StatusBadRequest, policy.Decision{Rule: "proxy"}, perr.Error())
			return
		case sni != "" && host != sni:
			refuse(http.StatusMisdirectedRequest, policy.Decision{Rule: "proxy"}, fmt.Sprintf("Host %q differs from TLS server name %q", host, sni))
			return
		case firstHost != "" && host != firstHost:
			refuse(http.StatusMisdirectedRequest, policy.Decision{Rule: "proxy"}, fmt.Sprintf("Host %q differs from this connection's first Host %q", host, firstHost))
			return
		case req.Header.Get("Upgrade") != "" && sni != "":
			refuse(http.StatusForbidden, policy.Decision{Rule: "proxy"}, "protocol upgrades are not supported on intercepted connections")
			return
		}
		var addrs []netip.Addr
		if up == nil {
			var why string
			d, addrs, why = b.decideTarget(host, orig, pol)
			if !d.Allow || len(addrs) == 0 {
				if why == "" {
					why = "not allowed by policy"
				}
				refuse(http.StatusForbidden, d, why)
				return
			}
		}
		d = decideRequest(pol, host, req.Method, path, upIP, orig.Port())
		if !d.Allow {
			refuse(http.StatusForbidden, d, "not allowed by policy")
			return
		}
		if up == nil {
			firstHost = host
			ctx, cancel := context.WithTimeout(context.Background(), b.e.cfg.DialTimeout+5*time.Second)
			if dialUp != nil {
				up, err = dialUp(ctx)
			} else {
				up, err = b.dial(ctx, addrs, orig.Port())
			}
			cancel()
			if err != nil {
				up = nil
				refuse(http.StatusBadGateway, d, "dial: "+err.Error())
				return
			}
			if !b.track(up) {
				return
			}
			upr = bufio.NewReader(up)
			upIP = addrs[0]
			if ra, err := netip.ParseAddrPort(up.RemoteAddr().String()); err == nil {
				upIP = ra.Addr().Unmap()
			}
			rec.IP = upIP.String()
			f := &flow{name: host, ip: upIP, port: orig.Port(), proto: proto, client: client, up: up}
			if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
				f.name = ""
			}
			defer b.addFlow(f)()
			// The policy may have changed while dialing.
			if pol = b.policy.Load(); !decideRequest(pol, host, req.Method, path, upIP, orig.Port()).Allow {
				refuse(http.StatusForbidden, d, "policy changed")
				return
			}
		}
		rec.Decision, rec.Rule = "allow", d.Rule
		var n counted
		cw := &countWriter{w: up, n: &n.out}
		req.Header.Del("Proxy-Connection")
		// Forward exactly the path that was decided on.
		req.URL = &url.URL{Opaque: path, RawQuery: req.URL.RawQuery}
		if err := req.Write(cw); err != nil {
			rec.Reason = "upstream write: " + err.Error()
			b.audit(rec)
			return
		}
		resp, err := http.ReadResponse(upr, req)
		if err != nil {
			rec.Reason = "upstream read: " + err.Error()
			refuse(http.StatusBadGateway, d, rec.Reason)
			return
		}
		err = resp.Write(&countWriter{w: client, n: &n.in})
		resp.Body.Close()
		rec.BytesOut, rec.BytesIn = n.out.Load(), n.in.Load()
		b.audit(rec)
		if err != nil || resp.Close || req.Close {
			return
		}
	}
}

// decideRequest decides one HTTP request to host on a connection dialed
// to ip (invalid before the dial): IP literals by address, names by their
// HTTP rules or name rules, and the address against the deny rules.
func decideRequest(pol *policy.Compiled, host, method, path string, ip netip.Addr, port uint16) policy.Decision {
	if lit, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return pol.DecideAddr(lit, port)
	}
	d := pol.DecideRequest(host, method, path)
	if d.Allow && ip.IsValid() {
		if dd, denied := pol.DeniedAddr(ip, port); denied {
			return dd
		}
	}
	return d
}

// requestPath is the normalized path of req's request target (origin or
// absolute form), without the query.
func requestPath(req *http.Request) (string, error) {
	raw := req.RequestURI
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		raw = raw[:i]
	}
	if !strings.HasPrefix(raw, "/") {
		_, rest, ok := strings.Cut(raw, "://")
		if !ok {
			return "", fmt.Errorf("request target %q: %w", truncate(raw, 64), policy.ErrAmbiguousPath)
		}
		raw = "/"
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			raw = rest[i:]
		}
	}
	return policy.NormalizePath(raw)
}

type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func status2text(s int) string { return strings.ToLower(http.StatusText(s)) }
