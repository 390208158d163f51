package hostnet

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestAllocateFrom(t *testing.T) {
	pool := netip.MustParsePrefix("10.0.0.0/28") // four /30 slots
	p := netip.MustParsePrefix
	tests := []struct {
		name string
		used []netip.Prefix
		want []netip.Prefix // any of these
		err  error
	}{
		{"empty", nil, []netip.Prefix{p("10.0.0.0/30"), p("10.0.0.4/30"), p("10.0.0.8/30"), p("10.0.0.12/30")}, nil},
		{"three taken", []netip.Prefix{p("10.0.0.0/30"), p("10.0.0.4/30"), p("10.0.0.12/30")}, []netip.Prefix{p("10.0.0.8/30")}, nil},
		{"host address inside", []netip.Prefix{p("10.0.0.0/29"), p("10.0.0.13/32")}, []netip.Prefix{p("10.0.0.8/30")}, nil},
		{"covering route", []netip.Prefix{p("10.0.0.0/8")}, nil, errdefs.ErrResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := allocateFrom(pool, "some-id", tt.used)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("allocateFrom = %v, %v; want %v", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ok := false
			for _, w := range tt.want {
				ok = ok || got == w
			}
			if !ok {
				t.Errorf("allocateFrom = %v, want one of %v", got, tt.want)
			}
		})
	}
}

func TestLinkNames(t *testing.T) {
	for _, inst := range []string{"a", "abcdefgh"} {
		nm := newNaming(inst)
		seen := map[string]bool{}
		for attempt := range maxNameAttempts {
			name := nm.link("sandbox-id-with-a-long-name-0123456789", attempt)
			if len(name) != maxIfaceLen {
				t.Errorf("link(%q, %d) = %q, want %d chars", inst, attempt, name, maxIfaceLen)
			}
			if seen[name] {
				t.Errorf("link(%q, %d) = %q repeats an earlier attempt", inst, attempt, name)
			}
			seen[name] = true
		}
	}
	// No instance's prefix is a prefix of another's.
	if a, b := newNaming("a").linkPrefix, newNaming("ab").linkPrefix; len(a) <= len(b) && b[:len(a)] == a {
		t.Errorf("prefix %q is a prefix of %q", a, b)
	}
}
