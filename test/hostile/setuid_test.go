package hostile

import (
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestSetuidRaiseContained: with allow_sudo a set-uid-root program raises
// a uid-1000 process to the sandbox's root, and the attacks that sandbox
// root already fails (TestKernelInterfaces) fail from the raised process
// too: the raise stays inside the sandbox's user namespace (gVisor: its
// sentry), bounding set and seccomp filter. Without allow_sudo (the
// lab's neighbour-free default, the "privileges" script of
// TestKernelInterfaces) no_new_privs keeps the process at uid 1000. Under
// gVisor a runsc without --allow-suid raises no one either way: the test
// checks that and skips the attacks (docs/security.md).
func TestSetuidRaiseContained(t *testing.T) {
	harness.ForEachIsolation(t, testSetuidRaiseContained)
}

func testSetuidRaiseContained(t *testing.T, iso string) {
	for _, allow := range []bool{false, true} {
		name := "no_new_privs"
		if allow {
			name = "allow_sudo"
		}
		t.Run(name, func(t *testing.T) {
			l := newLab(t, client.CreateRequest{Isolation: iso, AllowSudo: &allow})
			raises, why := harness.SudoTakesEffect(t, l.d, iso)
			raises = raises && allow
			l.shell(t, "cp /tmp/attacker /tmp/suid && chmod 4755 /tmp/suid")
			o, e, code := l.exec(t, l.sb, "/tmp/attacker", "setuid")
			want := "raised: ruid=1000 euid=1000"
			if raises {
				want = "raised: ruid=1000 euid=0"
			}
			if code != 0 || !strings.Contains(o, want) {
				t.Fatalf("setuid raise: exit %d, %q %q; want %q", code, o, e, want)
			}
			if !allow {
				return
			}
			if !raises {
				t.Skip(why)
			}
			for _, a := range []string{"userns", "unshare-mount", "mount", "remount-proc", "ptrace-pid1", "pid1-mem", "keyctl",
				"socket-raw", "bpf", "setns", "init-module", "kexec", "reboot", "settime", "mknod-block", "mknod-mem", "exe-write"} {
				t.Run(a, func(t *testing.T) {
					o, e, code := l.exec(t, l.sb, "/tmp/attacker", "setuid", a)
					if !strings.Contains(o, "raised: ruid=1000 euid=0") {
						t.Errorf("raised attack %s: not raised: exit %d\nstdout: %s\nstderr: %s", a, code, o, e)
					}
					if c, ok := gvisorContained[a]; ok && iso == client.IsolationGVisor {
						// Succeeds inside the sentry, as for sandbox root.
						t.Logf("raised %s on gvisor: exit %d: %s%s", a, code, strings.TrimSpace(o), strings.TrimSpace(e))
						l.shell(t, c)
					} else if code != 0 || !strings.Contains(o, "blocked:") || strings.Contains(o, "ESCAPED") {
						t.Errorf("raised attack %s: exit %d\nstdout: %s\nstderr: %s", a, code, o, e)
					}
					l.check(t)
				})
			}
		})
	}
}
