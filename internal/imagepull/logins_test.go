package imagepull

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestLogins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry-auth.json")
	l := NewLogins(path)
	reg, _ := name.NewRegistry("127.0.0.1:5000")
	if a, err := l.Resolve(reg); err != nil || a != authn.Anonymous {
		t.Fatalf("Resolve with no file = %v, %v", a, err)
	}
	key, err := registryKey("docker.io")
	if err != nil || key != "index.docker.io" {
		t.Errorf("registryKey(docker.io) = %q, %v", key, err)
	}
	for _, bad := range []string{"", "a/b", "host with space", "user@host"} {
		if _, err := registryKey(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("registryKey(%q) = %v", bad, err)
		}
	}
	if err := l.store("127.0.0.1:5000", "alice", "pa:ss"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored file: %v %v", fi, err)
	}
	a, err := l.Resolve(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := a.Authorization()
	if err != nil || cfg.Username != "alice" || cfg.Password != "pa:ss" {
		t.Errorf("Resolve = %+v, %v", cfg, err)
	}
	ls, err := l.List()
	if err != nil || len(ls) != 1 || ls[0] != (Login{Registry: "127.0.0.1:5000", Username: "alice"}) {
		t.Errorf("List = %+v, %v", ls, err)
	}
	if err := l.Logout("127.0.0.1:5000"); err != nil {
		t.Fatal(err)
	}
	if err := l.Logout("127.0.0.1:5000"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Logout = %v", err)
	}
	if a, _ := l.Resolve(reg); a != authn.Anonymous {
		t.Errorf("Resolve after logout = %v", a)
	}
	// A damaged file is an error, not anonymous access.
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Resolve(reg); err == nil {
		t.Error("Resolve of a damaged file succeeded")
	}
}
