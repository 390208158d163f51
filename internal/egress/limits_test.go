package egress

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// The resolver drops queries past the sandbox's rate before answering
// them, counts them in its usage, and records the drops (aggregated).
func TestDNSRateLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("binds port 53 on a loopback address")
	}
	al, err := audit.New(audit.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{StateDir: t.TempDir(), Audit: al, Upstream: []string{"127.0.0.1:1"}, Guard: &policy.Guard{}, ProxyPort: 18080,
		Limits: Limits{DNSRate: 1, DNSBurst: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	host := netip.MustParseAddr("127.77.0.1")
	if err := e.Start(t.Context(), "sb1", host, policy.Policy{Mode: policy.ModeAllow}); err != nil {
		t.Skipf("cannot listen on %s: %v", host, err)
	}
	c, err := net.Dial("udp", netip.AddrPortFrom(host, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 200
	for i := range n {
		m := new(dns.Msg)
		m.SetQuestion("denied.test.", dns.TypeA)
		m.Id = uint16(i)
		p, _ := m.Pack()
		c.Write(p)
	}
	// Answers are REFUSED (the policy allows nothing); count them until
	// none comes for a while.
	answered := 0
	buf := make([]byte, 512)
	for {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(buf); err != nil {
			break
		}
		answered++
	}
	u, ok := e.Usage("sb1")
	if !ok {
		t.Fatal("no usage for a running sandbox")
	}
	t.Logf("%d queries sent, %d answered; usage %+v", n, answered, u)
	if u.DNSDropped == 0 || int64(answered) > u.DNSQueries-u.DNSDropped {
		t.Errorf("usage %+v with %d answered: want drops, and no more answers than admitted queries", u, answered)
	}
	// Closing the sandbox's log writes the pending aggregate.
	e.Stop("sb1")
	al.Close("sb1")
	recs, err := al.Read("sb1", audit.Filter{DeniedOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var limited int64
	for _, r := range recs {
		if r.Rule == "rate-limit" {
			limited += max(r.Count, 1)
		}
	}
	if limited != u.DNSDropped {
		t.Errorf("audit log accounts for %d dropped queries, usage says %d", limited, u.DNSDropped)
	}
}
