package e2bwire

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestCursorRoundTrip(t *testing.T) {
	c := Cursor{At: time.Now().UnixNano(), ID: "abc123"}
	got, err := ParseCursor(c.String())
	if err != nil || got != c {
		t.Errorf("ParseCursor(%q) = %+v, %v, want %+v", c.String(), got, err, c)
	}
	for _, bad := range []string{"", "!!", "YWJj", "MTpBQkM"} {
		if _, err := ParseCursor(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseCursor(%q) err = %v, want invalid argument", bad, err)
		}
	}
}

func TestApplyNetwork(t *testing.T) {
	yes, no := true, false
	mask := "x"
	tests := []struct {
		name string
		in   NetworkConfig
		ok   bool
	}{
		{"empty", NetworkConfig{}, true},
		{"no internet", NetworkConfig{AllowInternetAccess: &no}, true},
		{"deny list", NetworkConfig{DenyOut: []string{"0.0.0.0/0", "10.1.2.3"}}, true},
		{"private traffic", NetworkConfig{AllowPublicTraffic: &no}, true},
		{"internet", NetworkConfig{AllowInternetAccess: &yes}, true},
		{"allow list", NetworkConfig{AllowOut: []string{"198.51.100.1"}}, true},
		{"deny a domain", NetworkConfig{DenyOut: []string{"example.com"}}, false},
		{"rules", NetworkConfig{Rules: json.RawMessage(`{"a.com":[{}]}`)}, false},
		{"proxy", NetworkConfig{EgressProxy: json.RawMessage(`{"address":"p:1"}`)}, false},
		{"mask host", NetworkConfig{MaskRequestHost: &mask}, false},
	}
	for _, tt := range tests {
		_, _, err := ApplyNetwork(tt.in, false, false)
		if (err == nil) != tt.ok {
			t.Errorf("ApplyNetwork(%s) = %v, want ok %v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ApplyNetwork(%s) = %v, want invalid argument", tt.name, err)
		}
	}
}
