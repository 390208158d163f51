package harness

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestNet is a stand-in internet for egress tests: a network namespace
// holding a /28 of TEST-NET-2 (198.51.100.0/24) and 2001:db8::/32 addresses, routed
// from the host over a veth, running HTTP (80), HTTPS (443, certificates
// from its own CA), DNS (53), a TCP echo (7) and a UDP echo on 443 (to
// prove QUIC would be answered if it got out). Tests send traffic only
// here and to loopback.
type TestNet struct {
	Name    string
	HostIP  netip.Addr // host side of the veth
	IP      netip.Addr // the servers' main address (198.51.100.1)
	IP2     netip.Addr // a second server address (198.51.100.2)
	IP6     netip.Addr // 2001:db8:<slot>::1
	Prefix  netip.Prefix
	CAPEM   []byte // the test CA, for clients and the daemon's proxy
	CAFile  string
	DNSAddr string // host:port of its DNS server

	hostLink string
	closers  []io.Closer
	mu       sync.Mutex
	// Zone maps names (no trailing dot) to A records; names absent answer
	// NXDOMAIN.
	Zone map[string]string
	// hosts are extra HTTP handlers by Host (see Handle); other hosts get
	// the echo handler.
	hosts map[string]http.Handler
}

// TestNetZone is the DNS zone a TestNet with servers at ip and ip2 serves.
func TestNetZone(ip, ip2 string) map[string]string {
	z := map[string]string{"rebind.test": "127.0.0.1", "meta.test": "169.254.169.254", "second.test": ip2}
	// nat64.test has only an AAAA record: the NAT64 form of ip2.
	if a, err := netip.ParseAddr(ip2); err == nil && a.Is4() {
		b := a.As4()
		z["nat64.test"] = netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 10: 0, 11: 0, 12: b[0], 13: b[1], 14: b[2], 15: b[3]}).String()
	}
	for _, n := range []string{"allowed.test", "other.test", "api.test", "sub.wild.test", "bad.wild.test", "wild.test", "learned.test", "bench.test", "benchapi.test"} {
		z[n] = ip
	}
	return z
}

// testNetSlot picks a /28 of 198.51.100.0/24 no host address is in, so
// concurrent test runs on one host get test nets of their own. It holds a
// host-wide lock until the returned unlock, which must come after the
// host address is configured.
func testNetSlot() (int, func(), error) {
	f, err := os.OpenFile("/run/berth-testnet.lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return 0, nil, err
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		f.Close()
		return 0, nil, err
	}
	used := map[int]bool{}
	for _, a := range addrs {
		if ip4 := a.IP.To4(); ip4 != nil && ip4[0] == 198 && ip4[1] == 51 && ip4[2] == 100 {
			used[int(ip4[3])/16] = true
		}
	}
	b := make([]byte, 1)
	rand.Read(b)
	for i := range 16 {
		slot := (int(b[0]) + i) % 16
		if !used[slot] {
			return slot, func() { f.Close() }, nil
		}
	}
	f.Close()
	return 0, nil, fmt.Errorf("no free /28 in 198.51.100.0/24")
}

// StartTestNet builds the namespace and servers; everything is removed
// when the test ends.
func StartTestNet(t TB) *TestNet {
	t.Helper()
	RequireHost(t)
	id := randName(6)
	slot, unlock, err := testNetSlot()
	if err != nil {
		t.Fatalf("test net: %v", err)
	}
	base := 16 * slot
	tn := &TestNet{
		Name:     "berthtn-" + id,
		HostIP:   netip.AddrFrom4([4]byte{198, 51, 100, byte(base + 14)}),
		IP:       netip.AddrFrom4([4]byte{198, 51, 100, byte(base + 1)}),
		IP2:      netip.AddrFrom4([4]byte{198, 51, 100, byte(base + 2)}),
		IP6:      netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::1", slot+1)),
		Prefix:   netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(base)}), 28),
		hostLink: "btn" + id,
	}
	tn.Zone = TestNetZone(tn.IP.String(), tn.IP2.String())
	tn.DNSAddr = net.JoinHostPort(tn.IP.String(), "53")
	t.Cleanup(tn.Close)
	err = tn.setup(t)
	unlock()
	if err != nil {
		t.Fatalf("test net: %v", err)
	}
	return tn
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (tn *TestNet) setup(t TB) error {
	if err := run("ip", "netns", "add", tn.Name); err != nil {
		return err
	}
	peer := tn.hostLink + "p"
	steps := [][]string{
		{"ip", "link", "add", tn.hostLink, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", tn.Name},
		{"ip", "addr", "add", tn.HostIP.String() + "/28", "dev", tn.hostLink},
		{"ip", "-6", "addr", "add", tn.IP6.Prev().Prev().String() + "/64", "dev", tn.hostLink, "nodad"},
		{"ip", "link", "set", tn.hostLink, "up"},
		{"ip", "netns", "exec", tn.Name, "ip", "link", "set", "lo", "up"},
		{"ip", "netns", "exec", tn.Name, "ip", "addr", "add", tn.IP.String() + "/28", "dev", peer},
		{"ip", "netns", "exec", tn.Name, "ip", "addr", "add", tn.IP2.String() + "/28", "dev", peer},
		{"ip", "netns", "exec", tn.Name, "ip", "-6", "addr", "add", tn.IP6.String() + "/64", "dev", peer, "nodad"},
		{"ip", "netns", "exec", tn.Name, "ip", "link", "set", peer, "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	caPEM, ca, caKey, err := newTestCA()
	if err != nil {
		return err
	}
	tn.CAPEM = caPEM
	tn.CAFile = filepath.Join(t.TempDir(), "testnet-ca.pem")
	if err := os.WriteFile(tn.CAFile, caPEM, 0o644); err != nil {
		return err
	}
	leaf, err := testLeaf(ca, caKey, tn)
	if err != nil {
		return err
	}
	return tn.inNetns(func() error { return tn.serve(leaf) })
}

// inNetns runs fn on a thread inside the test net's namespace; sockets
// made there stay in it.
func (tn *TestNet) inNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left dirty on purpose: not unlocking makes the
		// runtime discard it when this goroutine ends.
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.GetFromName(tn.Name)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Echo is the handler of the HTTP and HTTPS servers: it reports what it
// saw, and serves /bulk?n=BYTES for throughput.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/bulk" {
		var n int64
		fmt.Sscan(r.URL.Query().Get("n"), &n)
		w.Header().Set("Content-Length", fmt.Sprint(n))
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, int64(len(buf)))
			w.Write(buf[:k])
			n -= k
		}
		return
	}
	io.Copy(io.Discard, r.Body)
	fmt.Fprintf(w, "host=%s method=%s path=%s tls=%v\n", r.Host, r.Method, r.URL.Path, r.TLS != nil)
}

func (tn *TestNet) serve(leaf tls.Certificate) error {
	for _, ip := range []netip.Addr{tn.IP, tn.IP2, tn.IP6} {
		hl, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "80"))
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: http.HandlerFunc(tn.route), ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(hl)
		sl, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "443"))
		if err != nil {
			return err
		}
		ss := &http.Server{Handler: http.HandlerFunc(tn.route), ReadHeaderTimeout: 10 * time.Second,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}}}
		go ss.ServeTLS(sl, "", "")
		el, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "7"))
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := el.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); io.Copy(c, c) }()
			}
		}()
		ul, err := net.ListenPacket("udp", net.JoinHostPort(ip.String(), "443"))
		if err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				n, a, err := ul.ReadFrom(buf)
				if err != nil {
					return
				}
				ul.WriteTo(buf[:n], a)
			}
		}()
		tn.closers = append(tn.closers, hs, ss, el, ul)
	}
	pc, err := net.ListenPacket("udp", tn.DNSAddr)
	if err != nil {
		return err
	}
	tl, err := net.Listen("tcp", tn.DNSAddr)
	if err != nil {
		return err
	}
	ud := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(tn.serveDNS)}
	td := &dns.Server{Listener: tl, Handler: dns.HandlerFunc(tn.serveDNS)}
	go ud.ActivateAndServe()
	go td.ActivateAndServe()
	tn.closers = append(tn.closers, closerFunc(func() error { ud.Shutdown(); return td.Shutdown() }))
	return nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func (tn *TestNet) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) == 1 {
		q := req.Question[0]
		name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
		tn.mu.Lock()
		ip, ok := tn.Zone[name]
		tn.mu.Unlock()
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA && !strings.Contains(ip, ":"):
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip).To4()})
		case q.Qtype == dns.TypeAAAA && strings.Contains(ip, ":"):
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 5}, AAAA: net.ParseIP(ip)})
		}
	}
	w.WriteMsg(m)
}

// Close removes the namespace, the link and the servers.
func (tn *TestNet) Close() {
	for _, c := range tn.closers {
		c.Close()
	}
	tn.closers = nil
	run("ip", "link", "del", tn.hostLink)
	run("ip", "netns", "del", tn.Name)
}

// HostLinkExists reports whether the host side of the test net is there
// (for leak checks).
func (tn *TestNet) HostLinkExists() bool {
	_, err := netlink.LinkByName(tn.hostLink)
	return err == nil
}

// ConfigFile writes a daemon config declaring this test net public, its
// DNS server the upstream and its CA trusted by the egress proxy, and
// returns the `berth serve` arguments that load it.
func (tn *TestNet) ConfigFile(t TB) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "egress-config.yaml")
	cfg := fmt.Sprintf("dns_upstream: [%q]\npublic_test_nets: [%q, \"2001:db8::/32\"]\negress_ca_file: %q\n", tn.DNSAddr, tn.Prefix, tn.CAFile)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
	return []string{"--config", path}
}

// Dialer returns a context dialer that connects from inside the test
// net (for tests that need to play "the internet" calling in).
func (tn *TestNet) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := tn.inNetns(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func newTestCA() ([]byte, *x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth test-net CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert, key, nil
}

func testLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey, tn *TestNet) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	var names []string
	for n := range tn.Zone {
		names = append(names, n)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test net"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    append(names, "*.wild.test"),
		IPAddresses: []net.IP{tn.IP.AsSlice(), tn.IP2.AsSlice(), tn.IP6.AsSlice()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
