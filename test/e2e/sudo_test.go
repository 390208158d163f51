package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestAllowSudo: in base, user's sudo fails under no_new_privs (the
// default); a sandbox created with allow_sudo lets it become the
// sandbox's root, and the host sees that root as the sandbox's own host
// uid, never 0.
func TestAllowSudo(t *testing.T) {
	d := StartDaemon(t)
	requireBase(t, d)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	asUser := func(sb *client.Sandbox, script string) (string, int) {
		t.Helper()
		var o strings.Builder
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "bash", Args: []string{"-c", script}, User: "user", Stdout: &o, Stderr: &o})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return o.String(), code
	}

	plain := d.Create(t, client.CreateRequest{Template: "base"})
	if out, code := asUser(plain, "grep NoNewPrivs /proc/self/status; sudo -n id -u"); code == 0 || !strings.Contains(out, "NoNewPrivs:\t1") || !strings.Contains(out, "no new privileges") {
		t.Errorf("sudo without allow_sudo = %q (exit %d), want refused under no_new_privs", out, code)
	}

	sb := d.Create(t, client.CreateRequest{Template: "base", AllowSudo: true})
	if got, err := d.Client.Get(ctx, sb.ID); err != nil || !got.AllowSudo {
		t.Errorf("get = allow_sudo %v, %v; want true", got != nil && got.AllowSudo, err)
	}
	if out, code := asUser(sb, "sudo -n id -u && sudo -n grep -E '^(Seccomp|CapBnd):' /proc/self/status"); code != 0 || !strings.HasPrefix(out, "0\n") || !strings.Contains(out, "Seccomp:\t2") {
		t.Errorf("sudo with allow_sudo = %q (exit %d), want root, still under seccomp", out, code)
	}
	// sudo's root as the host sees it.
	const marker = "sleep 31337"
	if _, err := sb.Start(ctx, client.ExecRequest{Cmd: "bash", Args: []string{"-c", "exec sudo -n " + marker}, User: "user"}); err != nil {
		t.Fatal(err)
	}
	var sleeper harness.Proc
	deadline := time.Now().Add(time.Minute)
	for sleeper.PID == 0 && time.Now().Before(deadline) {
		if ps := harness.Procs(func(p harness.Proc) bool { return p.Cmdline == marker }); len(ps) == 1 {
			sleeper = ps[0]
		} else {
			time.Sleep(50 * time.Millisecond) // polling /proc: a process's start sends no event
		}
	}
	if sleeper.PID == 0 {
		t.Fatal("sudo's command never appeared on the host")
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sleeper.PID))
	if err != nil {
		t.Fatal(err)
	}
	agents := harness.Procs(func(p harness.Proc) bool {
		other, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.PID))
		return err == nil && other == ns && strings.HasPrefix(p.Cmdline, "/.berth/berth-agent")
	})
	if len(agents) != 1 {
		t.Fatalf("%d agents in the sleeper's pid namespace, want 1", len(agents))
	}
	if sleeper.UID == 0 || sleeper.UID != agents[0].UID {
		t.Errorf("sudo's command runs as host uid %d, want the sandbox's root, host uid %d (never 0)", sleeper.UID, agents[0].UID)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sleeper.PID))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "Seccomp:\t2") || !strings.Contains(string(status), "NoNewPrivs:\t0") {
		t.Errorf("sudo's command status lacks Seccomp 2 / NoNewPrivs 0:\n%s", status)
	}
}
