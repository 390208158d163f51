package e2bcompat

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/policy"
)

// networkConfig is E2B's network settings: the network object of a create
// (with the top-level allow_internet_access folded in) or the body of PUT
// /sandboxes/{id}/network.
type networkConfig struct {
	AllowInternetAccess *bool           `json:"allow_internet_access,omitempty"`
	AllowOut            []string        `json:"allowOut,omitempty"`
	DenyOut             []string        `json:"denyOut,omitempty"`
	Rules               json.RawMessage `json:"rules,omitempty"`
	EgressProxy         json.RawMessage `json:"egressProxy,omitempty"`
	AllowPublicTraffic  *bool           `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost     *string         `json:"maskRequestHost,omitempty"`
	HTTPSPorts          json.RawMessage `json:"httpsPorts,omitempty"`
}

// storeJSON is the config as kept for getInfo (without the create-only
// allow_internet_access flag, which getInfo reports on its own).
func (n networkConfig) storeJSON() string {
	n.AllowInternetAccess = nil
	b, _ := json.Marshal(n) // plain data always marshals
	return string(b)
}

// egressPolicy maps E2B's network settings onto Berth's egress policy:
//
//   - allow_internet_access: true → mode open (the public internet; Berth
//     still never lets a sandbox reach private, loopback, link-local or
//     metadata addresses), narrowed by denyOut;
//   - allowOut entries (CIDR, IP or domain) → mode allow with those rules;
//     a denyOut of 0.0.0.0/0 next to them is E2B's way of saying "only
//     these", which allow mode already means;
//   - otherwise → mode none. Berth's default is no egress, where E2B's
//     own default is internet access: a sandbox that needs the internet
//     says so (allowInternetAccess: true), and the operator's logs show it.
//
// Rules and egress proxies of E2B's own (network.rules, egressProxy) have
// no Berth equivalent yet and are refused by name.
func egressPolicy(n networkConfig) (policy.Policy, error) {
	if present(n.Rules) && string(n.Rules) != "{}" {
		return policy.Policy{}, fmt.Errorf("network.rules is not supported by Berth; use allowOut/denyOut: %w", errdefs.ErrInvalidArgument)
	}
	if present(n.EgressProxy) {
		return policy.Policy{}, fmt.Errorf("network.egressProxy is not supported by Berth: its own egress proxy decides and logs every connection: %w", errdefs.ErrInvalidArgument)
	}
	everything := func(d string) bool { return d == "0.0.0.0/0" || d == "::/0" }
	var p policy.Policy
	denyAll := false
	for _, d := range n.DenyOut {
		if everything(d) {
			denyAll = true
			continue
		}
		if _, err := netip.ParsePrefix(d); err != nil {
			if _, err := netip.ParseAddr(d); err != nil {
				return policy.Policy{}, fmt.Errorf("network.denyOut: %q is not a CIDR or IP address: %w", d, errdefs.ErrInvalidArgument)
			}
		}
		p.Deny = append(p.Deny, hostCIDR(d))
	}
	switch {
	case len(n.AllowOut) > 0:
		p.Mode = policy.ModeAllow
		for _, a := range n.AllowOut {
			p.Allow = append(p.Allow, hostCIDR(a))
		}
	case n.AllowInternetAccess != nil && *n.AllowInternetAccess && !denyAll:
		p.Mode = policy.ModeOpen
	default:
		p.Mode, p.Deny = policy.ModeNone, nil
	}
	if err := p.Validate(); err != nil {
		return policy.Policy{}, fmt.Errorf("network: %w", err)
	}
	return p.Normalize(), nil
}

// hostCIDR turns a bare IP address into its one-address prefix; CIDRs and
// domains pass as they are.
func hostCIDR(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()).String()
	}
	return s
}

// applyNetwork checks a network config (the ingress options Berth's
// preview routing honours) and returns its egress policy.
func applyNetwork(n networkConfig) (policy.Policy, error) {
	if n.MaskRequestHost != nil {
		return policy.Policy{}, fmt.Errorf("network.maskRequestHost is not supported by Berth yet: %w", errdefs.ErrInvalidArgument)
	}
	if present(n.HTTPSPorts) && string(n.HTTPSPorts) != "[]" {
		return policy.Policy{}, fmt.Errorf("network.httpsPorts is not supported by Berth: preview traffic reaches sandboxes as plain HTTP: %w", errdefs.ErrInvalidArgument)
	}
	return egressPolicy(n)
}
