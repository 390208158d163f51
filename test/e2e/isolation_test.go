package e2e

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// requireIsolation skips a gvisor case on a host without runsc.
func requireIsolation(t *testing.T, iso string) {
	t.Helper()
	harness.RequireIsolation(t, iso)
}

// forEachIsolation runs fn as one subtest per isolation level.
func forEachIsolation(t *testing.T, fn func(t *testing.T, iso string)) {
	t.Helper()
	harness.ForEachIsolation(t, fn)
}

// hostKernel is the host's kernel release: a runc sandbox shares it, a
// gVisor sandbox's sentry reports its own.
func hostKernel(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestIsolationChoice: `berth create --isolation gvisor` runs the sandbox
// under gVisor (its kernel is the sentry, not the host's), inspect and ls
// say so with the runtime version, `berth version` lists both levels, a
// template's default level applies to creates that name none, and the
// request wins over it.
func TestIsolationChoice(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	out, errOut, code := d.CLI(t, nil, "version")
	if code != 0 || !strings.Contains(out, "isolation runc: runc ") || !strings.Contains(out, "isolation gvisor: runsc ") || !strings.Contains(out, "platform ") ||
		!strings.Contains(out, "snapshots keep filesystem") || !strings.Contains(out, "snapshots keep "+snapshotsAt(t, d, client.IsolationGVisor)) {
		t.Errorf("berth version = (%q, %q, %d), want both levels with runtime versions, gVisor's platform and what snapshots keep", out, errOut, code)
	}
	host := hostKernel(t)
	out, errOut, code = d.CLI(t, nil, "create", "--template", "minimal", "--isolation", "gvisor")
	if code != 0 {
		t.Fatalf("berth create --isolation gvisor: %d %s\n%s", code, errOut, d.Logs())
	}
	gv := strings.TrimSpace(out)
	if got, _, _ := d.CLI(t, nil, "exec", gv, "--", "uname", "-r"); strings.TrimSpace(got) == host || got == "" {
		t.Errorf("gvisor sandbox reports kernel %q, the host's (%q): not under gVisor", got, host)
	}
	out, _, code = d.CLI(t, nil, "inspect", gv)
	if code != 0 || !strings.Contains(out, `"isolation": "gvisor"`) || !strings.Contains(out, `"runtime_version": "runsc `) {
		t.Errorf("berth inspect gvisor sandbox = (%q, %d), want isolation gvisor and a runsc runtime_version", out, code)
	}
	rc := d.Create(t, client.CreateRequest{})
	if rc.Isolation != client.IsolationRunc || !strings.HasPrefix(rc.RuntimeVersion, "runc") {
		t.Errorf("default create: isolation %q runtime %q, want runc", rc.Isolation, rc.RuntimeVersion)
	}
	if got := strings.TrimSpace(MustRun(t, rc, "uname -r")); got != host {
		t.Errorf("runc sandbox reports kernel %q, want the host's %q", got, host)
	}
	out, _, code = d.CLI(t, nil, "ls")
	for _, want := range []string{"ISOLATION", gv, rc.ID} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("berth ls = (%q, %d), want %q", out, code, want)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, gv) && !strings.Contains(line, " gvisor ") {
			t.Errorf("berth ls line %q does not show gvisor", line)
		}
	}
	// A template's default level: the next create naming none runs under
	// it; a request naming runc still gets runc.
	if out, errOut, code = d.CLI(t, nil, "template", "isolation", "minimal", "gvisor"); code != 0 {
		t.Fatalf("berth template isolation minimal gvisor: %d %s %s", code, out, errOut)
	}
	if out, _, _ = d.CLI(t, nil, "template", "ls"); !strings.Contains(out, "gvisor") {
		t.Errorf("berth template ls = %q, want minimal's isolation gvisor", out)
	}
	byTemplate := d.Create(t, client.CreateRequest{})
	if byTemplate.Isolation != client.IsolationGVisor {
		t.Errorf("create on a gvisor template: isolation %q, want gvisor", byTemplate.Isolation)
	}
	overridden := d.Create(t, client.CreateRequest{Isolation: client.IsolationRunc})
	if overridden.Isolation != client.IsolationRunc {
		t.Errorf("create --isolation runc on a gvisor template: isolation %q, want runc", overridden.Isolation)
	}
	if _, errOut, code = d.CLI(t, nil, "template", "isolation", "minimal", "kata"); code == 0 || !strings.Contains(errOut, "isolation") {
		t.Errorf("berth template isolation minimal kata = (%q, %d), want an error naming isolation", errOut, code)
	}
	d.DestroyAll()
	AssertNoLeaks(t, d)
}

// TestIsolationRefused: an unknown level is invalid_argument naming the
// field, and a daemon without runsc refuses gvisor as failed_precondition
// naming the package, with nothing made and no fallback to runc.
func TestIsolationRefused(t *testing.T) {
	d := StartDaemon(t, "--gvisor-runtime", "/nonexistent/runsc")
	ctx := t.Context()
	_, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Isolation: "kata"})
	var we *errdefs.Error
	if !errors.As(err, &we) || !errors.Is(err, errdefs.ErrInvalidArgument) || we.Field != "isolation" {
		t.Errorf("Create(isolation kata) = %v, want invalid_argument on field isolation", err)
	}
	_, err = d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Isolation: client.IsolationGVisor})
	if !errors.As(err, &we) || !errors.Is(err, errdefs.ErrFailedPrecondition) || we.Field != "isolation" || !strings.Contains(we.Message, "apt-get install runsc") {
		t.Errorf("Create(gvisor) without runsc = %v, want failed_precondition on field isolation naming apt-get install runsc", err)
	}
	_, errOut, code := d.CLI(t, nil, "create", "--template", "minimal", "--isolation", "gvisor")
	if code == 0 || !strings.Contains(errOut, "failed_precondition") || !strings.Contains(errOut, "runsc") {
		t.Errorf("berth create --isolation gvisor without runsc = (%q, %d), want failed_precondition naming runsc", errOut, code)
	}
	out, _, _ := d.CLI(t, nil, "version")
	if !strings.Contains(out, "isolation gvisor: unavailable") || !strings.Contains(out, "apt-get install runsc") {
		t.Errorf("berth version without runsc = %q, want gvisor unavailable naming the package", out)
	}
	sbs, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil || len(sbs) != 0 {
		t.Errorf("after refused creates: %d sandboxes (%v), want none", len(sbs), err)
	}
	AssertNoLeaks(t, d)
}

// TestIsolationRestart: a gVisor sandbox outlives a daemon SIGKILL and is
// re-adopted through the gVisor runtime (its files kept, exec works), and
// after the kill nothing of it is left; a gVisor sandbox whose sentry dies
// while the daemon is down is cleaned up at restart.
func TestIsolationRestart(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor})
	MustRun(t, sb, "echo kept > /tmp/state")
	d.Kill9()
	d.Start()
	if got := MustRun(t, sb, "cat /tmp/state"); got != "kept\n" {
		t.Errorf("after SIGKILL and restart, /tmp/state = %q", got)
	}
	evs, err := d.Client.Events(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.Type != client.EventAdopted {
		t.Errorf("last event = %+v, want adopted", last)
	}
	if err := d.Client.Kill(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// TestEgressGVisor: a gVisor sandbox's traffic goes through the same
// host-side policy as a runc sandbox's (the sentry's netstack drives the
// sandbox's own veth): allowed names resolve and connect, others are
// refused, and both decisions are in the audit log. Only the test net in
// its own network namespace is reached.
func TestEgressGVisor(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	env := startEgress(t)
	ip1, ip2 := env.tn.IP.String(), env.tn.IP2.String()
	pol := &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test", ip1 + ":7"}}
	sb := env.d.Create(t, client.CreateRequest{Network: pol, Isolation: client.IsolationGVisor})
	if sb.Isolation != client.IsolationGVisor {
		t.Fatalf("isolation %q, want gvisor", sb.Isolation)
	}
	env.install(t, sb)
	expect(t, sb, "dns allowed.test", 0, ip1)
	expect(t, sb, "dns other.test", 1, "")
	expect(t, sb, "https allowed.test"+testCA, 0, "host=allowed.test method=GET path=/ tls=true")
	expect(t, sb, "https other.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "http other.test -connect "+ip1+":80", 2, "403")
	expect(t, sb, "tcp "+ip1+":7", 0, "ping")
	expect(t, sb, "tcp "+ip2+":7", 1, "")
	recs, err := env.d.Client.NetworkLog(t.Context(), sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	var allowed, denied bool
	for _, r := range recs {
		if r.Name == "allowed.test" && r.Decision == "allow" && r.BytesIn > 0 {
			allowed = true
		}
		if r.Name == "other.test" && r.Decision == "deny" {
			denied = true
		}
	}
	if !allowed || !denied {
		t.Errorf("audit log of a gvisor sandbox: allow for allowed.test %v, deny for other.test %v; records %+v", allowed, denied, recs)
	}
	if err := env.d.Client.Kill(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, env.d)
}
