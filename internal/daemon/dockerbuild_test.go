package daemon

import (
	"slices"
	"testing"

	"github.com/berth-sandbox/berth/internal/policy"
)

func TestBuildNetwork(t *testing.T) {
	if p := buildNetwork(Config{}); p.Mode != policy.ModeNone {
		t.Errorf("no registries configured: %+v, want mode none", p)
	}
	p := buildNetwork(Config{
		RegistryMirrors:    map[string]string{"docker.io": "http://mirror.example:5000", "ghcr.io": "https://mirror.example"},
		InsecureRegistries: []string{"reg.example:5000", "127.0.0.1:5000", "[::1]:5000", "localhost:5000"},
	})
	slices.Sort(p.Allow)
	if p.Mode != policy.ModeAllow || !slices.Equal(p.Allow, []string{"mirror.example", "reg.example"}) {
		t.Errorf("default build network = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Errorf("default build network invalid: %v", err)
	}
	// Loopback registries are the daemon's own to pull from.
	if p := buildNetwork(Config{RegistryMirrors: map[string]string{"docker.io": "http://127.0.0.1:5000"}}); p.Mode != policy.ModeNone {
		t.Errorf("loopback mirror only: %+v, want mode none", p)
	}
	own := &policy.Policy{Mode: policy.ModeOpen}
	if p := buildNetwork(Config{BuildNetwork: own}); p.Mode != policy.ModeOpen {
		t.Errorf("configured build_network ignored: %+v", p)
	}
}
