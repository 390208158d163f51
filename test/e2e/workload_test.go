package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

func TestWatchDir(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		sb := d.Create(t, client.CreateRequest{Isolation: iso})
		MustRun(t, sb, "mkdir -p /tmp/w/sub")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var mu sync.Mutex
		var seen []string
		ready := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- sb.WatchDirNotify(ctx, "/tmp/w", true, func() { close(ready) }, func(e client.FileEvent) error {
				mu.Lock()
				seen = append(seen, e.Op+" "+e.Name)
				mu.Unlock()
				return nil
			})
		}()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("watch ended before it was ready: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("watch not ready")
		}
		MustRun(t, sb, "echo a > /tmp/w/a.txt; echo b > /tmp/w/sub/b.txt; mv /tmp/w/a.txt /tmp/w/c.txt; rm /tmp/w/sub/b.txt")
		want := []string{"create a.txt", "write a.txt", "create sub/b.txt", "rename a.txt", "create c.txt", "remove sub/b.txt"}
		waitFor(t, time.Minute, "watch events", func() bool {
			mu.Lock()
			defer mu.Unlock()
			got := strings.Join(seen, ",")
			for _, w := range want {
				if !strings.Contains(got, w) {
					return false
				}
			}
			return true
		})
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("watch ended with %v", err)
		}
	})
}

func TestCPUQuota(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{CPU: 0.5})
	// The quota is configured where the sandbox can read it (cgroup
	// namespace), which is what runtimes inside use to size themselves.
	q := strings.TrimSpace(MustRun(t, sb, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max"))
	if q != "50000\n100000" && q != "50000 100000" {
		t.Errorf("cpu quota inside = %q, want 50000 per 100000", q)
	}
	// And enforced: two spinning processes for 2 s of wall time get about
	// one core-second between them, not four.
	before, _ := d.Client.Get(t.Context(), sb.ID)
	MustRun(t, sb, "for i in 1 2; do (timeout 2 sh -c 'while :; do :; done') & done; wait")
	after, _ := d.Client.Get(t.Context(), sb.ID)
	if before.Usage == nil || after.Usage == nil {
		t.Fatal("no usage reported")
	}
	used := after.Usage.CPUSeconds - before.Usage.CPUSeconds
	if used > 1.6 {
		t.Errorf("two spinners for 2 s under a 0.5 CPU quota used %.2f CPU seconds, want about 1", used)
	}
	t.Logf("cpu seconds used under quota 0.5 over 2 s: %.2f", used)
}

func TestBaseTemplate(t *testing.T) {
	d := baseDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	out, errOut, code := d.CLI(t, nil, "template", "ls")
	if code != 0 || !strings.Contains(out, "base") || !strings.Contains(out, "minimal") {
		t.Errorf("template ls = %q %q", out, errOut)
	}
	sb := d.Create(t, client.CreateRequest{Template: "base"})
	got := MustRun(t, sb, "bash -c 'echo $BASH_VERSION' >/dev/null && python3 -c 'print(6*7)' && git --version | cut -d' ' -f1 && curl --version | head -c 4 && echo && ps -o comm= -p 1 && id user && ip -V && command -v nc")
	// ip and nc: users diagnose the egress policy from inside.
	for _, want := range []string{"42", "git", "curl", "berth-agent", "uid=1000(user)", "iproute2", "/nc"} {
		if !strings.Contains(got, want) {
			t.Errorf("base sandbox output %q lacks %q", got, want)
		}
	}
	var o strings.Builder
	code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "bash", Args: []string{"-lc", "whoami; echo $HOME; ls -d ~"}, User: "user", Stdout: &o})
	if err != nil || code != 0 || o.String() != "user\n/home/user\n/home/user\n" {
		t.Errorf("as user: %q %d %v", o.String(), code, err)
	}
	// Parity with E2B's base image, which its SDK's users assume: python
	// and python3 with pip, node and npm, and sudo for user.
	o.Reset()
	code, err = sb.Exec(ctx, client.ExecRequest{Cmd: "bash", Args: []string{"-c", "python -c 'import sys; print(sys.version_info[0])' && pip --version | cut -d' ' -f1 && python3 -m pip --version | cut -d' ' -f1 && node -e 'console.log(6*7)' && npm --version >/dev/null && echo npm && stat -c '%U %a' /usr/bin/sudo"}, User: "user", Stdout: &o, Stderr: &o})
	for _, want := range []string{"3\n", "pip\npip\n", "42\n", "npm\n", "root 4755\n"} {
		if err != nil || code != 0 || !strings.Contains(o.String(), want) {
			t.Errorf("base parity as user: %q (exit %d, %v) lacks %q", o.String(), code, err, want)
		}
	}
	// The sudoers entry is one sudo accepts. (sudo itself cannot raise a
	// user while the runtime sets no_new_privs on the sandbox.)
	if got := MustRun(t, sb, "cat /etc/sudoers.d/user && visudo -c -f /etc/sudoers.d/user >/dev/null && echo valid"); got != "user ALL=(ALL:ALL) NOPASSWD: ALL\nvalid\n" {
		t.Errorf("visudo -c of the sudoers entry: %q", got)
	}
	// pip installs system-wide, as E2B's pipInstall does (as root).
	if got := MustRun(t, sb, "pip config list"); !strings.Contains(got, "break-system-packages") {
		t.Errorf("pip config: %q", got)
	}
	// Each sandbox writes to its own layer: the template stays as built.
	MustRun(t, sb, "rm -rf /usr/bin/python3 && touch /etc/changed")
	sb2 := d.Create(t, client.CreateRequest{Template: "base"})
	if got := MustRun(t, sb2, "test -x /usr/bin/python3 && test ! -e /etc/changed && echo pristine"); got != "pristine\n" {
		t.Errorf("second sandbox sees the first one's writes: %q", got)
	}
}

// TestBaseWorkloads: what everyday tools need from the kernel works the
// same on both levels: threads (glibc's pthread_create tries clone3 and
// falls back to clone only on ENOSYS, which under gVisor the agent's own
// filter answers: runsc's seccomp says EPERM to every errno rule), node
// (its platform threads), and stat(1) and ls -l (statx). (/tmp on the
// sandbox's disk: TestLimits.)
func TestBaseWorkloads(t *testing.T) {
	d := baseDaemon(t)
	forEachIsolation(t, func(t *testing.T, iso string) {
		sb := d.Create(t, client.CreateRequest{Template: "base", Isolation: iso})
		got := MustRun(t, sb, `python3 -c 'import threading; t = threading.Thread(target=print, args=("thread ok",)); t.start(); t.join()' && `+
			`node -e 'require("worker_threads"); new (require("worker_threads").Worker)("process.exit(0)", {eval: true}).on("exit", c => console.log("worker " + c))' && `+
			`ls -l /etc/hostname | cut -c1 && stat -c %F /tmp`)
		for _, want := range []string{"thread ok\n", "worker 0\n", "-\n", "directory\n"} {
			if !strings.Contains(got, want) {
				t.Errorf("%s: output %q lacks %q", iso, got, want)
			}
		}
	})
}

// baseDaemon starts a daemon with the base template built, or skips
// where debootstrap's result is not to be had.
func baseDaemon(t *testing.T) *Daemon {
	t.Helper()
	if os.Getenv("BERTH_TEST_BASE") != "1" {
		if _, err := os.Stat(harness.CacheDir() + "/debootstrap"); err != nil {
			t.Skip("the base template needs debootstrap's result: set BERTH_TEST_BASE=1 (scripts/test.sh does) to build it")
		}
	}
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	if _, err := d.Client.BuildTemplate(ctx, "base", io.Discard); err != nil {
		t.Fatalf("build base: %v", err)
	}
	return d
}
