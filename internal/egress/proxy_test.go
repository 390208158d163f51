package egress

import (
	"bufio"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/internal/policy"
)

func TestRequestPath(t *testing.T) {
	tests := []struct {
		line, want string
		bad        bool
	}{
		{"GET /public/../secret?x=1 HTTP/1.1", "/secret", false},
		{"GET http://api.test/public/./a?q HTTP/1.1", "/public/a", false},
		{"GET http://api.test HTTP/1.1", "/", false},
		{"GET /public/%2e%2e/secret HTTP/1.1", "", true},
		{"GET /a%2Fb HTTP/1.1", "", true},
		{"OPTIONS * HTTP/1.1", "", true},
	}
	for _, tt := range tests {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(tt.line + "\r\nHost: api.test\r\n\r\n")))
		if err != nil {
			t.Fatalf("%q: %v", tt.line, err)
		}
		got, err := requestPath(req)
		if tt.bad {
			if !errors.Is(err, policy.ErrAmbiguousPath) {
				t.Errorf("requestPath(%q) = %q, %v; want ErrAmbiguousPath", tt.line, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("requestPath(%q) = %q, %v; want %q", tt.line, got, err, tt.want)
		}
	}
}

func TestDecideRequestOnConnection(t *testing.T) {
	pol, err := policy.Compile(policy.Policy{Mode: policy.ModeOpen, Deny: []string{"198.51.100.7"},
		HTTP: []policy.HTTPRule{{Host: "api.test", Methods: []string{"GET"}, Path: "/public/"}}})
	if err != nil {
		t.Fatal(err)
	}
	ok := netip.MustParseAddr("198.51.100.1")
	denied := netip.MustParseAddr("198.51.100.7")
	tests := []struct {
		host, path string
		ip         netip.Addr
		want       bool
	}{
		{"api.test", "/public/a", ok, true},
		{"api.test", "/secret", ok, false},
		{"api.test", "/public/a", denied, false}, // the dialed address is denied
		{"other.test", "/", ok, true},
		{"[64:ff9b::c633:6407]", "/", netip.Addr{}, false}, // NAT64 of a denied address
		{"198.51.100.1", "/", netip.Addr{}, true},
	}
	for _, tt := range tests {
		if d := decideRequest(pol, tt.host, "GET", tt.path, tt.ip, 80); d.Allow != tt.want {
			t.Errorf("decideRequest(%s %s via %s) = %+v, want allow=%v", tt.host, tt.path, tt.ip, d, tt.want)
		}
	}
}
