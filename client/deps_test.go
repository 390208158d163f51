package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoInternalDeps keeps the SDK importable from outside the module: it
// must not link anything under internal/.
func TestNoInternalDeps(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH")
	}
	out, err := exec.CommandContext(t.Context(), gobin, "list", "-deps", "github.com/berth-sandbox/berth/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const forbidden = "github.com/berth-sandbox/berth/internal/"
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, forbidden) {
			t.Errorf("client depends on %s; the SDK must not link internal packages", pkg)
		}
	}
}
