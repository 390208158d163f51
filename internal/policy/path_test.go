package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"/", "/"},
		{"/public/x", "/public/x"},
		{"/public/../secret/x", "/secret/x"},
		{"/public/./x", "/public/x"},
		{"/public//../secret", "/secret"}, // slashes merged before dots, as nginx does
		{"/a/b/..", "/a/"},
		{"/a/b/.", "/a/b/"},
		{"/..", "/"},
		{"/../../etc", "/etc"},
		{"/a//b///c/", "/a/b/c/"},
		{"/%7euser/%41b", "/~user/Ab"},
		{"/x%3fy", "/x%3Fy"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/a;v=1/b", "/a;v=1/b"},
		{"/...", "/..."},
		{"/a/..b", "/a/..b"},
	}
	for _, tt := range tests {
		got, err := NormalizePath(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("NormalizePath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestNormalizePathRefuses(t *testing.T) {
	for _, in := range []string{
		"/public/%2e%2e/secret/x", "/public/%2E%2E%2Fsecret", "/public/%2e./secret", "/public%2fsecret",
		"/public/..%5csecret", "/public\\..\\secret", "/a%00b", "/a\x00b", "/a%0a", "/a b", "/%", "/%zz", "/%2",
		"/public/..;/secret", "/public/.;x/secret", "/a%25/b", "relative", "", "/a#frag", "/" + strings.Repeat("a", 9000),
	} {
		if got, err := NormalizePath(in); !errors.Is(err, ErrAmbiguousPath) {
			t.Errorf("NormalizePath(%q) = %q, %v; want ErrAmbiguousPath", in, got, err)
		}
	}
}

// FuzzNormalizePath: the result is canonical (normalizing it again
// changes nothing), starts with /, has no dot segments or empty inner
// segments, and a path rule prefix can only match what the server sees.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "/public/../secret", "/a/%2e%2e/b", "/a//b/./c/..", "/%7e", "/a;b/..;/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := NormalizePath(in)
		if err != nil {
			return
		}
		if !strings.HasPrefix(out, "/") {
			t.Fatalf("NormalizePath(%q) = %q: no leading /", in, out)
		}
		again, err := NormalizePath(out)
		if err != nil || again != out {
			t.Fatalf("NormalizePath(NormalizePath(%q)) = %q, %v; want %q", in, again, err, out)
		}
		segs := strings.Split(out[1:], "/")
		for i, s := range segs {
			if s == "." || s == ".." || (s == "" && i != len(segs)-1) {
				t.Fatalf("NormalizePath(%q) = %q keeps segment %q", in, out, s)
			}
		}
	})
}

func TestEmbedded(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"198.51.100.7", []string{"198.51.100.7"}},
		{"::ffff:198.51.100.7", []string{"198.51.100.7"}},
		{"64:ff9b::c633:6407", []string{"64:ff9b::c633:6407", "198.51.100.7"}},
		{"64:ff9b:1:c633:64:700::", []string{"64:ff9b:1:c633:64:700::", "198.51.100.7", "0.0.0.0"}},
		{"2002:c633:6407::1", []string{"2002:c633:6407::1", "198.51.100.7"}},
		{"2001:0:4136:e378:8000:63bf:39cc:9bf8", []string{"2001:0:4136:e378:8000:63bf:39cc:9bf8", "65.54.227.120", "198.51.100.7"}},
		{"::c633:6407", []string{"::c633:6407", "198.51.100.7"}},
		{"2001:db8::1", []string{"2001:db8::1"}},
	}
	for _, tt := range tests {
		got := Embedded(netip.MustParseAddr(tt.in))
		var gs []string
		for _, a := range got {
			gs = append(gs, a.String())
		}
		if strings.Join(gs, " ") != strings.Join(tt.want, " ") {
			t.Errorf("Embedded(%s) = %v, want %v", tt.in, gs, tt.want)
		}
	}
}

func TestDecideEmbeddedIPv4(t *testing.T) {
	c, err := Compile(Policy{Mode: ModeOpen, Deny: []string{"198.51.100.7/32"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"198.51.100.7", "::ffff:198.51.100.7", "64:ff9b::c633:6407", "64:ff9b:1:c633:64:700::",
		"64:ff9b:1::c633:6407", "2002:c633:6407::1", "2001:0:4136:e378:8000:63bf:39cc:9bf8", "::c633:6407"} {
		ip := netip.MustParseAddr(s)
		if d := c.DecideAddr(ip, 443); d.Allow {
			t.Errorf("DecideAddr(%s) = %+v, want the deny rule", s, d)
		}
		if _, denied := c.DeniedAddr(ip, 0); !denied {
			t.Errorf("DeniedAddr(%s, 0) = not denied", s)
		}
	}
	if d := c.DecideAddr(netip.MustParseAddr("64:ff9b::c633:6408"), 443); !d.Allow {
		t.Errorf("DecideAddr(NAT64 of another address) = %+v, want allow", d)
	}
	a, _ := Compile(Policy{Mode: ModeAllow, Allow: []string{"198.51.100.0/24:7"}})
	if d := a.DecideAddr(netip.MustParseAddr("64:ff9b::c633:6401"), 7); !d.Allow {
		t.Errorf("allow rule does not cover the NAT64 form: %+v", d)
	}
	g := &Guard{HostAddrs: func() []netip.Addr { return nil }}
	for _, s := range []string{"64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1:7f00:0:100::", "::ffff:127.0.0.1"} {
		if bad, _ := g.Forbidden(netip.MustParseAddr(s)); !bad {
			t.Errorf("Forbidden(%s) = false", s)
		}
	}
}

func TestDecideRequest(t *testing.T) {
	p := Policy{Mode: ModeAllow, Allow: []string{"plain.test"}, Deny: []string{"bad.api.test"},
		HTTP: []HTTPRule{{Host: "*.api.test", Methods: []string{"GET"}, Path: "/public/"}}}
	c, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host, method, path string
		want               bool
	}{
		{"x.api.test", "GET", "/public/a", true},
		{"x.api.test", "GET", "/secret/x", false},
		{"x.api.test", "POST", "/public/a", false},
		{"bad.api.test", "GET", "/public/a", false}, // deny wins over HTTP rules
		{"plain.test", "POST", "/anything", true},
		{"other.test", "GET", "/", false},
	}
	for _, tt := range tests {
		if d := c.DecideRequest(tt.host, tt.method, tt.path); d.Allow != tt.want {
			t.Errorf("DecideRequest(%s %s %s) = %+v, want allow=%v", tt.host, tt.method, tt.path, d, tt.want)
		}
	}
	p.Mode = ModeNone
	n, _ := Compile(p)
	if d := n.DecideRequest("x.api.test", "GET", "/public/a"); d.Allow {
		t.Errorf("mode none with HTTP rules allowed a request: %+v", d)
	}
}
