package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/berth-sandbox/berth/errdefs"
)

// asciiUpper upper-cases ASCII letters only: names are compared
// case-insensitively in ASCII, and Unicode case mapping can change bytes
// that are not letters there.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// domainRules returns the domain patterns of entries (CIDR and address
// entries left out).
func domainRules(t *testing.T, field string, entries []string) []string {
	t.Helper()
	var out []string
	for _, s := range entries {
		r, err := parseRule(field, s)
		if err != nil {
			t.Fatalf("%s entry %q of a compiled policy does not parse: %v", field, s, err)
		}
		if r.domain != "" {
			out = append(out, r.domain)
		}
	}
	return out
}

func matchesAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if MatchDomain(p, name) {
			return true
		}
	}
	return false
}

// FuzzDecide checks the decisions of any policy that parses against what
// the language promises: modes none and learn let nothing out; a deny rule
// wins over every allow and HTTP rule; in mode allow a name gets out only
// through a rule that matches it, in mode open unless a deny rule matches
// it; an address is denied in every IPv4 form it embeds; decisions ignore
// ASCII case and survive normalising the policy again.
func FuzzDecide(f *testing.F) {
	f.Add("mode: allow\nallow: [github.com, \"*.pypi.org\", 198.51.100.0/24:443]\ndeny: [bad.pypi.org, 198.51.100.66]",
		"files.pypi.org", "198.51.100.66", uint16(443), "GET", "/")
	f.Add("mode: open\ndeny: [\"*.evil.com\", 198.51.100.7/32]", "x.evil.com", "64:ff9b::c633:6407", uint16(80), "POST", "/a")
	f.Add("mode: allow\nhttp: [{host: \"*.api.test\", methods: [GET], path: /public/}]\ndeny: [bad.api.test]",
		"bad.api.test", "2002:c633:6407::1", uint16(443), "GET", "/public/x")
	f.Add("mode: learn\nallow: [github.com]", "github.com", "8.8.8.8", uint16(443), "GET", "/")
	f.Add("mode: none", "a.b", "::ffff:1.2.3.4", uint16(0), "*", "/")
	f.Fuzz(func(t *testing.T, doc, name, addr string, port uint16, method, path string) {
		p, err := Parse([]byte(doc))
		if err != nil {
			return
		}
		c, err := Compile(p)
		if err != nil {
			t.Fatalf("Compile after Parse: %v", err)
		}
		again, err := Compile(c.Policy.Normalize())
		if err != nil {
			t.Fatalf("Compile of the normalised policy: %v", err)
		}
		ip, ipErr := netip.ParseAddr(addr)
		dn := c.DecideName(name)
		dr := c.DecideRequest(name, method, path)
		if d := again.DecideName(name); d != dn {
			t.Fatalf("DecideName(%q) = %+v, after normalising again %+v", name, dn, d)
		}
		if d := c.DecideName(asciiUpper(name)); d != dn {
			t.Fatalf("DecideName(%q) = %+v but DecideName(%q) = %+v", name, dn, asciiUpper(name), d)
		}
		if dn.Allow && dn.Rule == "" || dr.Allow && dr.Rule == "" {
			t.Fatalf("an allow without a rule: %+v, %+v", dn, dr)
		}

		mode := c.Policy.Mode
		if mode == ModeNone || mode == ModeLearn {
			if dn.Allow || dr.Allow || ipErr == nil && c.DecideAddr(ip, port).Allow {
				t.Fatalf("mode %s allowed %q / %s", mode, name, addr)
			}
			return
		}
		denied := matchesAny(domainRules(t, "deny", c.Policy.Deny), name)
		if denied && (dn.Allow || dr.Allow) {
			t.Fatalf("%q matches a deny rule but DecideName = %+v, DecideRequest = %+v", name, dn, dr)
		}
		var httpHosts []string
		for _, r := range c.Policy.HTTP {
			httpHosts = append(httpHosts, r.Host)
		}
		ruled := matchesAny(httpHosts, name)
		if ruled != c.Ruled(name) {
			t.Fatalf("Ruled(%q) = %v, want %v", name, c.Ruled(name), ruled)
		}
		if !denied && dn.Intercept != ruled {
			t.Fatalf("DecideName(%q) = %+v, want intercept=%v", name, dn, ruled)
		}
		switch mode {
		case ModeAllow:
			want := !denied && (ruled || matchesAny(domainRules(t, "allow", c.Policy.Allow), name))
			if dn.Allow != want {
				t.Fatalf("mode allow: DecideName(%q) = %+v, want allow=%v", name, dn, want)
			}
			if dr.Allow && !dn.Allow {
				t.Fatalf("DecideRequest(%q) allowed what DecideName refuses: %+v", name, dr)
			}
		case ModeOpen:
			if dn.Allow != !denied {
				t.Fatalf("mode open: DecideName(%q) = %+v, want allow=%v", name, dn, !denied)
			}
		}
		if ipErr != nil {
			return
		}
		da := c.DecideAddr(ip, port)
		if d := again.DecideAddr(ip, port); d != da {
			t.Fatalf("DecideAddr(%s, %d) = %+v, after normalising again %+v", ip, port, da, d)
		}
		if _, bad := c.DeniedAddr(ip, port); bad && da.Allow {
			t.Fatalf("DecideAddr(%s, %d) allowed a denied address: %+v", ip, port, da)
		}
		for _, form := range Embedded(ip)[1:] {
			if _, bad := c.DeniedAddr(form, port); bad {
				if _, also := c.DeniedAddr(ip, port); !also || c.DecideAddr(ip, port).Allow {
					t.Fatalf("%s is denied but %s, which embeds it, is not", form, ip)
				}
			}
		}
	})
}

// FuzzGuard checks that an address is forbidden whenever any IPv4 address
// it embeds is, that declaring everything public never opens loopback,
// link-local, multicast or the metadata addresses, and that without public
// test nets every special-purpose address is forbidden.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"8.8.8.8", "127.0.0.1", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b:1:7f00:0:100::",
		"2001:0:4136:e378:8000:63bf:39cc:9bf8", "2002:7f00:1::", "::7f00:1", "fd00:ec2::254", "2606:4700::1", "fe80::1%eth0"} {
		f.Add(s)
	}
	strict := &Guard{}
	open := &Guard{Public: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}
	f.Fuzz(func(t *testing.T, s string) {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return
		}
		forms := Embedded(ip)
		if forms[0] != ip.WithZone("").Unmap() {
			t.Fatalf("Embedded(%s)[0] = %s, want the address itself", ip, forms[0])
		}
		for _, g := range []*Guard{strict, open} {
			bad, why := g.Forbidden(ip)
			if bad && why == "" {
				t.Fatalf("Forbidden(%s) without a reason", ip)
			}
			for _, form := range forms[1:] {
				if fb, _ := g.Forbidden(form); fb && !bad {
					t.Fatalf("Forbidden(%s) = false, but it embeds forbidden %s", ip, form)
				}
			}
		}
		for _, form := range forms {
			for _, p := range alwaysForbidden {
				if p.Contains(form) {
					if bad, _ := open.Forbidden(ip); !bad {
						t.Fatalf("%s (form %s in %s) is reachable once everything is public", ip, form, p)
					}
				}
			}
			for _, p := range nonPublic {
				if p.Contains(form) {
					if bad, _ := strict.Forbidden(ip); !bad {
						t.Fatalf("%s (form %s in %s) is not forbidden", ip, form, p)
					}
				}
			}
		}
		if bad, _ := strict.Forbidden(ip); !bad && strings.HasPrefix(s, "127.") {
			t.Fatalf("loopback %s allowed", s)
		}
	})
}

// FuzzCeiling checks that no policy exceeds the operator's ceiling: a name
// a ceiling deny domain matches, or one no ceiling allow domain matches
// when the ceiling lists domains, is refused by name and by request; an
// address (in any IPv4 form it embeds) a ceiling deny CIDR covers is
// refused by address and filtered from resolved answers; a policy Check
// accepts names no allow entry inside a ceiling denial; and the ceiling
// never lets out what the policy alone refuses.
func FuzzCeiling(f *testing.F) {
	f.Add("allow: [\"*.test\", 198.51.100.0/24]\ndeny: [bad.test, 198.51.100.2]",
		"mode: open\nallow: [x.test]", "bad.test", "198.51.100.2", uint16(443))
	f.Add("deny: [\"*.evil.com\"]", "mode: allow\nallow: [\"*.evil.com\", 10.0.0.1]", "a.evil.com", "64:ff9b::a00:1", uint16(80))
	f.Add("allow: [github.com]", "mode: open", "gitlab.com", "192.168.1.1", uint16(22))
	f.Add("", "mode: allow\nhttp: [{host: meta.test, methods: [GET], path: /}]", "meta.test", "169.254.169.254", uint16(80))
	f.Fuzz(func(t *testing.T, ceilDoc, doc, name, addr string, port uint16) {
		var ceil Ceiling
		dec := yaml.NewDecoder(strings.NewReader(ceilDoc))
		dec.KnownFields(true)
		if err := dec.Decode(&ceil); err != nil && ceilDoc != "" {
			return
		}
		cc, err := CompileCeiling(ceil)
		if err != nil {
			return
		}
		p, err := Parse([]byte(doc))
		if err != nil {
			return
		}
		c, err := Compile(p)
		if err != nil {
			t.Fatalf("Compile after Parse: %v", err)
		}
		w := c.Within(cc)
		var denyNames, allowNames []string
		var denyPrefixes []netip.Prefix
		// The default denials are the guard's at run time (FuzzGuard).
		for _, s := range ceil.Deny {
			r, err := parseRule("deny", s)
			if err != nil {
				t.Fatalf("ceiling entry %q compiled but does not parse: %v", s, err)
			}
			if r.domain != "" {
				denyNames = append(denyNames, r.domain)
			} else if r.port == 0 {
				denyPrefixes = append(denyPrefixes, r.prefix)
			}
		}
		for _, s := range ceil.Allow {
			if r, _ := parseRule("allow", s); r.domain != "" {
				allowNames = append(allowNames, r.domain)
			}
		}
		outside := matchesAny(denyNames, name) || len(allowNames) > 0 && !matchesAny(allowNames, name)
		if outside {
			if d := w.DecideName(name); d.Allow {
				t.Fatalf("ceiling %+v: DecideName(%q) = %+v, want denied", ceil, name, d)
			}
			if d := w.DecideRequest(name, "GET", "/"); d.Allow {
				t.Fatalf("ceiling %+v: DecideRequest(%q) = %+v, want denied", ceil, name, d)
			}
		}
		if d := w.DecideName(name); d.Allow && !c.DecideName(name).Allow {
			t.Fatalf("the ceiling allowed %q, which the policy alone refuses", name)
		}
		if cerr := cc.Check(c.Policy); cerr == nil {
			for _, a := range domainRules(t, "allow", c.Policy.Allow) {
				if matchesAny(denyNames, strings.TrimPrefix(a, "*.")) && !strings.HasPrefix(a, "*.") {
					t.Fatalf("Check accepted allow %q, which ceiling denial covers", a)
				}
			}
		} else {
			var ce *CeilingError
			if !errors.As(cerr, &ce) || !errors.Is(cerr, errdefs.ErrPermissionDenied) || ce.Field == "" || ce.Ceiling == "" {
				t.Fatalf("Check = %v, want a CeilingError naming the field and the ceiling entry", cerr)
			}
		}
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return
		}
		for _, form := range Embedded(ip) {
			if !containsAny2(denyPrefixes, form) {
				continue
			}
			if d := w.DecideAddr(ip, port); d.Allow {
				t.Fatalf("DecideAddr(%s, %d) = %+v, but %s is in a ceiling denial", ip, port, d, form)
			}
			if _, bad := w.DeniedAddr(ip, port); !bad {
				t.Fatalf("DeniedAddr(%s, %d) = false, but %s is in a ceiling denial", ip, port, form)
			}
		}
		if d := w.DecideAddr(ip, port); d.Allow && !c.DecideAddr(ip, port).Allow {
			t.Fatalf("the ceiling allowed %s, which the policy alone refuses", ip)
		}
	})
}

func containsAny2(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
