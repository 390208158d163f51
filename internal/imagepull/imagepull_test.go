package imagepull

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestCandidates(t *testing.T) {
	p, err := New(Config{Mirrors: map[string]string{"docker.io": "http://127.0.0.1:5000"}, Insecure: []string{"reg.internal:5000"}})
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string][]string{
		"debian:12":                      {"127.0.0.1:5000/library/debian:12", "index.docker.io/library/debian:12"},
		"docker.io/team/x@sha256:" + h64: {"127.0.0.1:5000/team/x@sha256:" + h64, "index.docker.io/team/x@sha256:" + h64},
		"ghcr.io/o/r:1":                  {"ghcr.io/o/r:1"},
	} {
		r, err := ParseImageRef(ref)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.cfg.candidates(r)
		if err != nil || len(got) != len(want) {
			t.Fatalf("candidates(%s) = %v, %v", ref, got, err)
		}
		for i := range got {
			if got[i].Name() != want[i] {
				t.Errorf("candidates(%s)[%d] = %s, want %s", ref, i, got[i].Name(), want[i])
			}
		}
		if len(got) == 2 && got[0].Context().Scheme() != "http" {
			t.Errorf("mirror of %s over %s, want http", ref, got[0].Context().Scheme())
		}
	}
	r, _ := ParseImageRef("reg.internal:5000/a:1")
	got, _ := p.cfg.candidates(r)
	if got[0].Context().Scheme() != "http" {
		t.Errorf("insecure registry over %s", got[0].Context().Scheme())
	}
}

const h64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestConfigAndRefErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Mirrors: map[string]string{"docker.io": "ftp://x"}},
		{Mirrors: map[string]string{"docker.io": "http://x/path"}},
		{Mirrors: map[string]string{"a b": "http://x"}},
		{Insecure: []string{"x/y"}},
	} {
		if _, err := New(cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v, want invalid argument", cfg, err)
		}
	}
	for _, ref := range []string{"", " debian", "UPPER/x", "a::b", "x@sha256:12"} {
		if _, err := ParseImageRef(ref); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseImageRef(%q) = %v", ref, err)
		}
	}
}

// A registry that is not listening: unavailable, naming it.
func TestResolveUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, _ := New(Config{})
	_, err = p.Resolve(context.Background(), addr+"/x/y:1")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Resolve = %v, want unavailable", err)
	}
}
