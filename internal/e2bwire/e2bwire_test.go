package e2bwire

import (
	"encoding/json"
	"errors"
	"net/http"
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

func TestTarget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		host      string
		h         map[string]string
		id        string
		port      int
		ok, isErr bool
	}{
		{"header, envd by default", "api.example", map[string]string{"E2b-Sandbox-Id": "abc123"}, "abc123", 49983, true, false},
		{"header with a port", "api.example", map[string]string{"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "3000"}, "abc123", 3000, true, false},
		{"header with a bad port", "api.example", map[string]string{"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "70000"}, "", 0, true, true},
		{"preview host", "8080-abc123.berth.localhost:2378", nil, "abc123", 8080, true, false},
		{"neither", "api.example", nil, "", 0, false, false},
	} {
		r, _ := http.NewRequest("GET", "http://"+tc.host+"/files", nil)
		for k, v := range tc.h {
			r.Header.Set(k, v)
		}
		id, port, ok, err := Target(r, DefaultDomain, 49983)
		if ok != tc.ok || (err != nil) != tc.isErr || (err == nil && (id != tc.id || port != tc.port)) {
			t.Errorf("%s: Target = %q, %d, %v, %v", tc.name, id, port, ok, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err %v is not invalid_argument", tc.name, err)
		}
	}
}

func TestPage(t *testing.T) {
	at := func(i int) Cursor { return Cursor{At: int64(i / 2), ID: string(rune('a' + i))} }
	items := []int{0, 1, 2, 3, 4}
	var got []int
	var after *Cursor
	for range len(items) {
		page, next := Page(items, at, true, after, 2)
		got = append(got, page...)
		if next == "" {
			break
		}
		c, err := ParseCursor(next)
		if err != nil {
			t.Fatal(err)
		}
		after = &c
	}
	if len(got) != 5 || got[0] != 0 || got[4] != 4 {
		t.Errorf("pages of 2 = %v, want every item once, in order", got)
	}
}
