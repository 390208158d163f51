package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestCeilingCheck(t *testing.T) {
	host := netip.MustParseAddr("203.0.113.9")
	tests := []struct {
		name    string
		ceiling Ceiling
		policy  Policy
		field   string // "" = accepted
		entry   string // substring of the ceiling entry named
	}{
		{"open within default", Ceiling{}, Policy{Mode: ModeOpen}, "", ""},
		{"private CIDR", Ceiling{}, Policy{Mode: ModeAllow, Allow: []string{"github.com", "10.1.2.0/24"}}, "allow[1]", "10.0.0.0/8"},
		{"metadata", Ceiling{}, Policy{Mode: ModeAllow, Allow: []string{"169.254.169.254:80"}}, "allow[0]", "169.254.0.0/16"},
		{"nat64 of private", Ceiling{}, Policy{Mode: ModeAllow, Allow: []string{"64:ff9b::a00:1"}}, "allow[0]", "10.0.0.0/8"},
		{"ula", Ceiling{}, Policy{Mode: ModeAllow, Allow: []string{"fd12::/64"}}, "allow[0]", "fc00::/7"},
		{"host address", Ceiling{}, Policy{Mode: ModeAllow, Allow: []string{"203.0.113.9"}}, "allow[0]", "host's own"},
		{"wider than private is cut at run time", Ceiling{}, Policy{Mode: ModeAllow, Allow: []string{"0.0.0.0/0:443"}}, "", ""},
		{"deny entries never exceed", Ceiling{}, Policy{Mode: ModeOpen, Deny: []string{"10.0.0.0/8", "x.test"}}, "", ""},
		{"ceiling deny domain", Ceiling{Deny: []string{"*.corp.test"}}, Policy{Mode: ModeAllow, Allow: []string{"a.corp.test"}}, "allow[0]", "egress_ceiling.deny[0] *.corp.test"},
		{"ceiling deny wildcard covers narrower wildcard", Ceiling{Deny: []string{"*.corp.test"}}, Policy{Mode: ModeAllow, Allow: []string{"*.x.corp.test"}}, "allow[0]", "deny[0]"},
		{"wider wildcard only overlaps", Ceiling{Deny: []string{"a.corp.test"}}, Policy{Mode: ModeAllow, Allow: []string{"*.corp.test"}}, "", ""},
		{"http host", Ceiling{Deny: []string{"api.test"}}, Policy{Mode: ModeAllow, HTTP: []HTTPRule{{Host: "api.test", Methods: []string{"GET"}, Path: "/"}}}, "http[0].host", "deny[0]"},
		{"allow list of names", Ceiling{Allow: []string{"*.test"}}, Policy{Mode: ModeAllow, Allow: []string{"a.test", "github.com"}}, "allow[1]", "no egress_ceiling.allow"},
		{"names do not bound addresses", Ceiling{Allow: []string{"*.test"}}, Policy{Mode: ModeAllow, Allow: []string{"198.51.100.1"}}, "", ""},
		{"allow list of CIDRs", Ceiling{Allow: []string{"198.51.100.0/24:443"}}, Policy{Mode: ModeAllow, Allow: []string{"198.51.100.7:443", "198.51.100.7"}}, "allow[1]", "no egress_ceiling.allow"},
	}
	for _, tt := range tests {
		cc, err := CompileCeiling(tt.ceiling)
		if err != nil {
			t.Fatalf("%s: CompileCeiling: %v", tt.name, err)
		}
		cc.HostAddrs = func() []netip.Addr { return []netip.Addr{host} }
		err = cc.Check(tt.policy)
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s: Check = %v, want accepted", tt.name, err)
			}
			continue
		}
		var ce *CeilingError
		if !errors.As(err, &ce) || !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%s: Check = %v, want a permission-denied CeilingError", tt.name, err)
			continue
		}
		if ce.Field != tt.field || !strings.Contains(ce.Ceiling, tt.entry) {
			t.Errorf("%s: Check = field %q ceiling %q, want field %q naming %q", tt.name, ce.Field, ce.Ceiling, tt.field, tt.entry)
		}
	}
}

func TestCompileCeilingNamesBadEntry(t *testing.T) {
	_, err := CompileCeiling(Ceiling{Allow: []string{"ok.test"}, Deny: []string{"10.0.0/8"}})
	var re *RuleError
	if !errors.As(err, &re) || re.Field != "egress_ceiling.deny[0]" || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("CompileCeiling = %v, want an invalid-argument RuleError for egress_ceiling.deny[0]", err)
	}
}

func TestDecideWithinCeiling(t *testing.T) {
	cc, err := CompileCeiling(Ceiling{Allow: []string{"*.test", "198.51.100.0/24"}, Deny: []string{"bad.test", "198.51.100.2"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(Policy{Mode: ModeOpen})
	if err != nil {
		t.Fatal(err)
	}
	w := c.Within(cc)
	names := map[string]bool{"ok.test": true, "bad.test": false, "github.com": false}
	for n, want := range names {
		if d := w.DecideName(n); d.Allow != want {
			t.Errorf("open within ceiling: DecideName(%q) = %+v, want allow %v", n, d, want)
		}
		if d := w.DecideRequest(n, "GET", "/"); d.Allow != want {
			t.Errorf("open within ceiling: DecideRequest(%q) = %+v, want allow %v", n, d, want)
		}
	}
	addrs := map[string]bool{"198.51.100.1": true, "198.51.100.2": false, "64:ff9b::c633:6402": false, "8.8.8.8": false, "10.0.0.1": false}
	for a, want := range addrs {
		if d := w.DecideAddr(netip.MustParseAddr(a), 443); d.Allow != want {
			t.Errorf("open within ceiling: DecideAddr(%s) = %+v, want allow %v", a, d, want)
		}
	}
	// Resolved addresses of an allowed name: ceiling denials filter them,
	// the address allow list does not (the name was decided).
	if _, bad := w.DeniedAddr(netip.MustParseAddr("198.51.100.2"), 0); !bad {
		t.Errorf("DeniedAddr(198.51.100.2) = false, want the ceiling's denial")
	}
	if _, bad := w.DeniedAddr(netip.MustParseAddr("8.8.8.8"), 0); bad {
		t.Errorf("DeniedAddr(8.8.8.8) = true, want only denials to filter answers")
	}
	if d := c.DecideName("github.com"); !d.Allow {
		t.Errorf("Within changed the original: DecideName = %+v", d)
	}
}

func TestDenyPrefixesAreTheOperators(t *testing.T) {
	cc, err := CompileCeiling(Ceiling{Deny: []string{"203.0.113.0/24", "x.test", "198.51.100.7:443"}})
	if err != nil {
		t.Fatal(err)
	}
	got := cc.DenyPrefixes()
	want := []PortPrefix{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}, {Prefix: netip.MustParsePrefix("198.51.100.7/32"), Port: 443}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("DenyPrefixes = %v, want %v (the defaults stay with the proxy's guard)", got, want)
	}
}
