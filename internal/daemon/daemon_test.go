package daemon

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"go.yaml.in/yaml/v3"
)

func TestCheckTraversable(t *testing.T) {
	root := t.TempDir()
	private := filepath.Join(root, "private")
	open := filepath.Join(root, "open")
	for dir, mode := range map[string]os.FileMode{private: 0o700, open: 0o711} {
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	// t.TempDir's own parents may be private on some hosts; make the
	// chain up to root searchable for this test's sake.
	if err := os.Chmod(root, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(root), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := checkTraversable(filepath.Join(open, "data")); err != nil {
		t.Errorf("checkTraversable(under 0711) = %v, want nil", err)
	}
	err := checkTraversable(filepath.Join(private, "data"))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("checkTraversable(under 0700) = %v, want ErrFailedPrecondition", err)
	}
	for _, want := range []string{private, "chmod o+x"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// warm_pool keeps its plain form and warm_pool_sudo names the
// sudo-capable pools, both decoded as serve decodes its --config; a bad
// count or template name is refused with the key that holds it.
func TestWarmPoolConfig(t *testing.T) {
	decode := func(t *testing.T, text string) Config {
		t.Helper()
		var c Config
		dec := yaml.NewDecoder(strings.NewReader(text))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("decode %q: %v", text, err)
		}
		return c
	}
	c := decode(t, "warm_pool: {base: 4, minimal: 0}\nwarm_pool_sudo: {base: 2}\n")
	got, err := c.warmPools()
	if err != nil {
		t.Fatal(err)
	}
	want := map[sandbox.WarmKey]int{{Template: "base"}: 4, {Template: "base", AllowSudo: true}: 2}
	if !maps.Equal(got, want) {
		t.Errorf("warmPools() = %v, want %v", got, want)
	}
	if got, err := decode(t, "listen: 127.0.0.1:0\n").warmPools(); err != nil || len(got) != 0 {
		t.Errorf("no pools: %v, %v", got, err)
	}
	for _, tc := range []struct{ text, want string }{
		{"warm_pool_sudo: {base: -1}\n", "warm_pool_sudo: base: -1 is out of range"},
		{"warm_pool_sudo: {base: 65}\n", "warm_pool_sudo: base: 65 is out of range"},
		{"warm_pool: {base: 100}\n", "warm_pool: base: 100 is out of range"},
		{"warm_pool_sudo: {Bad/Name: 1}\n", `warm_pool_sudo: template name "Bad/Name"`},
	} {
		_, err := decode(t, tc.text).warmPools()
		if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want ErrInvalidArgument saying %q", tc.text, err, tc.want)
		}
	}
}
