// Package policy is the egress policy language: what users write (YAML or
// JSON), its validation with errors naming the bad entry, normalisation,
// compilation, and the decisions the host's egress services take with it
// (by name, by address, per HTTP request). It also holds what those
// decisions rest on: the guard that keeps non-public addresses (in any
// IPv6 spelling that embeds an IPv4 one) out of reach, the canonical form
// of request paths, and Suggest, which proposes a policy from the audit
// log.
//
// It is pure: no kernel state, no root, no Linux-only code, so it builds
// everywhere and its parsers are fuzzed (see the Fuzz* targets). Host
// networking (netns, veth, nftables) is package hostnet; the proxy and
// resolver that apply these decisions are package egress.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/berth-sandbox/berth/errdefs"
)

// Mode is a policy's base stance.
type Mode string

// The policy modes.
const (
	// ModeNone lets nothing leave the sandbox, DNS included (the default).
	ModeNone Mode = "none"
	// ModeAllow lets out only what the Allow and HTTP rules name.
	ModeAllow Mode = "allow"
	// ModeOpen lets out the public internet; Deny rules still apply and
	// non-public addresses (private, loopback, link-local, CGNAT,
	// multicast, cloud metadata, the host's own) are never reachable.
	ModeOpen Mode = "open"
	// ModeLearn allows nothing but records every attempt, so Suggest can
	// propose a policy.
	ModeLearn Mode = "learn"
)

// Policy is a sandbox's egress policy, as users write it (YAML or JSON):
//
//	mode: allow                  # none | allow | open | learn
//	allow:                       # domains, *.wildcards, IPs and CIDRs
//	  - github.com               # exact name
//	  - "*.pypi.org"             # any name under pypi.org (not pypi.org)
//	  - 198.51.100.0/24:443      # CIDR (or IP), optionally one port
//	deny:                        # same syntax; deny wins over allow
//	  - evil.github.com
//	http:                        # method and path rules; these hosts are
//	  - host: api.example.com    # TLS-intercepted with the sandbox's CA
//	    methods: [GET, HEAD]     # "*" for any method
//	    path: /v1/               # path prefix
//
// Domain rules govern TCP 80 and 443 (decided on SNI or Host) and DNS;
// CIDR rules govern connections by address, on the given port or on any
// port. The zero Policy is mode none.
type Policy struct {
	Mode  Mode       `json:"mode" yaml:"mode"`
	Allow []string   `json:"allow,omitempty" yaml:"allow,omitempty"`
	Deny  []string   `json:"deny,omitempty" yaml:"deny,omitempty"`
	HTTP  []HTTPRule `json:"http,omitempty" yaml:"http,omitempty"`
}

// HTTPRule allows requests with one of Methods whose path starts with Path
// to Host (an exact name or a *.wildcard).
type HTTPRule struct {
	Host    string   `json:"host" yaml:"host"`
	Methods []string `json:"methods" yaml:"methods"`
	Path    string   `json:"path" yaml:"path"`
}

// RuleError is an invalid policy entry; Field names it ("allow[2]",
// "http[0].path", "mode").
type RuleError struct {
	Field string
	Entry string
	Err   error
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("%s %q: %v", e.Field, e.Entry, e.Err)
}

func (e *RuleError) Unwrap() error { return errdefs.ErrInvalidArgument }

func ruleErr(field, entry string, format string, args ...any) error {
	return &RuleError{Field: field, Entry: entry, Err: fmt.Errorf(format, args...)}
}

// Parse reads a policy document (YAML or JSON; unknown keys are errors)
// and validates it.
func Parse(data []byte) (Policy, error) {
	var p Policy
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return Policy{}, &RuleError{Field: "policy", Entry: truncate(string(data), 64), Err: err}
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p.Normalize(), nil
}

// ParseHTTPRule reads the CLI form "HOST METHODS PATHPREFIX", for example
// "api.example.com GET,HEAD /v1/".
func ParseHTTPRule(s string) (HTTPRule, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return HTTPRule{}, ruleErr("http", s, "want \"HOST METHODS PATHPREFIX\"")
	}
	r := HTTPRule{Host: f[0], Methods: strings.Split(f[1], ","), Path: f[2]}
	if err := r.validate("http"); err != nil {
		return HTTPRule{}, err
	}
	return r, nil
}

// String is the CLI form of the rule.
func (r HTTPRule) String() string {
	return r.Host + " " + strings.Join(r.Methods, ",") + " " + r.Path
}

// Validate checks every entry and names the first bad one.
func (p Policy) Validate() error {
	switch p.Mode {
	case "", ModeNone, ModeAllow, ModeOpen, ModeLearn:
	default:
		return ruleErr("mode", string(p.Mode), "want none, allow, open or learn")
	}
	const maxRules = 1024
	if len(p.Allow)+len(p.Deny)+len(p.HTTP) > maxRules {
		return ruleErr("policy", "", "more than %d rules", maxRules)
	}
	for i, s := range p.Allow {
		if _, err := parseRule(fmt.Sprintf("allow[%d]", i), s); err != nil {
			return err
		}
	}
	for i, s := range p.Deny {
		if _, err := parseRule(fmt.Sprintf("deny[%d]", i), s); err != nil {
			return err
		}
	}
	for i, r := range p.HTTP {
		if err := r.validate(fmt.Sprintf("http[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// Normalize returns p with the mode defaulted and names lowercased.
func (p Policy) Normalize() Policy {
	out := Policy{Mode: p.Mode}
	if out.Mode == "" {
		out.Mode = ModeNone
	}
	norm := func(in []string) []string {
		var o []string
		for _, s := range in {
			o = append(o, strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), "."))
		}
		return o
	}
	out.Allow, out.Deny = norm(p.Allow), norm(p.Deny)
	for _, r := range p.HTTP {
		m := make([]string, len(r.Methods))
		for i, x := range r.Methods {
			m[i] = strings.ToUpper(x)
		}
		out.HTTP = append(out.HTTP, HTTPRule{Host: strings.TrimSuffix(strings.ToLower(r.Host), "."), Methods: m, Path: r.Path})
	}
	return out
}

func (r HTTPRule) validate(field string) error {
	if err := validDomainPattern(r.Host); err != nil {
		return ruleErr(field+".host", r.Host, "%v", err)
	}
	if len(r.Methods) == 0 {
		return ruleErr(field+".methods", "", "at least one method (or *)")
	}
	for _, m := range r.Methods {
		if m == "*" {
			continue
		}
		if m == "" || len(m) > 16 || strings.IndexFunc(m, func(c rune) bool { return !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') }) >= 0 {
			return ruleErr(field+".methods", m, "a method is letters only, or *")
		}
	}
	if !strings.HasPrefix(r.Path, "/") || len(r.Path) > 1024 ||
		strings.IndexFunc(r.Path, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '#' || c == '?' }) >= 0 {
		return ruleErr(field+".path", r.Path, "a path prefix starts with / and has no spaces, controls, ? or #")
	}
	return nil
}

// rule is one parsed allow or deny entry: a domain pattern, or a prefix
// with an optional port.
type rule struct {
	text   string
	domain string // exact name or "*.suffix"
	prefix netip.Prefix
	port   uint16 // 0 = any
}

func parseRule(field, s string) (rule, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return rule{}, ruleErr(field, s, "empty entry")
	}
	r := rule{text: t}
	host, port := t, ""
	if strings.HasPrefix(t, "[") { // [v6 or v6/len]:port
		end := strings.Index(t, "]")
		if end < 0 {
			return rule{}, ruleErr(field, s, "unclosed [")
		}
		host = t[1:end]
		rest := t[end+1:]
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return rule{}, ruleErr(field, s, "want [ADDRESS]:PORT")
			}
			port = p
		}
		if !strings.Contains(host, ":") {
			return rule{}, ruleErr(field, s, "brackets are for IPv6 only")
		}
	} else if strings.Count(t, ":") == 1 {
		host, port, _ = strings.Cut(t, ":")
	}
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return rule{}, ruleErr(field, s, "port %q is not in 1-65535", port)
		}
		r.port = uint16(n)
	}
	if p, err := netip.ParsePrefix(host); err == nil {
		r.prefix = p.Masked()
		return r, nil
	} else if strings.Contains(host, "/") {
		return rule{}, ruleErr(field, s, "bad CIDR: %v", err)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return rule{}, ruleErr(field, s, "zoned addresses are not allowed")
		}
		r.prefix = netip.PrefixFrom(a, a.BitLen())
		return r, nil
	} else if strings.Contains(host, ":") || looksNumeric(host) {
		return rule{}, ruleErr(field, s, "bad address: %v", err)
	}
	if r.port != 0 {
		return rule{}, ruleErr(field, s, "domain rules take no port (they cover 80 and 443)")
	}
	if err := validDomainPattern(host); err != nil {
		return rule{}, ruleErr(field, s, "%v", err)
	}
	r.domain = strings.TrimSuffix(strings.ToLower(host), ".")
	return r, nil
}

// looksNumeric is true for things like "10.0.0" that are neither a valid
// address nor a sensible domain.
func looksNumeric(s string) bool {
	return s != "" && strings.Trim(s, "0123456789.") == ""
}

// validDomainPattern accepts a DNS name (letters, digits, hyphens, labels
// of 1-63, at most 253 in all), optionally led by "*." for its subdomains.
func validDomainPattern(p string) error {
	name := strings.TrimSuffix(p, ".")
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name = rest
	}
	if !ValidDomain(name) {
		return errors.New("not a domain name or *.domain")
	}
	return nil
}

// ValidDomain reports whether s is a DNS host name (case-insensitive, no
// trailing dot, no wildcard).
func ValidDomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i] | 0x20
			if !(c >= 'a' && c <= 'z' || l[i] >= '0' && l[i] <= '9' || l[i] == '-' || l[i] == '_') {
				return false
			}
		}
	}
	return !looksNumeric(s)
}

// MatchDomain reports whether name matches pattern: an exact name, or
// "*.x", which matches every name ending in ".x" (not x itself, not "ax").
// Both are compared case-insensitively, ignoring one trailing dot.
func MatchDomain(pattern, name string) bool {
	pattern = strings.ToLower(strings.TrimSuffix(pattern, "."))
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" || pattern == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return suffix != "" && len(name) > len(suffix)+1 && strings.HasSuffix(name, "."+suffix) && !strings.HasSuffix(name, ".."+suffix)
	}
	return name == pattern
}

// Compiled is a validated policy ready for decisions.
type Compiled struct {
	Policy Policy
	allow  []rule
	deny   []rule
	// ceiling, when set, bounds every decision (see Within).
	ceiling *CompiledCeiling
}

// Within returns c bounded by the operator's ceiling cc: whatever cc
// denies is denied whatever the policy says (mode open is open within
// it). A nil cc bounds nothing.
func (c *Compiled) Within(cc *CompiledCeiling) *Compiled {
	out := *c
	out.ceiling = cc
	return &out
}

// Compile validates p and prepares it for decisions.
func Compile(p Policy) (*Compiled, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.Normalize()
	c := &Compiled{Policy: p}
	for i, s := range p.Allow {
		r, _ := parseRule(fmt.Sprintf("allow[%d]", i), s)
		c.allow = append(c.allow, r)
	}
	for i, s := range p.Deny {
		r, _ := parseRule(fmt.Sprintf("deny[%d]", i), s)
		c.deny = append(c.deny, r)
	}
	return c, nil
}

// Decision is the verdict on one attempt and the rule that decided it.
type Decision struct {
	Allow bool
	Rule  string
	// Intercept: the name has HTTP rules, so TLS is terminated and each
	// request is checked against them.
	Intercept bool
}

func deny(rule string) Decision { return Decision{Rule: rule} }

// baseline decides by mode alone when no rule matched.
func (c *Compiled) baseline() Decision {
	switch c.Policy.Mode {
	case ModeOpen:
		return Decision{Allow: true, Rule: "mode open"}
	case ModeLearn:
		return deny("mode learn")
	case ModeAllow:
		return deny("no allow rule")
	}
	return deny("mode none")
}

// DecideName decides a connection (or DNS query) naming host.
func (c *Compiled) DecideName(host string) Decision {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if c.Policy.Mode == ModeNone || c.Policy.Mode == ModeLearn {
		return c.baseline()
	}
	if d, ok := c.ceiling.denyName(host); ok {
		return d
	}
	for _, r := range c.deny {
		if r.domain != "" && MatchDomain(r.domain, host) {
			return deny("deny " + r.text)
		}
	}
	for _, r := range c.Policy.HTTP {
		if MatchDomain(r.Host, host) {
			return Decision{Allow: true, Rule: "http " + r.String(), Intercept: true}
		}
	}
	for _, r := range c.allow {
		if r.domain != "" && MatchDomain(r.domain, host) {
			return Decision{Allow: true, Rule: "allow " + r.text}
		}
	}
	return c.baseline()
}

// DecideAddr decides a connection to an address (no name, or an IP
// literal as the name). An IPv6 address that embeds an IPv4 one (NAT64,
// 6to4, Teredo, mapped; see Embedded) is decided as both: any form a deny
// rule covers denies it, any form an allow rule covers allows it. It does
// not check whether ip is public; see Guard.
func (c *Compiled) DecideAddr(ip netip.Addr, port uint16) Decision {
	if c.Policy.Mode == ModeNone || c.Policy.Mode == ModeLearn {
		return c.baseline()
	}
	if d, ok := c.ceiling.denyAddr(ip, port, true); ok {
		return d
	}
	if d, ok := c.DeniedAddr(ip, port); ok {
		return d
	}
	forms := Embedded(ip)
	for _, r := range c.allow {
		if r.prefix.IsValid() && (r.port == 0 || r.port == port) && containsAny(r.prefix, forms) {
			return Decision{Allow: true, Rule: "allow " + r.text}
		}
	}
	return c.baseline()
}

// DeniedAddr reports the deny rule covering ip:port (or any IPv4 address
// ip embeds), if any; it also filters resolved addresses of allowed names.
// Port 0 asks about rules without a port only (DNS answers).
func (c *Compiled) DeniedAddr(ip netip.Addr, port uint16) (Decision, bool) {
	if d, ok := c.ceiling.denyAddr(ip, port, false); ok {
		return d, true
	}
	forms := Embedded(ip)
	for _, r := range c.deny {
		if r.prefix.IsValid() && (r.port == 0 || r.port == port) && containsAny(r.prefix, forms) {
			return deny("deny " + r.text), true
		}
	}
	return Decision{}, false
}

func containsAny(p netip.Prefix, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// DecideRequest decides one HTTP request to host, with path the request's
// NormalizePath form (the caller forwards exactly that form). A name with
// HTTP rules is decided by them; any other name as DecideName does.
func (c *Compiled) DecideRequest(host, method, path string) Decision {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if c.Policy.Mode == ModeNone || c.Policy.Mode == ModeLearn {
		return c.baseline()
	}
	if d, ok := c.ceiling.denyName(host); ok {
		return d
	}
	for _, r := range c.deny {
		if r.domain != "" && MatchDomain(r.domain, host) {
			return deny("deny " + r.text)
		}
	}
	matched := false
	for _, r := range c.Policy.HTTP {
		if !MatchDomain(r.Host, host) {
			continue
		}
		matched = true
		if (slices.Contains(r.Methods, "*") || slices.Contains(r.Methods, method)) && strings.HasPrefix(path, r.Path) {
			return Decision{Allow: true, Rule: "http " + r.String(), Intercept: true}
		}
	}
	if !matched {
		return c.DecideName(host)
	}
	return Decision{Rule: "no http rule for " + method + " " + truncate(path, 128), Intercept: true}
}

// Ruled reports whether name has HTTP rules (its connections are
// intercepted).
func (c *Compiled) Ruled(name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, r := range c.Policy.HTTP {
		if MatchDomain(r.Host, name) {
			return true
		}
	}
	return false
}

// HasDNS reports whether the sandbox gets a resolver at all.
func (c *Compiled) HasDNS() bool { return c.Policy.Mode != ModeNone }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
