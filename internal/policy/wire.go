package policy

import "github.com/berth-sandbox/berth/api/types"

// FromWire and ToWire carry a policy across the API edge (the daemon's
// and the Kubernetes gateway's); the wire shape mirrors Policy field for
// field: the HTTPRule conversions break the build if the two drift, and
// internal/api's TestWireMirrorsInternal checks the JSON names.
func FromWire(in types.NetworkPolicy) Policy {
	p := Policy{Mode: Mode(in.Mode), Allow: in.Allow, Deny: in.Deny}
	if in.HTTP != nil {
		p.HTTP = make([]HTTPRule, len(in.HTTP))
		for i, r := range in.HTTP {
			p.HTTP[i] = HTTPRule(r)
		}
	}
	return p
}

// ToWire is FromWire's inverse.
func ToWire(p Policy) types.NetworkPolicy {
	out := types.NetworkPolicy{Mode: string(p.Mode), Allow: p.Allow, Deny: p.Deny}
	if p.HTTP != nil {
		out.HTTP = make([]types.HTTPRule, len(p.HTTP))
		for i, r := range p.HTTP {
			out.HTTP[i] = types.HTTPRule(r)
		}
	}
	return out
}
