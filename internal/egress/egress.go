// Package egress runs the host side of sandboxes' egress policy: per
// sandbox, a filtering DNS resolver and a transparent egress proxy on the
// host address of its veth (the firewall in package hostnet sends the
// sandbox's DNS and TCP there), its CA for intercepted TLS, and the
// policy in force (package policy decides). Every decision goes to the
// audit log. What the sandbox needs inside (its resolv.conf and CA) this
// package only provides (Prepare, ResolvConf): the Manager writes it
// through the sandbox's agent.
package egress

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-sandbox/berth/api/types"

	"github.com/miekg/dns"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// Config configures the host-side egress services.
type Config struct {
	// StateDir holds one directory per sandbox (its policy and CA key),
	// 0700, removed with the sandbox.
	StateDir string
	// Upstream are the DNS servers (host:port) the resolvers and the proxy
	// ask; default: the nameservers of the host's /etc/resolv.conf.
	Upstream []string
	// Guard decides which addresses are public (required; give it the
	// host's addresses, hostnet.HostAddrs).
	Guard *policy.Guard
	// Ceiling is the operator's egress ceiling: every sandbox's decisions
	// are bounded by it (nil: none beyond Guard).
	Ceiling *policy.CompiledCeiling
	// Audit receives every decision.
	Audit *audit.Log
	// UpstreamRoots verify servers behind intercepted TLS (nil: the host's
	// roots).
	UpstreamRoots *x509.CertPool
	// ProxyPort is where the firewall redirects sandboxes' TCP
	// (hostnet.Network.ProxyPort); required.
	ProxyPort   uint16
	DialTimeout time.Duration
	// Limits bound each sandbox's connections and queries (limits.go).
	Limits Limits
	Logger *slog.Logger
}

// Egress runs, per sandbox, a filtering DNS resolver and a transparent
// egress proxy on the host side of its veth, and holds its policy. Policy
// swaps are atomic, take effect for the next connection, query or HTTP
// request, and close open connections the new policy refuses.
type Egress struct {
	cfg    Config
	log    *slog.Logger
	limits Limits
	open   atomic.Int64 // proxied connections of all sandboxes

	mu    sync.Mutex
	boxes map[string]*box
}

// box is one sandbox's egress state.
type box struct {
	id     string
	hostIP netip.Addr
	policy atomic.Pointer[policy.Compiled]
	ca     *sandboxCA
	e      *Egress

	meter meter

	ln     net.Listener
	dnsUDP *dns.Server
	dnsTCP *dns.Server

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup

	flows flows      // open proxied connections, for SetPolicy's kill switch
	ruled ruledAddrs // addresses of names with HTTP rules
	dns   dnsDedup   // one audit record per lookup
}

// New prepares the egress services.
func New(cfg Config) (*Egress, error) {
	if cfg.StateDir == "" || cfg.Audit == nil || cfg.Guard == nil || cfg.ProxyPort == 0 {
		return nil, fmt.Errorf("egress: state dir, audit log, guard and proxy port are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Upstream) == 0 {
		cfg.Upstream = HostResolvers("/etc/resolv.conf")
	}
	for i, u := range cfg.Upstream {
		if _, _, err := net.SplitHostPort(u); err != nil {
			cfg.Upstream[i] = net.JoinHostPort(u, "53")
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("egress state dir: %w", err)
	}
	return &Egress{cfg: cfg, log: cfg.Logger, limits: cfg.Limits.withDefaults(), boxes: map[string]*box{}}, nil
}

// HostResolvers reads the nameservers of a resolv.conf.
func HostResolvers(path string) []string {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	return out
}

func (e *Egress) dir(id string) string { return filepath.Join(e.cfg.StateDir, id) }

// Prepare makes the sandbox's state dir and CA (kept if present) and
// returns the CA certificate (PEM) the sandbox must trust.
func (e *Egress) Prepare(id string) ([]byte, error) {
	ca, err := e.prepare(id)
	if err != nil {
		return nil, err
	}
	return ca.pem, nil
}

// prepare is Prepare, returning the CA itself (for Start, which signs
// with it).
func (e *Egress) prepare(id string) (*sandboxCA, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(e.dir(id), 0o700); err != nil {
		return nil, fmt.Errorf("egress state for %s: %w", id, err)
	}
	ca, err := loadOrCreateCA(e.dir(id), id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s CA: %w", id, err)
	}
	return ca, nil
}

// ResolvConf is the sandbox's /etc/resolv.conf: its resolver is on
// hostIP, the host end of its veth, where Start listens.
func (e *Egress) ResolvConf(hostIP netip.Addr) []byte {
	return []byte("# written by berth: the sandbox's filtering resolver\nnameserver " + hostIP.String() + "\noptions edns0\n")
}

// Start runs the sandbox's resolver and proxy on hostIP with policy p
// (persisted, so a restarted daemon can Start it again with LoadPolicy).
func (e *Egress) Start(ctx context.Context, id string, hostIP netip.Addr, p policy.Policy) error {
	c, err := e.compile(p)
	if err != nil {
		return err
	}
	ca, err := e.prepare(id)
	if err != nil {
		return err
	}
	if err := e.savePolicy(id, c.Policy); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if old := e.boxes[id]; old != nil {
		old.close()
		delete(e.boxes, id)
	}
	b := &box{id: id, hostIP: hostIP, ca: ca, e: e, conns: map[net.Conn]bool{}}
	b.policy.Store(c)
	lc := net.ListenConfig{}
	ln, err := lc.Listen(ctx, "tcp4", netip.AddrPortFrom(hostIP, e.cfg.ProxyPort).String())
	if err != nil {
		return fmt.Errorf("sandbox %s egress proxy: %w", id, err)
	}
	b.ln = ln
	dnsAddr := netip.AddrPortFrom(hostIP, 53).String()
	pc, err := lc.ListenPacket(ctx, "udp4", dnsAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("sandbox %s resolver: %w", id, err)
	}
	tl, err := lc.Listen(ctx, "tcp4", dnsAddr)
	if err != nil {
		ln.Close()
		pc.Close()
		return fmt.Errorf("sandbox %s resolver: %w", id, err)
	}
	b.dnsUDP = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(b.serveDNS), MsgAcceptFunc: b.allowQuery}
	b.dnsTCP = &dns.Server{
		Listener: &limitListener{Listener: tl, sem: make(chan struct{}, e.limits.DNSTCPConns), b: b},
		Handler:  dns.HandlerFunc(b.serveDNS), MsgAcceptFunc: b.allowQuery,
		ReadTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 5 * time.Second },
	}
	b.wg.Add(3)
	go func() {
		defer b.wg.Done()
		if err := b.dnsUDP.ActivateAndServe(); err != nil && !b.isClosed() {
			b.e.log.Warn("dns_serve_failed", "sandbox_id", b.id, "proto", "udp", "err", err)
		}
	}()
	go func() {
		defer b.wg.Done()
		if err := b.dnsTCP.ActivateAndServe(); err != nil && !b.isClosed() {
			b.e.log.Warn("dns_serve_failed", "sandbox_id", b.id, "proto", "tcp", "err", err)
		}
	}()
	go func() { defer b.wg.Done(); b.accept() }()
	e.boxes[id] = b
	return nil
}

// SetPolicy replaces the sandbox's policy: new connections, queries and
// HTTP requests are decided by it at once, and open connections it would
// refuse are closed (a kill switch). An invalid policy changes nothing.
func (e *Egress) SetPolicy(id string, p policy.Policy) error {
	c, err := e.compile(p)
	if err != nil {
		return err
	}
	e.mu.Lock()
	b := e.boxes[id]
	e.mu.Unlock()
	if b == nil {
		return fmt.Errorf("sandbox %s egress: %w", id, errdefs.ErrNotFound)
	}
	if err := e.savePolicy(id, c.Policy); err != nil {
		return err
	}
	b.policy.Store(c)
	b.enforce(c)
	return nil
}

// compile compiles p bounded by the operator's ceiling.
func (e *Egress) compile(p policy.Policy) (*policy.Compiled, error) {
	c, err := policy.Compile(p)
	if err != nil {
		return nil, err
	}
	return c.Within(e.cfg.Ceiling), nil
}

// Policy returns the sandbox's policy in force.
func (e *Egress) Policy(id string) (policy.Policy, error) {
	e.mu.Lock()
	b := e.boxes[id]
	e.mu.Unlock()
	if b == nil {
		return policy.Policy{}, fmt.Errorf("sandbox %s egress: %w", id, errdefs.ErrNotFound)
	}
	return b.policy.Load().Policy, nil
}

// LoadPolicy reads a sandbox's persisted policy (after a restart).
func (e *Egress) LoadPolicy(id string) (policy.Policy, error) {
	if err := validID(id); err != nil {
		return policy.Policy{}, err
	}
	data, err := os.ReadFile(filepath.Join(e.dir(id), "policy.json"))
	if errors.Is(err, os.ErrNotExist) {
		return policy.Policy{}, fmt.Errorf("sandbox %s policy: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return policy.Policy{}, err
	}
	var p policy.Policy
	if err := json.Unmarshal(data, &p); err != nil {
		return policy.Policy{}, fmt.Errorf("sandbox %s policy: %w", id, err)
	}
	return p, p.Validate()
}

func (e *Egress) savePolicy(id string, p policy.Policy) error {
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(e.dir(id), "policy.json"), data, 0o600); err != nil {
		return fmt.Errorf("save sandbox %s policy: %w", id, err)
	}
	return nil
}

// Stop closes the sandbox's listeners and connections; its state stays.
func (e *Egress) Stop(id string) {
	e.mu.Lock()
	b := e.boxes[id]
	delete(e.boxes, id)
	e.mu.Unlock()
	if b != nil {
		b.close()
	}
}

// Remove stops the sandbox's services and deletes its state (CA key
// included). Removing an unknown id is not an error.
func (e *Egress) Remove(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	e.Stop(id)
	e.cfg.Audit.Close(id)
	if err := os.RemoveAll(e.dir(id)); err != nil {
		return fmt.Errorf("remove sandbox %s egress state: %w", id, err)
	}
	return nil
}

// List returns the ids that have egress state on disk.
func (e *Egress) List() ([]string, error) {
	ents, err := os.ReadDir(e.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range ents {
		if d.IsDir() && validID(d.Name()) == nil {
			out = append(out, d.Name())
		}
	}
	return out, nil
}

// Close stops every sandbox's services (their state stays for a restart).
func (e *Egress) Close() {
	e.mu.Lock()
	boxes := e.boxes
	e.boxes = map[string]*box{}
	e.mu.Unlock()
	for _, b := range boxes {
		b.close()
	}
}

func (b *box) close() {
	b.mu.Lock()
	b.closed = true
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.ln.Close()
	// Shutdown refuses a server whose ActivateAndServe has not started
	// yet (its goroutine not scheduled: a create failing right after
	// Start, on a loaded host), which would then serve forever and hang
	// the wait below. Closing the socket ends it whenever it starts.
	_ = b.dnsUDP.Shutdown()
	_ = b.dnsUDP.PacketConn.Close()
	_ = b.dnsTCP.Shutdown()
	_ = b.dnsTCP.Listener.Close()
	b.wg.Wait()
}

func (b *box) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

func (b *box) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[c] = true
	return true
}

func (b *box) untrack(c net.Conn) {
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
}

func (b *box) audit(r audit.Record) {
	r.Sandbox = b.id
	// Every relayed connection and request ends in a record with its
	// bytes: the sandbox's usage of the proxy is counted here.
	b.meter.bytesOut.Add(r.BytesOut)
	b.meter.bytesIn.Add(r.BytesIn)
	b.e.cfg.Audit.Append(r)
}

// serveDNS answers allowed names from upstream, minus answers that point
// at forbidden or denied addresses, and refuses the rest. A name whose
// every address was dropped is refused (and logged as a denial), so the
// client fails at once instead of trying addresses that cannot work.
func (b *box) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeRefused
		_ = w.WriteMsg(resp)
		return
	}
	q := req.Question[0]
	name := dns.CanonicalName(q.Name)
	host := name[:max(len(name)-1, 0)]
	pol := b.policy.Load()
	d := pol.DecideName(host)
	rec := audit.Record{Proto: "dns", Name: host, Rule: d.Rule, Decision: "deny"}
	if !d.Allow {
		resp.Rcode = dns.RcodeRefused
		_ = w.WriteMsg(resp)
		b.auditDNS(rec)
		return
	}
	rec.Decision = "allow"
	switch q.Qtype {
	case dns.TypeAAAA:
		// The sandbox has no IPv6; an empty answer makes clients use A.
		_ = w.WriteMsg(resp)
		b.auditDNS(rec)
		return
	case dns.TypeA, dns.TypeCNAME, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeTXT, dns.TypeMX, dns.TypeSRV, dns.TypeCAA:
	default:
		resp.Rcode = dns.RcodeRefused
		_ = w.WriteMsg(resp)
		rec.Decision, rec.Reason = "deny", "query type "+dns.TypeToString[q.Qtype]
		b.auditDNS(rec)
		return
	}
	up := new(dns.Msg)
	up.SetQuestion(name, q.Qtype)
	up.RecursionDesired = true
	in, err := b.e.exchange(context.Background(), up)
	if err != nil {
		resp.Rcode = dns.RcodeServerFailure
		_ = w.WriteMsg(resp)
		rec.Reason = "upstream: " + err.Error()
		b.auditDNS(rec)
		return
	}
	resp.Rcode = in.Rcode
	var ips []netip.Addr
	var dropped []string
	for _, rr := range in.Answer {
		if ip, ok := rrAddr(rr); ok {
			if bad, why := b.e.cfg.Guard.Forbidden(ip); bad {
				dropped = append(dropped, ip.String()+" ("+why+")")
				continue
			}
			if dd, denied := pol.DeniedAddr(ip, 0); denied {
				dropped = append(dropped, ip.String()+" ("+dd.Rule+")")
				continue
			}
			ips = append(ips, ip)
		}
		resp.Answer = append(resp.Answer, rr)
	}
	if len(dropped) > 0 {
		rec.Reason = "dropped forbidden answer " + strings.Join(dropped, ", ")
	}
	if len(dropped) > 0 && len(ips) == 0 {
		resp.Rcode, resp.Answer = dns.RcodeRefused, nil
		rec.Decision = "deny"
		_ = w.WriteMsg(resp)
		b.auditDNS(rec)
		return
	}
	if len(ips) > 0 {
		rec.IP = ips[0].String()
		if pol.Ruled(host) {
			b.noteRuled(host, ips)
		}
	}
	_ = w.WriteMsg(resp)
	b.auditDNS(rec)
}

// dnsDedup keeps a lookup's several queries (A and AAAA, retries, the
// same name over UDP then TCP) to one audit record.
type dnsDedup struct {
	mu   sync.Mutex
	seen map[audit.Record]time.Time
}

// dnsDedupWindow is how long an identical DNS decision is not recorded
// again.
const dnsDedupWindow = 2 * time.Second

func (b *box) auditDNS(rec audit.Record) {
	now := time.Now()
	key := rec
	key.IP = "" // the A and the (empty) AAAA answer of one lookup
	b.dns.mu.Lock()
	if b.dns.seen == nil {
		b.dns.seen = map[audit.Record]time.Time{}
	}
	if t, ok := b.dns.seen[key]; ok && now.Sub(t) < dnsDedupWindow {
		b.dns.mu.Unlock()
		return
	}
	if len(b.dns.seen) > 1024 {
		for k, t := range b.dns.seen {
			if now.Sub(t) >= dnsDedupWindow {
				delete(b.dns.seen, k)
			}
		}
	}
	b.dns.seen[key] = now
	b.dns.mu.Unlock()
	b.audit(rec)
}

func rrAddr(rr dns.RR) (netip.Addr, bool) {
	switch v := rr.(type) {
	case *dns.A:
		a, ok := netip.AddrFromSlice(v.A.To4())
		return a, ok
	case *dns.AAAA:
		a, ok := netip.AddrFromSlice(v.AAAA)
		return a, ok
	}
	return netip.Addr{}, false
}

// exchange asks the upstream servers in turn (UDP, then TCP if truncated).
func (e *Egress) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	if len(e.cfg.Upstream) == 0 {
		return nil, errors.New("no upstream DNS server configured")
	}
	var last error
	for _, up := range e.cfg.Upstream {
		c := &dns.Client{Timeout: 3 * time.Second}
		in, _, err := c.ExchangeContext(ctx, m, up)
		if err == nil && in.Truncated {
			c.Net = "tcp"
			in, _, err = c.ExchangeContext(ctx, m, up)
		}
		if err == nil {
			return in, nil
		}
		last = err
	}
	return nil, last
}

// resolve looks name up (A and AAAA) through the upstream servers.
func (e *Egress) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	var out []netip.Addr
	var last error
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), t)
		m.RecursionDesired = true
		in, err := e.exchange(ctx, m)
		if err != nil {
			last = err
			continue
		}
		for _, rr := range in.Answer {
			if ip, ok := rrAddr(rr); ok {
				out = append(out, ip)
			}
		}
	}
	if len(out) == 0 && last != nil {
		return nil, last
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no address", name)
	}
	return out, nil
}

// validID is the sandbox-ID grammar of the whole API: here IDs name
// state directories, so nothing else may reach the file system.

func validID(id string) error { return types.ValidSandboxID(id) }

// truncate shortens s to n bytes for logs and audit records.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
