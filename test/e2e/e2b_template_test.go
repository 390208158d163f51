package e2e

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestE2BTemplates runs test/e2b/template.test.mjs: the npm e2b SDK's
// Template() builder against a live daemon, building from E2B's base image
// (Berth's base template), from an image served under a Docker Hub name by
// a loopback registry mirror, and from another template, then creating
// sandboxes from what it built. The Node file skips itself in the plain
// SDK run (TestE2BSDK), which has no registry or admin key.
func TestE2BTemplates(t *testing.T) {
	node, dir := e2bNode(t, "the E2B template tests")
	reg := harness.StartRegistry(t)
	busyboxImage(t).Push("bb", reg, "library/berthtest-busybox:1")
	cfg := filepath.Join(t.TempDir(), "berth.yaml")
	if err := os.WriteFile(cfg, []byte("registry_mirrors:\n  docker.io: http://"+reg.Addr+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t, "--config", cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	if _, err := d.Client.BuildTemplate(ctx, "base", io.Discard); err != nil {
		t.Fatalf("build base: %v", err)
	}
	user := createKey(t, d, "e2b-tpl-user")
	out, errOut, code := d.CLI(t, nil, "apikey", "create", "--name", "e2b-tpl-admin", "--admin")
	admin := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(admin, "e2b_") {
		t.Fatalf("apikey create --admin = %q, %q, %d", out, errOut, code)
	}
	args := []string{"--test", "--test-reporter=spec"}
	if p := os.Getenv("BERTH_E2B_TEST_PATTERN"); p != "" {
		args = append(args, "--test-name-pattern="+p)
	}
	cmd := exec.CommandContext(ctx, node, append(args, "template.test.mjs")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+d.URL,
		"E2B_SANDBOX_URL="+d.URL,
		"E2B_API_KEY="+user,
		"E2B_ADMIN_API_KEY="+admin,
		"E2B_DOMAIN=berth.localhost",
		"BERTH_TEST_IMAGE=berthtest-busybox:1",
		"NO_COLOR=1",
	)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test template.test.mjs failed: %v\n%s\n--- daemon log (tail) ---\n%s", err, b, tail(d.Logs(), 80))
	}
	t.Logf("node --test:\n%s", b)
	// Every build has ended: the files they uploaded are gone, and their
	// build sandboxes left no records.
	if ents, err := os.ReadDir(filepath.Join(d.DataDir, "e2b-templates", "files")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	} else if len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("uploads left after every build ended: %v", names)
	}
	all, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if sb.Labels["berth.build"] != "" {
			t.Errorf("build sandbox %s left a %s record (%s)", sb.ID, sb.State, sb.Reason)
		}
	}
	AssertNoLeaks(t, d)
}
