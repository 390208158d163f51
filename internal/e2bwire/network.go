package e2bwire

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/policy"
)

// NetworkConfig is E2B's network settings: the network object of a create
// (with the top-level allow_internet_access folded in) or the body of PUT
// /sandboxes/{id}/network.
type NetworkConfig struct {
	AllowInternetAccess *bool           `json:"allow_internet_access,omitempty"`
	AllowOut            []string        `json:"allowOut,omitempty"`
	DenyOut             []string        `json:"denyOut,omitempty"`
	Rules               json.RawMessage `json:"rules,omitempty"`
	EgressProxy         json.RawMessage `json:"egressProxy,omitempty"`
	AllowPublicTraffic  *bool           `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost     *string         `json:"maskRequestHost,omitempty"`
	HTTPSPorts          json.RawMessage `json:"httpsPorts,omitempty"`
}

// StoreJSON is the config as kept for getInfo, with allow_internet_access
// set to whether the sandbox's base stance is the open internet.
func (n NetworkConfig) StoreJSON(internet bool) string {
	n.AllowInternetAccess = &internet
	b, _ := json.Marshal(n) // plain data always marshals
	return string(b)
}

// StoredNetwork reads a record's network config back: the config getInfo
// echoes (without the internal allow_internet_access) and the base stance.
// A record without one (or an older one without the flag) means no
// internet.
func StoredNetwork(raw string) (cfg json.RawMessage, internet bool) {
	var n NetworkConfig
	if raw == "" || json.Unmarshal([]byte(raw), &n) != nil {
		return nil, false
	}
	internet = n.AllowInternetAccess != nil && *n.AllowInternetAccess
	n.AllowInternetAccess = nil
	b, _ := json.Marshal(n) // plain data always marshals
	return b, internet
}

// allTraffic is E2B's ALL_TRAFFIC selector in denyOut.
func allTraffic(d string) bool { return d == "0.0.0.0/0" || d == "::/0" }

// EgressPolicy maps E2B's network settings onto Berth's egress policy, as
// E2B evaluates them (an update is evaluated like a create: it replaces the
// whole egress configuration, and what it omits is cleared):
//
//   - the base stance is the open internet (E2B's default) unless
//     allow_internet_access is false or denyOut holds 0.0.0.0/0, in which
//     case it is nothing;
//   - on the open internet, denyOut entries are carved out (mode open with
//     deny rules; Berth still never lets a sandbox reach private, loopback,
//     link-local or metadata addresses);
//   - with everything denied, allowOut entries (CIDR, IP or domain) are the
//     only way out (mode allow);
//
// with two differences, both towards less egress than E2B would give:
//
//   - a create that says nothing about the network gets no egress (mode
//     none), Berth's default: a sandbox that needs the internet says so
//     (allowInternetAccess: true, or network rules), and the operator's
//     logs show it. emptyMeansOpen is false for creates, true for updates,
//     where E2B's "an empty update clears every rule" is honoured;
//   - allowOut without allow_internet_access or denyOut is an allow list
//     (E2B would let everything out: with nothing denied, allowing some
//     destinations changes nothing).
//
// Berth's deny rules win over its allow rules, where E2B's allowOut wins
// over denyOut: an allowOut entry inside a partial denyOut range is refused
// by name rather than silently denied. Rules and egress proxies of E2B's
// own (network.rules, egressProxy) have no Berth equivalent yet and are
// refused by name.
//
// noInternet (the daemon's e2b_default_network: none) turns the open
// internet off: what would be open is nothing but its allowOut entries.
func EgressPolicy(n NetworkConfig, emptyMeansOpen, noInternet bool) (p policy.Policy, internet bool, err error) {
	if Present(n.Rules) && string(n.Rules) != "{}" {
		return policy.Policy{}, false, fmt.Errorf("network.rules is not supported by Berth; use allowOut/denyOut: %w", errdefs.ErrInvalidArgument)
	}
	if Present(n.EgressProxy) {
		return policy.Policy{}, false, fmt.Errorf("network.egressProxy is not supported by Berth: its own egress proxy decides and logs every connection: %w", errdefs.ErrInvalidArgument)
	}
	denyAll := false
	var deny []netip.Prefix
	for _, d := range n.DenyOut {
		if allTraffic(d) {
			denyAll = true
			continue
		}
		pfx, err := netip.ParsePrefix(d)
		if err != nil {
			a, err := netip.ParseAddr(d)
			if err != nil {
				return policy.Policy{}, false, fmt.Errorf("network.denyOut: %q is not a CIDR or IP address: %w", d, errdefs.ErrInvalidArgument)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		deny = append(deny, pfx.Masked())
	}
	switch {
	case n.AllowInternetAccess != nil:
		internet = *n.AllowInternetAccess
	case len(deny) > 0:
		// Denying some destinations says the rest is open.
		internet = true
	case len(n.AllowOut) > 0:
		internet = false
	default:
		internet = emptyMeansOpen
	}
	if noInternet {
		internet = false
	}
	if !internet || denyAll {
		if len(n.AllowOut) == 0 {
			p.Mode = policy.ModeNone
		} else {
			p.Mode = policy.ModeAllow
			for _, a := range n.AllowOut {
				p.Allow = append(p.Allow, hostCIDR(a))
			}
		}
		// The base stance is what getInfo reports as allowInternetAccess.
		internet = internet && !denyAll
	} else {
		p.Mode = policy.ModeOpen
		for _, d := range deny {
			p.Deny = append(p.Deny, d.String())
		}
		for _, a := range n.AllowOut {
			pa, err := netip.ParsePrefix(hostCIDR(a))
			if err != nil {
				continue // a domain: open mode lets it out already
			}
			for _, d := range deny {
				if d.Overlaps(pa) {
					return policy.Policy{}, false, fmt.Errorf("network.allowOut: %q lies inside denyOut %q: Berth's deny rules win over allow rules, so it would stay denied; narrow the denyOut entry: %w", a, d, errdefs.ErrInvalidArgument)
				}
			}
		}
	}
	if err := p.Validate(); err != nil {
		return policy.Policy{}, false, fmt.Errorf("network: %w", err)
	}
	return p.Normalize(), internet, nil
}

// hostCIDR turns a bare IP address into its one-address prefix; CIDRs and
// domains pass as they are.
func hostCIDR(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()).String()
	}
	return s
}

// Update turns the body of PUT /sandboxes/{id}/network into the sandbox's
// new settings given its stored ones (StoreJSON's): the ingress options
// are fixed at create, so the update may not name them and keeps the
// stored allowPublicTraffic. It returns the egress policy, as
// ApplyNetwork, and the settings to store.
func (n NetworkConfig) Update(stored string, noInternet bool) (policy.Policy, string, error) {
	if n.AllowPublicTraffic != nil || n.MaskRequestHost != nil || Present(n.HTTPSPorts) {
		return policy.Policy{}, "", fmt.Errorf("allowPublicTraffic, maskRequestHost and httpsPorts are set at create and cannot be updated: %w", errdefs.ErrInvalidArgument)
	}
	p, internet, err := ApplyNetwork(n, true, noInternet)
	if err != nil {
		return p, "", err
	}
	var prev NetworkConfig
	// Settings never stored leave prev at its zero value.
	_ = json.Unmarshal([]byte(stored), &prev)
	n.AllowPublicTraffic = prev.AllowPublicTraffic
	return p, n.StoreJSON(internet), nil
}

// ApplyNetwork checks a network config (the ingress options Berth's
// preview routing honours) and returns its egress policy and whether its
// base stance is the open internet (see EgressPolicy).
func ApplyNetwork(n NetworkConfig, emptyMeansOpen, noInternet bool) (policy.Policy, bool, error) {
	if n.MaskRequestHost != nil {
		return policy.Policy{}, false, fmt.Errorf("network.maskRequestHost is not supported by Berth yet: %w", errdefs.ErrInvalidArgument)
	}
	if Present(n.HTTPSPorts) && string(n.HTTPSPorts) != "[]" {
		return policy.Policy{}, false, fmt.Errorf("network.httpsPorts is not supported by Berth: preview traffic reaches sandboxes as plain HTTP: %w", errdefs.ErrInvalidArgument)
	}
	return EgressPolicy(n, emptyMeansOpen, noInternet)
}
