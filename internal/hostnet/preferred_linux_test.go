package hostnet

import (
	"net/netip"
	"testing"
)

// TestPreferred: a resumed sandbox gets the /30 of its old address back
// when that is free and in the pool, and nothing (the usual allocation)
// otherwise.
func TestPreferred(t *testing.T) {
	pool := netip.MustParsePrefix("198.18.0.0/15")
	used := []netip.Prefix{netip.MustParsePrefix("198.18.0.4/30")}
	for _, tt := range []struct {
		addr string
		want string // "" = none
	}{
		{"198.18.0.10", "198.18.0.8/30"},
		{"198.18.0.6", ""},  // taken meanwhile
		{"10.0.0.2", ""},    // outside the pool
		{"", ""},            // no address known
		{"2001:db8::2", ""}, // not IPv4
	} {
		var addr netip.Addr
		if tt.addr != "" {
			addr = netip.MustParseAddr(tt.addr)
		}
		got, ok := preferred(pool, addr, used)
		if (tt.want == "") == ok || (ok && got.String() != tt.want) {
			t.Errorf("preferred(%q) = %v, %v; want %q", tt.addr, got, ok, tt.want)
		}
	}
}
