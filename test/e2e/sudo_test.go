package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestAllowSudo: in base, user's sudo fails under no_new_privs (the
// default); a sandbox created with allow_sudo lets it become the
// sandbox's root, still under seccomp and without the capabilities that
// open the host, and (runc) the host sees that root as the sandbox's own
// host uid, never 0. Under gVisor the same holds with a runsc that has
// --allow-suid; with one that has not (Debian's 20221219) the test
// checks that allow_sudo has no effect, as the daemon reports, and skips
// the rest.
func TestAllowSudo(t *testing.T) {
	forEachIsolation(t, testAllowSudo)
}

// sudoScript runs user's sudo and prints what its root holds.
const sudoScript = "sudo -n id -u && sudo -n grep -E '^(Seccomp|CapBnd):' /proc/self/status"

// asUser runs script as user in sb and returns its output and exit code.
func asUser(t *testing.T, sb *client.Sandbox, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var o strings.Builder
	code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "bash", Args: []string{"-c", script}, User: "user", Stdout: &o, Stderr: &o})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return o.String(), code
}

// checkSudo asserts what user's sudo does in sb: root under seccomp,
// without CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_MODULE, CAP_SYS_RAWIO,
// CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_SYS_BOOT, CAP_SYS_RESOURCE,
// CAP_SYS_TIME or CAP_MKNOD in its bounding set (raises), or refused
// under no_new_privs.
func checkSudo(t *testing.T, sb *client.Sandbox, raises bool) {
	t.Helper()
	out, code := asUser(t, sb, sudoScript)
	if !raises {
		if code == 0 || !strings.Contains(out, "no new privileges") {
			t.Errorf("sudo in %s = %q (exit %d), want refused under no_new_privs", sb.ID, out, code)
		}
		return
	}
	if code != 0 || !strings.HasPrefix(out, "0\n") || !strings.Contains(out, "Seccomp:\t2") {
		t.Errorf("sudo in %s = %q (exit %d), want root, still under seccomp", sb.ID, out, code)
		return
	}
	var bnd uint64
	if i := strings.Index(out, "CapBnd:\t"); i < 0 {
		t.Errorf("sudo in %s printed no CapBnd: %q", sb.ID, out)
	} else if _, err := fmt.Sscanf(out[i+len("CapBnd:\t"):], "%x", &bnd); err != nil {
		t.Errorf("CapBnd in %q: %v", out, err)
	}
	for _, c := range []uint{12, 13, 16, 17, 19, 21, 22, 24, 25, 27} {
		if bnd&(1<<c) != 0 {
			t.Errorf("sudo's root in %s has capability %d in its bounding set %x", sb.ID, c, bnd)
		}
	}
}

func testAllowSudo(t *testing.T, iso string) {
	d := StartDaemon(t)
	requireBase(t, d)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	plain := d.Create(t, client.CreateRequest{Template: "base", Isolation: iso})
	checkSudo(t, plain, false)
	if iso == client.IsolationRunc {
		if out, _ := asUser(t, plain, "grep NoNewPrivs /proc/self/status"); !strings.Contains(out, "NoNewPrivs:\t1") {
			t.Errorf("plain sandbox: %q, want NoNewPrivs 1", out)
		}
	}

	sb := d.Create(t, client.CreateRequest{Template: "base", Isolation: iso, AllowSudo: new(true)})
	if got, err := d.Client.Get(ctx, sb.ID); err != nil || !got.AllowSudo {
		t.Errorf("get = allow_sudo %v, %v; want true", got != nil && got.AllowSudo, err)
	}
	raises, why := harness.SudoTakesEffect(t, d, iso)
	checkSudo(t, sb, raises)
	if !raises {
		t.Skip(why)
	}
	if iso != client.IsolationRunc {
		return // the sentry's processes are not the host's
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

// TestSnapshotAllowSudo: a snapshot of a sandbox made with allow_sudo
// says so, and what is made from it gets it like the snapshot's other
// settings: a create from it that leaves allow_sudo unset, a fork's copy,
// and a create from the snapshot exported and imported again; a create
// from it with allow_sudo false gets no_new_privs. On both levels (under
// gVisor, sudo itself works only where the level says so).
func TestSnapshotAllowSudo(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		requireBase(t, d)
		ctx := t.Context()
		raises, why := harness.SudoTakesEffect(t, d, iso)
		if !raises {
			t.Log(why)
		}
		src := d.Create(t, client.CreateRequest{Template: "base", Isolation: iso, AllowSudo: new(true), Timeout: "30m"})
		MustRun(t, src, "echo kept > /home/f")
		snap, err := d.Client.Snapshot(ctx, src.ID, "sudo")
		if err != nil {
			t.Fatal(err)
		}
		if !snap.AllowSudo {
			t.Errorf("snapshot of an allow_sudo sandbox = %+v; want allow_sudo", snap)
		}
		file := filepath.Join(t.TempDir(), "snap.tar")
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Client.ExportSnapshot(ctx, snap.ID, f); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		imported, err := d.Client.ImportSnapshot(ctx, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !imported.AllowSudo {
			t.Errorf("imported snapshot = %+v; want allow_sudo", imported)
		}
		fork, err := d.Client.Fork(ctx, src.ID, 1)
		if err != nil {
			t.Fatal(err)
		}

		// A memory snapshot's processes keep the no_new_privs they run
		// with: a create from it that asks otherwise is refused.
		if snap.Kind == client.SnapshotMemory {
			_, err := d.Client.Create(ctx, client.CreateRequest{Template: "base", Snapshot: snap.ID, AllowSudo: new(false)})
			var ee *errdefs.Error
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &ee) || ee.Field != "allow_sudo" {
				t.Errorf("create from a memory snapshot with allow_sudo false = %v; want invalid_argument naming allow_sudo", err)
			}
		}
		for _, c := range []struct {
			name string
			req  client.CreateRequest
			id   string // or an existing sandbox
			want bool
		}{
			{name: "create from it", req: client.CreateRequest{Template: "base", Snapshot: snap.ID}, want: true},
			{name: "create from it with allow_sudo false", req: client.CreateRequest{Template: "base", Snapshot: snap.ID, AllowSudo: new(false)}, want: false},
			{name: "create from it imported", req: client.CreateRequest{Template: "base", Snapshot: imported.ID}, want: true},
			{name: "fork", id: fork.Sandboxes[0].ID, want: true},
		} {
			if c.req.AllowSudo != nil && !*c.req.AllowSudo && snap.Kind == client.SnapshotMemory {
				continue // refused, above
			}
			t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
				var sb *client.Sandbox
				if c.id != "" {
					if sb, err = d.Client.Get(ctx, c.id); err != nil {
						t.Fatal(err)
					}
				} else {
					sb = d.Create(t, c.req)
				}
				// Gone before its snapshot is removed below.
				defer func() {
					if err := d.Client.Kill(ctx, sb.ID); err != nil {
						t.Error(err)
					}
				}()
				if sb.AllowSudo != c.want || sb.Isolation != iso {
					t.Errorf("%s: allow_sudo %v, isolation %s; want %v, %s", c.name, sb.AllowSudo, sb.Isolation, c.want, iso)
				}
				if got := MustRun(t, sb, "cat /home/f"); got != "kept\n" {
					t.Errorf("%s: /home/f = %q, want the source's", c.name, got)
				}
				checkSudo(t, sb, c.want && raises)
			})
		}
		// Every sandbox made from the snapshots is gone (the fork's
		// snapshot went with its copy).
		for _, id := range []string{snap.ID, imported.ID} {
			if err := d.Client.RemoveSnapshot(ctx, id); err != nil {
				t.Errorf("remove snapshot %s: %v", id, err)
			}
		}
	})
}
