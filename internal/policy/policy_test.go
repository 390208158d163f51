package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/audit"
)

func TestMatchDomain(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"github.com", "github.com", true},
		{"github.com", "GitHub.com.", true},
		{"github.com", "api.github.com", false},
		{"*.pypi.org", "files.pypi.org", true},
		{"*.pypi.org", "a.b.pypi.org", true},
		{"*.pypi.org", "pypi.org", false},
		{"*.pypi.org", "evilpypi.org", false},
		{"*.pypi.org", "pypi.org.evil.com", false},
		{"*.pypi.org", ".pypi.org", false},
		{"github.com", "", false},
		{"", "github.com", false},
		{"*.", "a.", false},
	}
	for _, tt := range tests {
		if got := MatchDomain(tt.pattern, tt.name); got != tt.want {
			t.Errorf("MatchDomain(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

func TestParseBad(t *testing.T) {
	tests := []struct {
		name, doc, field string
	}{
		{"mode", `mode: sometimes`, "mode"},
		{"domain", "mode: allow\nallow: [github.com, \"foo..bar\"]", "allow[1]"},
		{"cidr", "mode: allow\nallow: [10.0.0.0/33]", "allow[0]"},
		{"port", "mode: allow\nallow: [198.51.100.0/24:70000]", "allow[0]"},
		{"port0", "mode: allow\nallow: [198.51.100.1:0]", "allow[0]"},
		{"domain port", "mode: allow\nallow: [github.com:443]", "allow[0]"},
		{"deny", "mode: allow\ndeny: [\"*\"]", "deny[0]"},
		{"numeric", "mode: allow\nallow: [10.0.0]", "allow[0]"},
		{"method", "mode: allow\nhttp: [{host: a.com, methods: [\"GE T\"], path: /}]", "http[0].methods"},
		{"path", "mode: allow\nhttp: [{host: a.com, methods: [GET], path: v1}]", "http[0].path"},
		{"host", "mode: allow\nhttp: [{host: \"a b\", methods: [GET], path: /}]", "http[0].host"},
		{"unknown key", "mode: allow\nallowed: [a.com]", "policy"},
		{"v6 bracket", "mode: allow\nallow: [\"[2001:db8::1\"]", "allow[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			var re *RuleError
			if !errors.As(err, &re) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Parse: %v, want a RuleError", err)
			}
			if re.Field != tt.field {
				t.Errorf("field = %q, want %q (%v)", re.Field, tt.field, err)
			}
		})
	}
}

func TestParseGood(t *testing.T) {
	json := `{"mode":"allow","allow":["GitHub.com.","*.pypi.org","198.51.100.0/24:443","[2001:db8::/32]:443","198.51.100.7"],
	  "deny":["evil.github.com"],"http":[{"host":"api.example.com","methods":["get","HEAD"],"path":"/v1/"}]}`
	p, err := Parse([]byte(json))
	if err != nil {
		t.Fatal(err)
	}
	if p.Allow[0] != "github.com" || p.HTTP[0].Methods[0] != "GET" {
		t.Errorf("not normalised: %+v", p)
	}
	r, err := ParseHTTPRule("api.example.com GET,HEAD /v1/")
	if err != nil || r.String() != "api.example.com GET,HEAD /v1/" {
		t.Errorf("ParseHTTPRule = %+v, %v", r, err)
	}
	if _, err := ParseHTTPRule("api.example.com GET"); err == nil {
		t.Error("ParseHTTPRule accepted two fields")
	}
}

func TestDecide(t *testing.T) {
	c, err := Compile(Policy{Mode: ModeAllow,
		Allow: []string{"github.com", "*.pypi.org", "198.51.100.0/24:443", "203.0.113.9"},
		Deny:  []string{"bad.pypi.org", "198.51.100.66"},
		HTTP:  []HTTPRule{{Host: "api.example.com", Methods: []string{"GET"}, Path: "/v1/"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	names := []struct {
		name      string
		allow     bool
		intercept bool
	}{
		{"github.com", true, false},
		{"api.github.com", false, false},
		{"files.pypi.org", true, false},
		{"bad.pypi.org", false, false},
		{"pypi.org", false, false},
		{"api.example.com", true, true},
	}
	for _, tt := range names {
		d := c.DecideName(tt.name)
		if d.Allow != tt.allow || d.Intercept != tt.intercept {
			t.Errorf("DecideName(%q) = %+v", tt.name, d)
		}
	}
	addrs := []struct {
		ip    string
		port  uint16
		allow bool
	}{
		{"198.51.100.10", 443, true},
		{"198.51.100.10", 80, false},
		{"198.51.100.66", 443, false},
		{"203.0.113.9", 22, true},
		{"::ffff:203.0.113.9", 22, true},
		{"192.0.2.1", 443, false},
	}
	for _, tt := range addrs {
		if d := c.DecideAddr(netip.MustParseAddr(tt.ip), tt.port); d.Allow != tt.allow {
			t.Errorf("DecideAddr(%s, %d) = %+v", tt.ip, tt.port, d)
		}
	}
	reqs := []struct {
		host, method, path string
		allow              bool
	}{
		{"api.example.com", "GET", "/v1/users", true},
		{"api.example.com", "POST", "/v1/users", false},
		{"api.example.com", "GET", "/v2/", false},
		{"github.com", "DELETE", "/x", true},
	}
	for _, tt := range reqs {
		if d := c.DecideRequest(tt.host, tt.method, tt.path); d.Allow != tt.allow {
			t.Errorf("DecideRequest(%s %s %s) = %+v", tt.host, tt.method, tt.path, d)
		}
	}
	for _, m := range []Mode{ModeNone, ModeLearn} {
		c, _ := Compile(Policy{Mode: m, Allow: []string{"github.com"}})
		if c.DecideName("github.com").Allow || c.DecideAddr(netip.MustParseAddr("8.8.8.8"), 443).Allow {
			t.Errorf("mode %s allowed something", m)
		}
	}
	open, _ := Compile(Policy{Mode: ModeOpen, Deny: []string{"*.evil.com"}})
	if !open.DecideName("example.com").Allow || open.DecideName("x.evil.com").Allow {
		t.Error("open mode decisions wrong")
	}
}

func TestGuard(t *testing.T) {
	g := &Guard{Public: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("127.0.0.0/8")},
		HostAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("198.51.100.254")} }}
	tests := []struct {
		ip        string
		forbidden bool
	}{
		{"8.8.8.8", false},
		{"198.51.100.7", false},
		{"198.51.100.254", true}, // the host's own
		{"127.0.0.1", true},      // loopback cannot be made public
		{"::ffff:127.0.0.1", true},
		{"64:ff9b::7f00:1", true},
		{"64:ff9b::808:808", false},
		{"169.254.169.254", true},
		{"fd00:ec2::254", true},
		{"100.100.100.200", true},
		{"168.63.129.16", true},
		{"10.1.2.3", true},
		{"100.64.0.1", true},
		{"192.168.1.1", true},
		{"224.0.0.1", true},
		{"203.0.113.1", true},
		{"2001:db8::1", true},
		{"2606:4700::1", false},
		{"fe80::1", true},
		{"::1", true},
	}
	for _, tt := range tests {
		if got, why := g.Forbidden(netip.MustParseAddr(tt.ip)); got != tt.forbidden {
			t.Errorf("Forbidden(%s) = %v (%s), want %v", tt.ip, got, why, tt.forbidden)
		}
	}
}

func TestSuggest(t *testing.T) {
	recs := []audit.Record{
		{Proto: "dns", Name: "github.com", Decision: "deny", Rule: "mode learn"},
		{Proto: "tls", Name: "github.com", Decision: "deny", Rule: "mode learn"},
		{Proto: "tcp", IP: "198.51.100.9", Port: 22, Decision: "deny", Rule: "mode learn"},
		{Proto: "tls", Name: "ok.com", Decision: "allow", Rule: "allow ok.com"},
		{Proto: "tcp", IP: "127.0.0.1", Port: 80, Decision: "deny", Rule: "mode open", Reason: "127.0.0.1: non-public address 127.0.0.0/8"},
		// The firewall's refusals: UDP and foreign DNS cannot be allowed.
		{Proto: "udp", IP: "198.51.100.9", Port: 443, Decision: "deny", Rule: "firewall"},
		{Proto: "udp", IP: "198.51.100.9", Port: 53, Decision: "deny", Rule: "firewall"},
		{Proto: "tcp", IP: "198.51.100.9", Port: 853, Decision: "deny", Rule: "firewall"},
	}
	p := Suggest(recs)
	got := strings.Join(p.Allow, " ")
	if p.Mode != ModeAllow || got != "github.com 198.51.100.9/32:22" {
		t.Errorf("Suggest = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Errorf("suggested policy is invalid: %v", err)
	}
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{
		"mode: allow\nallow: [github.com, \"*.pypi.org\", 198.51.100.0/24:443]",
		`{"mode":"open","deny":["10.0.0.0/8"]}`,
		"mode: allow\nhttp: [{host: a.com, methods: [GET], path: /v1/}]",
		"mode: learn", "", "allow: [\"[::1]:80\"]", "mode: none\nallow: [1.2.3.4:65535]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := Parse([]byte(doc))
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error %v is not invalid-argument", err)
			}
			return
		}
		// What parses compiles, and normalising is idempotent.
		if _, err := Compile(p); err != nil {
			t.Fatalf("Compile after Parse: %v", err)
		}
		if err := p.Normalize().Validate(); err != nil {
			t.Fatalf("normalised policy invalid: %v", err)
		}
	})
}

func FuzzMatchDomain(f *testing.F) {
	f.Add("*.pypi.org", "files.pypi.org")
	f.Add("github.com", "GITHUB.COM.")
	f.Add("*.a", "a")
	f.Add("*.x.y", "evilx.y")
	f.Fuzz(func(t *testing.T, pattern, name string) {
		got := MatchDomain(pattern, name)
		p := strings.ToLower(strings.TrimSuffix(pattern, "."))
		n := strings.ToLower(strings.TrimSuffix(name, "."))
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			// A wildcard match ends on a dot boundary and is never the apex.
			if got && (n == suffix || !strings.HasSuffix(n, "."+suffix)) {
				t.Fatalf("MatchDomain(%q, %q) matched outside the subdomains", pattern, name)
			}
		} else if got != (p != "" && p == n) {
			t.Fatalf("MatchDomain(%q, %q) = %v for an exact pattern", pattern, name, got)
		}
	})
}
