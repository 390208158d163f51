package e2e

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// Registry credentials, end to end: two registries on loopback with
// htpasswd auth (Debian's docker-registry); one reached with credentials
// given by `berth registry login`, the other with the daemon user's
// ~/.docker/config.json (DOCKER_CONFIG).
func TestRegistryAuth(t *testing.T) {
	reg := harness.StartRegistryAuth(t, "alice", "s3cret-A")
	other := harness.StartRegistryAuth(t, "bob", "s3cret-B")
	oci := busyboxImage(t)
	oci.Push("bb", reg, "team/private:1")
	oci.Push("bb", other, "team/private:1")

	// Docker's own file, as `docker login` writes it, for the other one.
	dockerDir := t.TempDir()
	cfg := `{"auths":{"` + other.Addr + `":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("bob:s3cret-B")) + `"}}}`
	if err := os.WriteFile(filepath.Join(dockerDir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dockerDir)
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ref := reg.Addr + "/team/private:1"

	// No credentials: unauthenticated, naming the registry and the way in.
	_, err := d.Client.CreateTemplate(ctx, "priv", ref, nil)
	if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), reg.Addr) || !strings.Contains(err.Error(), "berth registry login") {
		t.Errorf("pull without credentials: %v, want unauthenticated naming %s", err, reg.Addr)
	}
	_, errOut, code := d.CLI(t, nil, "template", "build", "priv", "--image", ref)
	if code == 0 || !strings.Contains(errOut, reg.Addr) {
		t.Errorf("CLI pull without credentials = (%q, %d)", errOut, code)
	}

	// A wrong password is refused at login, and nothing is stored.
	_, errOut, code = d.CLI(t, strings.NewReader("wrong\n"), "registry", "login", reg.Addr, "-u", "alice", "--password-stdin")
	if code == 0 || !strings.Contains(errOut, "refused the credentials") || !strings.Contains(errOut, reg.Addr) {
		t.Errorf("login with a wrong password = (%q, %d)", errOut, code)
	}
	if _, err := os.Stat(filepath.Join(d.DataDir, "registry-auth.json")); err == nil {
		t.Error("a refused login was stored")
	}
	// A password on the command line is not taken.
	if _, errOut, code = d.CLI(t, nil, "registry", "login", reg.Addr, "-u", "alice"); code == 0 || !strings.Contains(errOut, "--password-stdin") {
		t.Errorf("login without --password-stdin = (%q, %d)", errOut, code)
	}

	out, errOut, code := d.CLI(t, strings.NewReader("s3cret-A\n"), "registry", "login", reg.Addr, "-u", "alice", "--password-stdin")
	if code != 0 || !strings.Contains(out, "logged in to "+reg.Addr+" as alice") {
		t.Fatalf("login = (%q, %q, %d)", out, errOut, code)
	}
	fi, err := os.Stat(filepath.Join(d.DataDir, "registry-auth.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stored credentials: %v, mode %v, want 0600", err, fi.Mode())
	}
	if out, _, _ = d.CLI(t, nil, "registry", "ls"); !strings.Contains(out, reg.Addr) || !strings.Contains(out, "alice") || strings.Contains(out, "s3cret") {
		t.Errorf("registry ls:\n%s", out)
	}

	// With the login the pull works, and the sandbox runs on it.
	if _, err := d.Client.CreateTemplate(ctx, "priv", ref, nil); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
	sb := d.Create(t, client.CreateRequest{Template: "priv"})
	if got := MustRun(t, sb, "cat /etc/arch"); got != "amd64\n" {
		t.Errorf("sandbox from the private image: %q", got)
	}
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// ~/.docker/config.json's credentials reach the other registry.
	if _, err := d.Client.CreateTemplate(ctx, "other", other.Addr+"/team/private:1", nil); err != nil {
		t.Errorf("pull with ~/.docker/config.json credentials: %v", err)
	}

	// After logout the rebuild is unauthenticated again.
	if out, errOut, code = d.CLI(t, nil, "registry", "logout", reg.Addr); code != 0 {
		t.Fatalf("logout = (%q, %q, %d)", out, errOut, code)
	}
	if _, err := d.Client.BuildTemplate(ctx, "priv", nil); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("rebuild after logout: %v, want unauthenticated", err)
	}
	if err := d.Client.LogoutRegistry(ctx, reg.Addr); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second logout: %v, want not_found", err)
	}
	if _, err := d.Client.LoginRegistry(ctx, "bad host/x", "alice", "x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("login to a bad host: %v, want invalid_argument", err)
	}
}
