package e2bcompat

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/berth-sandbox/berth/errdefs"
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

// egress is the egress a sandbox asks for, in Berth's terms.
type egress struct {
	// Allow and Deny are destinations (CIDR, IP or domain); deny wins.
	Allow, Deny []string
}

// SEAM(issue 3, egress policy): egressPolicy maps E2B's network settings
// onto Berth's egress policy. Until the Manager exposes a policy API a
// sandbox can reach nothing, so every setting that asks for egress is
// refused here with a clear message, and settings that only restrict (deny
// lists, allow_internet_access: false) are accepted as already true. When
// the policy lands: return the policy from here, pass it to Manager.Create
// (create) and to the Manager's policy update (PUT .../network), and drop
// the refusals that it makes true.
func egressPolicy(n networkConfig) (egress, error) {
	refuse := func(what string) (egress, error) {
		return egress{}, fmt.Errorf("%s: egress policy is not available in Berth yet; sandboxes have no outbound network access (omit it, or set allowInternetAccess: false): %w", what, errdefs.ErrInvalidArgument)
	}
	var e egress
	if n.AllowInternetAccess != nil && *n.AllowInternetAccess {
		return refuse("allow_internet_access: true")
	}
	if len(n.AllowOut) > 0 {
		return refuse("network.allowOut")
	}
	if present(n.Rules) && string(n.Rules) != "{}" {
		return refuse("network.rules")
	}
	if present(n.EgressProxy) {
		return refuse("network.egressProxy")
	}
	for _, d := range n.DenyOut {
		if _, err := netip.ParsePrefix(d); err != nil {
			if _, err := netip.ParseAddr(d); err != nil {
				return egress{}, fmt.Errorf("network.denyOut: %q is not a CIDR or IP address: %w", d, errdefs.ErrInvalidArgument)
			}
		}
		e.Deny = append(e.Deny, d)
	}
	return e, nil
}

// applyNetwork checks a network config: its egress through the seam above,
// and the ingress options Berth's preview routing honours.
func applyNetwork(n networkConfig) error {
	if n.MaskRequestHost != nil {
		return fmt.Errorf("network.maskRequestHost is not supported by Berth yet: %w", errdefs.ErrInvalidArgument)
	}
	if present(n.HTTPSPorts) && string(n.HTTPSPorts) != "[]" {
		return fmt.Errorf("network.httpsPorts is not supported by Berth: preview traffic reaches sandboxes as plain HTTP: %w", errdefs.ErrInvalidArgument)
	}
	_, err := egressPolicy(n)
	return err
}
