package hostile

import (
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
)

// TestKernelInterfaces runs the attacks on kernel interfaces: system calls
// the seccomp profile, the capability set or the user namespace must
// refuse, and files under /proc, /sys and /dev that must be read-only,
// masked or absent.
func TestKernelInterfaces(t *testing.T) {
	l := newLab(t, client.CreateRequest{})

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
			l.attack(t, a.name, a.args...)
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
		// Workloads are the OOM victims, never the agent.
		{"oom-score", `[ "$(cat /proc/self/oom_score_adj)" = 1000 ] && [ "$(cat /proc/1/oom_score_adj)" -lt 1000 ] && ! echo -1000 > /proc/self/oom_score_adj 2>/dev/null`},
	}
	for _, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			o := l.shell(t, s.script)
			if o != "" {
				t.Logf("%s", strings.TrimSpace(o))
			}
			l.check(t)
		})
	}

	t.Run("netlink-still-works", func(t *testing.T) {
		o, e, code := l.exec(t, l.sb, "/tmp/attacker", "socket-netlink")
		if code != 0 {
			t.Errorf("netlink socket refused: %s %s", o, e)
		}
	})
}
