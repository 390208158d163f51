package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
)

// Ceiling is the operator's egress ceiling (daemon config egress_ceiling):
// the most any sandbox policy may let out.
//
//	egress_ceiling:
//	  allow: [github.com, "*.pypi.org", 198.51.100.0/24]  # empty: anything public
//	  deny:  ["*.internal.example", 203.0.113.0/24]       # never, whatever the policy
//
// Entries use the policy's syntax. Deny wins. A non-empty Allow bounds
// both kinds of connection: one by name (SNI, Host, DNS) must name a
// domain an Allow domain covers, one by address a CIDR an Allow CIDR
// covers; whichever kind Allow does not list is not bounded by it. Mode
// open means open within the ceiling. A policy entry that lies wholly
// outside the ceiling is refused when the policy is set (Check); one that
// only overlaps it is cut down to the ceiling when traffic is decided.
//
// Deny always includes DefaultCeilingDeny (private ranges, CGNAT, ULA,
// link-local, the cloud metadata addresses), and Check refuses the host's
// own addresses (HostAddrs). At run time the guard (Guard) keeps all of
// these, and loopback, out of reach, naming why; the ceiling's own
// decisions apply the operator's entries.
type Ceiling struct {
	Allow []string `json:"allow,omitempty" yaml:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty" yaml:"deny,omitempty"`
}

// DefaultCeilingDeny is what every ceiling denies.
var DefaultCeilingDeny = []string{
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
	"169.254.0.0/16", "fe80::/10",
	"100.100.100.200", "168.63.129.16", "fd00:ec2::254",
}

// defaultDenyField names the DefaultCeilingDeny entries.
const defaultDenyField = "egress_ceiling default deny"

// CompiledCeiling is a validated ceiling ready for checks and decisions.
// The zero value and nil are no ceiling at all.
type CompiledCeiling struct {
	Ceiling Ceiling
	// HostAddrs lists the host's own addresses, refused by Check (nil:
	// none).
	HostAddrs func() []netip.Addr
	allow     []ceilingRule
	deny      []ceilingRule
	allowName bool // Allow lists domains: names are bounded
	allowAddr bool // Allow lists CIDRs: addresses are bounded
}

// ceilingRule is a parsed ceiling entry and the name it is reported by
// ("egress_ceiling.deny[3]").
type ceilingRule struct {
	rule
	field string
}

func (r ceilingRule) String() string { return r.field + " " + r.text }

// CompileCeiling validates c (naming the bad entry as
// "egress_ceiling.allow[i]") and adds the default denials.
func CompileCeiling(c Ceiling) (*CompiledCeiling, error) {
	cc := &CompiledCeiling{Ceiling: c}
	for i, s := range c.Allow {
		r, err := parseRule(fmt.Sprintf("egress_ceiling.allow[%d]", i), s)
		if err != nil {
			return nil, err
		}
		cc.allow = append(cc.allow, ceilingRule{r, fmt.Sprintf("egress_ceiling.allow[%d]", i)})
		if r.domain != "" {
			cc.allowName = true
		} else {
			cc.allowAddr = true
		}
	}
	for i, s := range c.Deny {
		r, err := parseRule(fmt.Sprintf("egress_ceiling.deny[%d]", i), s)
		if err != nil {
			return nil, err
		}
		cc.deny = append(cc.deny, ceilingRule{r, fmt.Sprintf("egress_ceiling.deny[%d]", i)})
	}
	for _, s := range DefaultCeilingDeny {
		r, err := parseRule("egress_ceiling default", s)
		if err != nil {
			return nil, err
		}
		cc.deny = append(cc.deny, ceilingRule{r, defaultDenyField})
	}
	return cc, nil
}

// DenyPrefixes are the operator's address denials (port 0: every port),
// for the firewall to refuse before the proxy sees a connection. The
// default denials are left to the proxy, whose guard refuses them on
// every path anyway and answers HTTP with the reason (a 403 naming the
// metadata address says more to an agent than a reset).
func (cc *CompiledCeiling) DenyPrefixes() []PortPrefix {
	if cc == nil {
		return nil
	}
	var out []PortPrefix
	for _, r := range cc.deny {
		if r.prefix.IsValid() && r.field != defaultDenyField {
			out = append(out, PortPrefix{Prefix: r.prefix, Port: r.port})
		}
	}
	return out
}

// PortPrefix is an address range, on one port or (Port 0) all.
type PortPrefix struct {
	Prefix netip.Prefix
	Port   uint16
}

// CeilingError is a policy entry outside the operator's ceiling: Field
// names the entry ("allow[2]", "http[0].host"), Ceiling the ceiling entry
// it falls foul of.
type CeilingError struct {
	Field   string
	Entry   string
	Ceiling string
}

func (e *CeilingError) Error() string {
	return fmt.Sprintf("%s %q is outside the operator's egress ceiling (%s)", e.Field, e.Entry, e.Ceiling)
}

// Unwrap classifies the error: the request is well-formed, the operator
// forbids it.
func (e *CeilingError) Unwrap() error { return errdefs.ErrPermissionDenied }

// Check refuses a policy (already validated) that names anything wholly
// outside the ceiling: an allow entry or HTTP rule a ceiling denial covers,
// one no ceiling allow entry of its kind covers, or the host's own
// address. Deny entries and modes never exceed the ceiling.
func (cc *CompiledCeiling) Check(p Policy) error {
	if cc == nil {
		return nil
	}
	for i, s := range p.Allow {
		field := fmt.Sprintf("allow[%d]", i)
		r, err := parseRule(field, s)
		if err != nil {
			return err
		}
		if why, bad := cc.outside(r); bad {
			return &CeilingError{Field: field, Entry: s, Ceiling: why}
		}
	}
	for i, h := range p.HTTP {
		field := fmt.Sprintf("http[%d].host", i)
		r, err := parseRule(field, h.Host)
		if err != nil {
			return err
		}
		if why, bad := cc.outside(r); bad {
			return &CeilingError{Field: field, Entry: h.Host, Ceiling: why}
		}
	}
	return nil
}

// outside says which ceiling entry puts r wholly outside the ceiling.
func (cc *CompiledCeiling) outside(r rule) (string, bool) {
	for _, d := range cc.deny {
		if covers(d.rule, r) {
			return d.String(), true
		}
	}
	if r.prefix.IsValid() {
		if cc.HostAddrs != nil && r.prefix.IsSingleIP() {
			forms := Embedded(r.prefix.Addr())
			for _, h := range cc.HostAddrs() {
				for _, f := range forms {
					if f == h.WithZone("").Unmap() {
						return "the host's own address " + h.String(), true
					}
				}
			}
		}
		if cc.allowAddr && !cc.coveredByAllow(r) {
			return "no egress_ceiling.allow entry covers it", true
		}
		return "", false
	}
	if cc.allowName && !cc.coveredByAllow(r) {
		return "no egress_ceiling.allow entry covers it", true
	}
	return "", false
}

func (cc *CompiledCeiling) coveredByAllow(r rule) bool {
	for _, a := range cc.allow {
		if covers(a.rule, r) {
			return true
		}
	}
	return false
}

// covers reports whether outer matches everything inner does: a domain
// pattern covering a name or narrower pattern, a prefix (on any port, or
// inner's one port) containing a prefix.
func covers(outer, inner rule) bool {
	if outer.domain != "" || inner.domain != "" {
		if outer.domain == "" || inner.domain == "" {
			return false
		}
		if outer.domain == inner.domain {
			return true
		}
		name := strings.TrimPrefix(inner.domain, "*.")
		if strings.HasPrefix(inner.domain, "*.") {
			// *.x is covered by *.y when x is y or under it.
			return strings.HasPrefix(outer.domain, "*.") && (outer.domain[2:] == name || MatchDomain(outer.domain, name))
		}
		return MatchDomain(outer.domain, name)
	}
	if outer.port != 0 && outer.port != inner.port {
		return false
	}
	o, in := outer.prefix, inner.prefix
	if o.Addr().Is4() != in.Addr().Is4() {
		// A one-address IPv6 entry is also every IPv4 address it embeds.
		return in.IsSingleIP() && containsAny(o, Embedded(in.Addr())[1:])
	}
	return o.Bits() <= in.Bits() && o.Contains(in.Addr())
}

// denyName is the ceiling entry that denies a connection or query naming
// host, if any.
func (cc *CompiledCeiling) denyName(host string) (Decision, bool) {
	if cc == nil {
		return Decision{}, false
	}
	for _, r := range cc.deny {
		if r.domain != "" && r.field != defaultDenyField && MatchDomain(r.domain, host) {
			return deny("ceiling: " + r.String()), true
		}
	}
	if cc.allowName {
		for _, r := range cc.allow {
			if r.domain != "" && MatchDomain(r.domain, host) {
				return Decision{}, false
			}
		}
		return deny("ceiling: no egress_ceiling.allow entry covers " + host), true
	}
	return Decision{}, false
}

// denyAddr is the ceiling entry that denies ip:port (in any IPv4 form it
// embeds), if any. bounded says whether a ceiling allow list of addresses
// applies (connections by address; not resolved addresses of names).
func (cc *CompiledCeiling) denyAddr(ip netip.Addr, port uint16, bounded bool) (Decision, bool) {
	if cc == nil {
		return Decision{}, false
	}
	forms := Embedded(ip)
	for _, r := range cc.deny {
		// The default denials are the guard's at run time (every path
		// ends in it, and it names the reason: "cloud metadata address").
		if r.prefix.IsValid() && r.field != defaultDenyField && (r.port == 0 || r.port == port) && containsAny(r.prefix, forms) {
			return deny("ceiling: " + r.String()), true
		}
	}
	if bounded && cc.allowAddr {
		for _, r := range cc.allow {
			if r.prefix.IsValid() && (r.port == 0 || r.port == port) && containsAny(r.prefix, forms) {
				return Decision{}, false
			}
		}
		return deny("ceiling: no egress_ceiling.allow entry covers " + ip.String()), true
	}
	return Decision{}, false
}
