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
		InsecureRegistries: []string{"reg.example:5000"},
	})
	slices.Sort(p.Allow)
	if p.Mode != policy.ModeAllow || !slices.Equal(p.Allow, []string{"mirror.example", "reg.example"}) {
		t.Errorf("default build network = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Errorf("default build network invalid: %v", err)
	}
	own := &policy.Policy{Mode: policy.ModeOpen}
	if p := buildNetwork(Config{BuildNetwork: own}); p.Mode != policy.ModeOpen {
		t.Errorf("configured build_network ignored: %+v", p)
	}
}
