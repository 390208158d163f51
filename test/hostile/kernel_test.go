package hostile

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestKernelInterfaces runs the attacks on kernel interfaces: system calls
// the seccomp profile, the capability set or the user namespace must
// refuse, and files under /proc, /sys and /dev that must be read-only,
// masked or absent.
func TestKernelInterfaces(t *testing.T) {
	harness.ForEachIsolation(t, testKernelInterfaces)
}

func testKernelInterfaces(t *testing.T, iso string) {
	l := newLab(t, client.CreateRequest{Isolation: iso})

	// Attacks made by the static attack tool; each must report "blocked".
	tool := []struct {
		name string
		args []string
	}{
		{"userns", nil},
		{"userns-clone", nil},
		{"clone3", nil},
		{"unshare-mount", nil},
		{"mount", nil},
		{"remount-proc", nil},
		{"umount-mask", nil},
		{"fsopen", nil},
		{"open-tree", nil},
		{"pivot-root", nil},
		{"ptrace-pid1", nil},
		{"ptrace-seize", nil},
		{"process-vm-readv", nil},
		{"pid1-mem", nil},
		{"pid1-environ", nil},
		{"keyctl", nil},
		{"add-key", nil},
		{"socket-packet", nil},
		{"socket-packet-highbits", nil},
		{"socket-raw", nil},
		{"socket-raw6", nil},
		{"io-uring", nil},
		{"bpf", nil},
		{"perf-event", nil},
		{"userfaultfd", nil},
		{"open-by-handle", nil},
		{"setns", nil},
		{"kexec", nil},
		{"init-module", nil},
		{"reboot", nil},
		{"settime", nil},
		{"swapon", nil},
		{"mknod-block", nil},
		{"mknod-mem", nil},
		{"tiocsti", nil},
		{"tiocsti-highbits", nil},
		{"exe-write", nil},
		{"chroot-escape", []string{l.canary, l.d.DataDir}},
	}
	for _, a := range tool {
		t.Run(a.name, func(t *testing.T) {
			if c, ok := gvisorContained[a.name]; ok && iso == client.IsolationGVisor {
				l.contained(t, a.name, c)
			} else {
				l.attack(t, a.name, a.args...)
			}
			l.check(t)
		})
	}

	// Attacks as shell scripts: each exits 0 when the sandbox held.
	scripts := []struct{ name, script string }{
		{"sysrq-trigger", `! echo c > /proc/sysrq-trigger`},
		{"proc-sys-core-pattern", `! echo '|/tmp/x' > /proc/sys/kernel/core_pattern`},
		{"proc-sys-drop-caches", `! echo 3 > /proc/sys/vm/drop_caches`},
		{"proc-sys-hostname-knob", `! echo pwned > /proc/sys/kernel/hostname`},
		{"sys-write", `! echo 1 > /sys/kernel/uevent_helper && ! echo 1 > /sys/class/net/lo/mtu && ! echo 1 > /sys/kernel/mm/transparent_hugepage/enabled`},
		{"cgroup-release-agent", `for f in /sys/fs/cgroup/*/release_agent /sys/fs/cgroup/release_agent; do [ -e "$f" ] || continue; echo /tmp/x > "$f" 2>/dev/null && { echo "wrote $f"; exit 1; }; done
for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do mkdir "$d/x" 2>/dev/null && { echo "mkdir in $d"; exit 1; }; echo 1 > "$d/notify_on_release" 2>/dev/null && { echo "notify_on_release $d"; exit 1; }; done; exit 0`},
		{"cgroup-procs-escape", `for f in $(find /sys/fs/cgroup -name cgroup.procs 2>/dev/null); do echo $$ > "$f" 2>/dev/null && { echo "moved via $f"; exit 1; }; done; exit 0`},
		{"kcore-kmsg-masked", `[ ! -s /proc/kcore ] && ! head -c1 /dev/kmsg 2>/dev/null && [ -z "$(cat /proc/keys 2>/dev/null)" ]`},
		{"host-devices", `for d in /dev/*; do case "${d#/dev/}" in null|zero|full|random|urandom|tty|ptmx|pts|shm|mqueue|fd|stdin|stdout|stderr|core|console) ;; *) echo "unexpected $d"; exit 1;; esac; done
for d in /dev/mem /dev/kmem /dev/port /dev/sda /dev/vda /dev/kmsg /dev/loop0 /dev/fuse /dev/kvm /dev/net/tun; do [ -e $d ] && { echo "$d exists"; exit 1; }; done; exit 0`},
		{"busybox-unshare-user", `! unshare -U true 2>/dev/null && ! unshare -r true 2>/dev/null`},
		{"busybox-mount", `mkdir -p /tmp/m && ! mount -t tmpfs none /tmp/m 2>/dev/null && ! mount --bind / /tmp/m 2>/dev/null && ! mount -o remount,rw /sys 2>/dev/null`},
		{"agent-binary-replace", `! cp /bin/busybox /.berth/berth-agent 2>/dev/null && ! rm -f /.berth/berth-agent 2>/dev/null && ! mv /.berth/berth-agent /tmp/a 2>/dev/null && [ -e /.berth/berth-agent ]`},
		{"agent-hardlink", `! ln /.berth/berth-agent /tmp/agent-link 2>/dev/null`},
		{"kill-host-pids", `n=0; for p in 2 100 300 1000 4000 30000; do kill -0 $p 2>/dev/null && n=$((n+1)); done; [ $(ls -d /proc/[0-9]* | wc -l) -lt 50 ]`},
		// No new privileges, seccomp in filter mode, and none of the
		// capabilities that open the host: NET_ADMIN 12, NET_RAW 13,
		// SYS_MODULE 16, SYS_RAWIO 17, SYS_PTRACE 19, SYS_ADMIN 21,
		// SYS_BOOT 22, SYS_RESOURCE 24, SYS_TIME 25, MKNOD 27.
		{"privileges", `s=/proc/self/status; grep -q '^NoNewPrivs:[[:space:]]*1' $s && grep -q '^Seccomp:[[:space:]]*2' $s || exit 1
for f in CapEff CapBnd CapPrm; do c=$((0x$(awk "/^$f:/{print \$2}" $s))); [ $((c & (1<<12|1<<13|1<<16|1<<17|1<<19|1<<21|1<<22|1<<24|1<<25|1<<27))) -eq 0 ] || { echo "$f has $c"; exit 1; }; done`},
		{"neighbour-invisible", `ps -o args | grep -v grep | grep -q neighbour-sleeper && exit 1; ! grep -rqs 'neighbour ' /root /tmp /home 2>/dev/null`},
		// Workloads are the OOM victims, never the agent (whose score
		// is read below, outside any fork of its).
		{"oom-score", `[ "$(cat /proc/self/oom_score_adj)" = 1000 ] && ! echo -1000 > /proc/self/oom_score_adj 2>/dev/null`},
	}
	for _, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			script := s.script
			if g, ok := gvisorScripts[s.name]; ok && iso == client.IsolationGVisor {
				script = g
			}
			o := l.shell(t, script)
			if o != "" {
				t.Logf("%s", strings.TrimSpace(o))
			}
			l.check(t)
		})
	}

	// The agent sits below its workloads. A process can see the agent
	// at the workload's score while the agent forks one (its own start
	// among them: see workloadOOMScoreAdj), so the score is read through
	// the agent's file API, which forks nothing, once the attacks ended.
	t.Run("oom-score-agent", func(t *testing.T) {
		var b strings.Builder
		if err := l.sb.ReadFile(t.Context(), "/proc/1/oom_score_adj", &b); err != nil {
			t.Fatal(err)
		}
		if n, err := strconv.Atoi(strings.TrimSpace(b.String())); err != nil || n >= 1000 {
			t.Errorf("agent's oom_score_adj = %q, want below 1000", b.String())
		}
	})

	if iso == client.IsolationGVisor {
		// oom_score_adj inside gVisor is the sentry's bookkeeping: the
		// host's OOM killer sees only the sentry and the gofer, whose
		// scores sandbox root cannot change.
		t.Run("oom-score-host", func(t *testing.T) {
			before := hostOOMScores(t, l)
			l.shell(t, `echo -1000 > /proc/self/oom_score_adj; echo -1000 > /proc/1/oom_score_adj; :`)
			after := hostOOMScores(t, l)
			if slices.Min(after) < slices.Min(before) {
				t.Errorf("host oom_score_adj of the sandbox's processes went down: %v -> %v", before, after)
			}
			t.Logf("host oom_score_adj of the sentry, gofer and stubs: %v, after the writes %v", before, after)
		})
	}

	t.Run("netlink-still-works", func(t *testing.T) {
		o, e, code := l.exec(t, l.sb, "/tmp/attacker", "socket-netlink")
		if code != 0 {
			t.Errorf("netlink socket refused: %s %s", o, e)
		}
	})
}

// gvisorContained are the attacks a gVisor sandbox lets succeed inside
// its sentry, which implements the call itself without reaching the host:
// each maps to a shell check (run in the sandbox, exit 0 when the
// success is harmless) of why. The host check runs after each as for
// every attack. Either outcome of the attack is accepted (a newer runsc
// may refuse the call); docs/security.md lists these.
var gvisorContained = map[string]string{
	// A mount namespace of the sentry's; mounting in it is still refused.
	"unshare-mount": `! mount -t tmpfs none /tmp 2>/dev/null`,
	// Nodes in /tmp (refused by the current runsc; made in a tmpfs of
	// the sentry's by Debian's): the sentry has no driver for them, so
	// they open nothing, and on the disk the gofer refuses them.
	"mknod-block": `! head -c1 /tmp/sda >/dev/null 2>&1 && ! mknod /root/sda b 8 0 2>/dev/null`,
	"mknod-mem":   `! head -c1 /tmp/mem >/dev/null 2>&1 && ! mknod /root/mem c 1 1 2>/dev/null`,
	// The sentry lets a process write its own executable (no ETXTBSY),
	// here /tmp/attacker; there is no runtime binary inside to
	// overwrite, and the agent's stays read-only.
	"exe-write": `! (exec 3>>/proc/1/exe) 2>/dev/null && ! (exec 3>>/.berth/berth-agent) 2>/dev/null`,
	// The sentry's terminals are its own: the attack cannot make one its
	// controlling terminal (TIOCSCTTY is EINVAL), and no host terminal
	// is reachable to inject into.
	"tiocsti":          `[ -c /dev/ptmx ] || [ -L /dev/ptmx ]`,
	"tiocsti-highbits": `[ -c /dev/ptmx ] || [ -L /dev/ptmx ]`,
}

// gvisorScripts replace the script of an attack whose gVisor outcome
// differs in a way the runc script would reject.
var gvisorScripts = map[string]string{
	// /dev/fuse and /dev/net/tun are the sentry's own devices (its FUSE
	// and a TUN device of its netstack, which needs CAP_NET_ADMIN the
	// sandbox lacks), not the host's.
	"host-devices": `for d in /dev/*; do case "${d#/dev/}" in null|zero|full|random|urandom|tty|ptmx|pts|shm|mqueue|fd|stdin|stdout|stderr|core|console|net|fuse) ;; *) echo "unexpected $d"; exit 1;; esac; done
for d in /dev/mem /dev/kmem /dev/port /dev/sda /dev/vda /dev/kmsg /dev/loop0 /dev/kvm; do [ -e $d ] && { echo "$d exists"; exit 1; }; done; exit 0`,
	// The sentry's /proc/self/status has no NoNewPrivs line; seccomp and
	// the capability sets are as on runc.
	"privileges": `s=/proc/self/status; grep -q '^Seccomp:[[:space:]]*2' $s || exit 1
for f in CapEff CapBnd CapPrm; do c=$((0x$(awk "/^$f:/{print \$2}" $s))); [ $((c & (1<<12|1<<13|1<<16|1<<17|1<<19|1<<21|1<<22|1<<24|1<<25|1<<27))) -eq 0 ] || { echo "$f has $c"; exit 1; }; done`,
	// Workloads start at 1000 as on runc, but sandbox root may lower its
	// score in the sentry: see oom-score-host for what the host sees.
	"oom-score": `[ "$(cat /proc/self/oom_score_adj)" = 1000 ]`,
}

// contained runs an attack that may succeed inside gVisor's sentry and
// then its containment check.
func (l *lab) contained(t *testing.T, name, check string) {
	t.Helper()
	o, e, code := l.exec(t, l.sb, "/tmp/attacker", name)
	t.Logf("%s on gvisor: exit %d: %s%s", name, code, strings.TrimSpace(o), strings.TrimSpace(e))
	l.shell(t, check)
}

// hostOOMScores lists the host oom_score_adj of every process in the
// attacker sandbox's cgroup.
func hostOOMScores(t *testing.T, l *lab) []int {
	t.Helper()
	var out []int
	for _, pid := range sandboxPids(t, l.d, l.sb.ID) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		if err != nil {
			continue // gone meanwhile (a ptrace stub)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("oom_score_adj of %d: %q", pid, b)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		t.Fatalf("no host process found in sandbox %s", l.sb.ID)
	}
	return out
}
