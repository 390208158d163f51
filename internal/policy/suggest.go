package policy

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-sandbox/berth/internal/audit"
)

// Suggest returns the smallest allow policy that would have let through
// every denied attempt in recs: each denied name (DNS question, SNI or
// Host) as an exact domain rule, and each denied nameless connection as
// its address and port. Attempts no policy can allow (forbidden
// addresses, malformed traffic, UDP, ICMP, DNS to other resolvers) are
// left out.
func Suggest(recs []audit.Record) Policy {
	names := map[string]bool{}
	addrs := map[string]bool{}
	for _, r := range recs {
		if !r.Denied() || r.Rule == "proxy" || strings.Contains(r.Reason, "non-public") ||
			strings.Contains(r.Reason, "host's own") || strings.Contains(r.Reason, "metadata") {
			continue
		}
		// The firewall's refusals of UDP, ICMP and foreign DNS: no policy
		// lets those out.
		if r.Rule == "firewall" && (r.Proto != "tcp" || r.Port == 53 || r.Port == 853) {
			continue
		}
		if r.Name != "" {
			if ValidDomain(r.Name) {
				names[strings.ToLower(r.Name)] = true
			}
			continue
		}
		ip, err := netip.ParseAddr(r.IP)
		if err != nil || r.Port == 0 {
			continue
		}
		addrs[netip.PrefixFrom(ip, ip.BitLen()).String()+":"+strconv.Itoa(int(r.Port))] = true
	}
	p := Policy{Mode: ModeAllow}
	for n := range names {
		p.Allow = append(p.Allow, n)
	}
	slices.Sort(p.Allow)
	var as []string
	for a := range addrs {
		as = append(as, a)
	}
	slices.Sort(as)
	p.Allow = append(p.Allow, as...)
	return p
}
