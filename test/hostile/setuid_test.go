package hostile

import (
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
)

// TestSetuidRaiseContained: with allow_sudo a set-uid-root program raises
// a uid-1000 process to the sandbox's root, and the attacks that sandbox
// root already fails (TestKernelInterfaces) fail from the raised process
// too: the raise stays inside the sandbox's user namespace, bounding set
// and seccomp filter. Without allow_sudo (the lab's neighbour-free
// default, the "privileges" script of TestKernelInterfaces) no_new_privs
// keeps the process at uid 1000. runc only: gVisor's sentry does not
// raise set-uid programs (docs/security.md).
func TestSetuidRaiseContained(t *testing.T) {
	for _, allow := range []bool{false, true} {
		name := "no_new_privs"
		if allow {
			name = "allow_sudo"
		}
		t.Run(name, func(t *testing.T) {
			l := newLab(t, client.CreateRequest{AllowSudo: allow})
			l.shell(t, "cp /tmp/attacker /tmp/suid && chmod 4755 /tmp/suid")
			o, e, code := l.exec(t, l.sb, "/tmp/attacker", "setuid")
			want := "raised: ruid=1000 euid=1000"
			if allow {
				want = "raised: ruid=1000 euid=0"
			}
			if code != 0 || !strings.Contains(o, want) {
				t.Fatalf("setuid raise: exit %d, %q %q; want %q", code, o, e, want)
			}
			if !allow {
				return
			}
			for _, a := range []string{"userns", "unshare-mount", "mount", "remount-proc", "ptrace-pid1", "pid1-mem", "keyctl",
				"socket-raw", "bpf", "setns", "init-module", "kexec", "reboot", "settime", "mknod-block", "mknod-mem", "exe-write"} {
				t.Run(a, func(t *testing.T) {
					o, e, code := l.exec(t, l.sb, "/tmp/attacker", "setuid", a)
					if code != 0 || !strings.Contains(o, "raised: ruid=1000 euid=0") || !strings.Contains(o, "blocked:") || strings.Contains(o, "ESCAPED") {
						t.Errorf("raised attack %s: exit %d\nstdout: %s\nstderr: %s", a, code, o, e)
					}
					l.check(t)
				})
			}
		})
	}
}
