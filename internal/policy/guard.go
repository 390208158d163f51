package policy

import "net/netip"

// nonPublic are the ranges a sandbox never reaches, whatever its policy
// says: IANA special-purpose blocks (private, loopback, link-local, CGNAT,
// multicast, documentation, benchmarking, reserved) and the cloud metadata
// endpoints. Public test nets (Guard.Public) may carve documentation and
// benchmarking blocks back out, for tests; alwaysForbidden may not be.
var nonPublic = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"255.255.255.255/32",
	"::/128", "::1/128", "::ffff:0:0/96", "64:ff9b:1::/48", "100::/64", "2001::/23",
	"2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
)

// alwaysForbidden cannot be declared public: loopback, link-local (where
// metadata services live), the metadata addresses themselves.
var alwaysForbidden = mustPrefixes(
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32",
	"100.100.100.200/32", "168.63.129.16/32",
	"::/128", "::1/128", "fe80::/10", "ff00::/8", "fd00:ec2::254/128",
)

// Metadata endpoints of the big clouds, listed for documentation and tests;
// every one of them is inside nonPublic or alwaysForbidden.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"), netip.MustParseAddr("168.63.129.16"),
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Guard decides whether an address is public, i.e. one a sandbox may
// ever reach.
type Guard struct {
	// Public are ranges treated as public although special-purpose (a test
	// net such as 198.51.100.0/24). Loopback, link-local, multicast and the
	// metadata addresses stay forbidden regardless.
	Public []netip.Prefix
	// HostAddrs lists the host's own addresses, which are forbidden too
	// (the daemon passes hostnet.HostAddrs, read from the kernel). Nil
	// means none beyond the non-public ranges, which is right only where
	// the host has no public address of its own (tests).
	HostAddrs func() []netip.Addr
}

// Forbidden reports whether ip may never be reached, and why.
func (g *Guard) Forbidden(ip netip.Addr) (bool, string) {
	ip = ip.WithZone("")
	if !ip.IsValid() {
		return true, "invalid address"
	}
	// Every IPv4 address the IPv6 form embeds (NAT64, 6to4, Teredo,
	// mapped) must be reachable too.
	if forms := Embedded(ip); len(forms) > 1 || forms[0] != ip {
		for _, f := range forms[1:] {
			if bad, why := g.Forbidden(f); bad {
				return true, why
			}
		}
		ip = forms[0]
	}
	for _, m := range metadataAddrs {
		if ip == m {
			return true, "cloud metadata address"
		}
	}
	for _, p := range alwaysForbidden {
		if p.Contains(ip) {
			return true, "non-public address " + p.String()
		}
	}
	for _, h := range g.hostAddrs() {
		if h == ip {
			return true, "the host's own address"
		}
	}
	for _, p := range g.Public {
		if p.Contains(ip) {
			return false, ""
		}
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return true, "non-public address " + p.String()
		}
	}
	return false, ""
}

func (g *Guard) hostAddrs() []netip.Addr {
	if g.HostAddrs == nil {
		return nil
	}
	return g.HostAddrs()
}
