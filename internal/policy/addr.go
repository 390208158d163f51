package policy

import "net/netip"

// IPv6 forms that carry an IPv4 address. A packet to one of them may reach
// that IPv4 host (through a NAT64 gateway, a 6to4 or Teredo relay, or the
// host's own dual stack), so every decision treats such an address as the
// IPv4 address too: an IPv4 deny rule covers its NAT64 form, and a
// forbidden IPv4 address stays forbidden however it is spelled.
var (
	nat64WKP   = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052 well-known prefix
	nat64Local = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215 local-use prefix
	sixToFour  = netip.MustParsePrefix("2002::/16")      // RFC 3056
	teredo     = netip.MustParsePrefix("2001::/32")      // RFC 4380
	v4compat   = netip.MustParsePrefix("::/96")          // deprecated IPv4-compatible
)

// Embedded returns ip (unmapped, zone dropped) followed by every IPv4
// address its IPv6 form embeds: IPv4-mapped, NAT64 (the well-known /96
// and, in both the /48 and /96 layouts of RFC 6052, the local-use /48),
// 6to4, Teredo (server and de-obfuscated client) and IPv4-compatible.
func Embedded(ip netip.Addr) []netip.Addr {
	ip = ip.WithZone("").Unmap()
	out := []netip.Addr{ip}
	if !ip.Is6() {
		return out
	}
	b := ip.As16()
	v4 := func(x [4]byte) { out = append(out, netip.AddrFrom4(x)) }
	switch {
	case nat64WKP.Contains(ip):
		v4([4]byte{b[12], b[13], b[14], b[15]})
	case nat64Local.Contains(ip):
		// /48 layout: bits 48-63, then (after the zero "u" octet) 72-87.
		v4([4]byte{b[6], b[7], b[9], b[10]})
		// A /96 inside the local-use block keeps it in the last 32 bits.
		v4([4]byte{b[12], b[13], b[14], b[15]})
	case sixToFour.Contains(ip):
		v4([4]byte{b[2], b[3], b[4], b[5]})
	case teredo.Contains(ip):
		v4([4]byte{b[4], b[5], b[6], b[7]})
		v4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
	case v4compat.Contains(ip) && ip != netip.IPv6Unspecified() && ip != netip.IPv6Loopback():
		v4([4]byte{b[12], b[13], b[14], b[15]})
	}
	return out
}
