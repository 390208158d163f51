// Package install tests how Berth is installed and run on a host: the
// daemon started by scripts/start-daemon.sh (install.sh's last step) under
// a real systemd booted in a systemd-nspawn container, and in the same
// container without systemd.
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/daemon"
	"github.com/berth-sandbox/berth/test/harness"
)

var bin harness.Binaries

func TestMain(m *testing.M) { os.Exit(harness.Main(m, &bin, nil)) }

// hostDataDir is the data dir of a daemon on its defaults, which the unit
// runs; its instance name is derived from it (daemon.DefaultInstance).
const hostDataDir = "/var/lib/berth"

// machine is a systemd booted in a systemd-nspawn container whose root is
// this host's root filesystem under a throwaway overlay: the host's
// packages (runc, nftables, busybox, systemd), none of its state. It has
// a network namespace of its own with loopback only, Berth's data dir on
// a real filesystem of the host (varLib, so idmapped mounts work as on a
// host), the repository at /src and the test's build at /berth-bin.
type machine struct {
	t      *testing.T
	root   string
	varLib string
	cmd    *exec.Cmd
	log    *harness.SyncBuffer
	done   chan struct{}
	leader int
	// runsc is the runsc the tests run (first on PATH), which install.sh
	// installs into /usr/local/bin too.
	runsc string
	// cgroups are the container's own cgroup in each hierarchy nspawn
	// and systemd use (name=systemd on a v1 host, the cgroup2 one).
	// nspawn starts in them, so every process of the container, and
	// what nspawn makes below its own cgroup (payload/, supervisor/), is
	// found there, killed and removed however the test ends: a SIGKILL
	// of nspawn alone leaves the container's init running.
	cgroups []string
}

// newMachine prepares the container's root: the host's / under an
// overlay, with every unit the host enables at boot masked (its
// databases, registries and timers are not this test's business).
func newMachine(t *testing.T) *machine {
	t.Helper()
	dir := t.TempDir()
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal("runsc not found: run scripts/deps.sh and scripts/runsc-bin.sh")
	}
	m := &machine{t: t, root: filepath.Join(dir, "root"), varLib: filepath.Join(dir, "var-lib-berth"), runsc: runsc}
	for _, d := range []string{"upper", "work", "root", "var-lib-berth"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=/,upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
	if err := unix.Mount("overlay", m.root, "overlay", 0, opts); err != nil {
		t.Fatalf("overlay of / for the container: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(m.root, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the container's root: %v", err)
		}
	})
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mnt := range mounts {
		if mnt.FSType == "cgroup2" || strings.Contains(","+mnt.VFSOptions+",", ",name=systemd,") {
			cg := filepath.Join(mnt.Mountpoint, "berth-install-test-"+filepath.Base(dir))
			if err := os.Mkdir(cg, 0o755); err != nil {
				t.Fatal(err)
			}
			m.cgroups = append(m.cgroups, cg)
		}
	}
	t.Cleanup(m.removeCgroups)
	wants, _ := filepath.Glob("/etc/systemd/system/*.wants/*")
	unitDir := filepath.Join(m.root, "etc/systemd/system")
	// The controllers are made writable early in every boot, before
	// berth.service starts, as a systemd host has them: a daemon started
	// at boot removes what the last boot left in them at once.
	for path, body := range map[string]string{
		"usr/local/sbin/berth-test-cgroups": writableCgroups + "\n",
		"etc/systemd/system/berth-test-cgroups.service": "[Unit]\nDescription=test: cgroup controllers writable, as on a systemd host\n" +
			"DefaultDependencies=no\nBefore=sysinit.target berth.service\n\n[Service]\nType=oneshot\nExecStart=/bin/sh /usr/local/sbin/berth-test-cgroups\n",
	} {
		p := filepath.Join(m.root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	early := filepath.Join(unitDir, "sysinit.target.wants")
	if err := os.MkdirAll(early, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../berth-test-cgroups.service", filepath.Join(early, "berth-test-cgroups.service")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	for _, w := range wants {
		mask := filepath.Join(unitDir, filepath.Base(w))
		if err := os.Remove(mask); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.Symlink("/dev/null", mask); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// boot starts the container and waits until its systemd reports the
// system up. On a cgroup v1 host nspawn mounts the controllers read-only
// in the container (only its name=systemd subtree is writable); a systemd
// host has them writable, so they are remounted so, early in the boot
// (berth-test-cgroups.service, newMachine) and again once it is up.
func (m *machine) boot() {
	t := m.t
	t.Helper()
	m.log = &harness.SyncBuffer{}
	m.done = make(chan struct{})
	m.cmd = m.nspawn(context.Background(), "--console=read-only", "-b")
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	go func() {
		_ = m.cmd.Wait() // its log says why; poweroff waits on done
		close(m.done)
	}()
	t.Cleanup(func() {
		select {
		case <-m.done:
		default:
			m.killContainer()
			<-m.done
		}
	})
	// The container's init is the first process named systemd under
	// nspawn.
	harness.WaitFor(t, 60*time.Second, "the container's systemd to start", func() bool {
		m.leader = findDescendant(m.cmd.Process.Pid, "systemd")
		return m.leader != 0
	})
	// Until systemd's own socket is up, systemctl cannot ask it; then
	// --wait waits for the boot to end.
	var state string
	harness.WaitFor(t, 120*time.Second, "the container's systemd to finish booting", func() bool {
		out, _ := m.run(t.Context(), "systemctl is-system-running --wait")
		state = strings.TrimSpace(out)
		return state != "" && state != "offline" && state != "starting" && state != "initializing"
	})
	// Degraded: a unit of the host's own failed in the container (its
	// log says which); Berth's is what this test is about.
	if state == "degraded" {
		failed, _ := m.run(t.Context(), "systemctl --failed --no-legend --no-pager")
		t.Logf("the container's systemd is degraded; failed units:\n%s", failed)
	} else if state != "running" {
		failed, _ := m.run(t.Context(), "systemctl --failed --no-legend --no-pager")
		t.Fatalf("the container's systemd is %q, not running; failed units:\n%s\nboot log:\n%s", state, failed, m.log.String())
	}
	m.mustRun(writableCgroups)
}

// nspawnArgs are systemd-nspawn's arguments for the container, then
// extra.
func (m *machine) nspawnArgs(extra ...string) []string {
	m.t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		m.t.Fatal(err)
	}
	return append([]string{"--quiet", "-D", m.root, "-M", "berth-install-test",
		"--register=no", "--keep-unit", "--private-network",
		"--bind=/dev/loop-control", "--bind=" + m.varLib + ":" + hostDataDir,
		"--bind-ro=" + repo + ":/src", "--bind-ro=" + bin.Dir + ":/berth-bin", "--bind-ro=" + m.runsc + ":/berth-runsc"}, extra...)
}

// nspawn is systemd-nspawn for the container with extra arguments,
// started in the container's own cgroups.
func (m *machine) nspawn(ctx context.Context, extra ...string) *exec.Cmd {
	const script = `for d in $BERTH_TEST_CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 1; done; exec systemd-nspawn "$@"`
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", script, "sh"}, m.nspawnArgs(extra...)...)...)
	cmd.Env = append(os.Environ(), "BERTH_TEST_CGROUPS="+strings.Join(m.cgroups, " "))
	return cmd
}

// cgroupProcs lists the processes in the container's cgroups.
func (m *machine) cgroupProcs() []int {
	var pids []int
	for _, cg := range m.cgroups {
		_ = filepath.WalkDir(cg, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killContainer SIGKILLs every process in the container's cgroups (nspawn
// and the container's init included, which ends its PID namespace) and
// waits until they are gone.
func (m *machine) killContainer() {
	harness.WaitFor(m.t, 60*time.Second, "the container's processes to be gone", func() bool {
		pids := m.cgroupProcs()
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		return len(pids) == 0
	})
}

// removeCgroups kills what is left in the container's cgroups and
// removes them, the ones nspawn made below them included.
func (m *machine) removeCgroups() {
	m.killContainer()
	for _, cg := range m.cgroups {
		var dirs []string
		_ = filepath.WalkDir(cg, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil {
				m.t.Errorf("remove the container's cgroup: %v", err)
			}
		}
	}
}

// writableCgroups is a script that remounts the container's read-only
// cgroup controllers writable (see boot).
const writableCgroups = `findmnt -rn -t cgroup -o TARGET,OPTIONS | while read -r target opts; do
	case $opts in ro,*) mount -o remount,bind,rw "$target" ;; esac
done`

// requireContainerHost skips unless this host can run the container (root,
// runc) and fails without systemd-nspawn. It returns the instance name of
// a daemon on its defaults (the container's), and skips where such a
// daemon is installed or runs on this host: the container's would share
// its cgroups.
func requireContainerHost(t *testing.T) string {
	t.Helper()
	harness.RequireHost(t)
	if _, err := exec.LookPath("systemd-nspawn"); err != nil {
		t.Fatal("systemd-nspawn not found: run scripts/deps.sh (Debian package systemd-container)")
	}
	inst := daemon.DefaultInstance(hostDataDir)
	if _, err := os.Stat("/etc/systemd/system/berth.service"); err == nil || len(instanceCgroups(inst)) > 0 {
		t.Skip("a Berth daemon on its defaults is installed or runs on this host; the container's would share its instance's cgroups")
	}
	return inst
}

// findDescendant is the first process named comm below pid, or 0.
func findDescendant(pid int, comm string) int {
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	for _, f := range strings.Fields(string(kids)) {
		k, _ := strconv.Atoi(f)
		if c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", k)); strings.TrimSpace(string(c)) == comm {
			return k
		}
		if d := findDescendant(k, comm); d != 0 {
			return d
		}
	}
	return 0
}

// run runs script in the container (every namespace of its init, as a
// login there would) and returns its output.
func (m *machine) run(ctx context.Context, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(m.leader), "-a", "/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%q in the container: %w: %s%s", script, err, stderr.String(), out.String())
	}
	return out.String(), nil
}

func (m *machine) mustRun(script string) string {
	m.t.Helper()
	out, err := m.run(m.t.Context(), script)
	if err != nil {
		journal, _ := m.run(context.Background(), "journalctl -u berth --no-pager -n 60")
		m.t.Fatalf("%v\nberth's journal:\n%s", err, journal)
	}
	return out
}

// poweroff shuts the container down cleanly and waits until nspawn is
// gone.
func (m *machine) poweroff() {
	m.t.Helper()
	// The call's connection drops as systemd goes down: its error is
	// expected; nspawn exiting is what counts.
	_, _ = m.run(m.t.Context(), "systemctl poweroff")
	select {
	case <-m.done:
	case <-time.After(2 * time.Minute):
		m.t.Fatalf("the container did not power off; its log:\n%s", m.log.String())
	}
}

// waitHealthy waits until the daemon in the container answers.
func (m *machine) waitHealthy(what string) {
	m.t.Helper()
	harness.WaitFor(m.t, 90*time.Second, what, func() bool {
		_, err := m.run(m.t.Context(), "curl -fsS http://127.0.0.1:2378/v1/health")
		return err == nil
	})
}

// TestSystemdUnit: on a host where systemd runs, scripts/start-daemon.sh
// (install.sh's daemon step) installs scripts/berth.service, enables and
// starts it, and the daemon answers and runs sandboxes. As the unit
// promises: `systemctl restart` ends the daemon but not its sandboxes,
// which sit in cgroups of their own and the next daemon adopts; a daemon
// killed with SIGKILL is started again (Restart=on-failure); it logs to
// the journal; it starts at boot, and after a reboot (whose end took the
// sandboxes' processes) it reports the sandboxes failed with a reason
// rather than ready; `systemctl stop` with no sandbox left leaves nothing of its
// instance on the host. Nothing of the container is left afterwards.
func TestSystemdUnit(t *testing.T) {
	inst := requireContainerHost(t)
	m := newMachine(t)
	m.boot()

	out := m.mustRun("install -m 0755 /berth-bin/berth /berth-bin/berth-agent /usr/local/bin/ && install -m 0755 /berth-runsc /usr/local/bin/runsc && /src/scripts/start-daemon.sh")
	if !strings.Contains(out, "started by systemd") {
		t.Fatalf("start-daemon.sh under systemd said %q; want the daemon started by systemd", out)
	}
	if got := strings.TrimSpace(m.mustRun("systemctl is-enabled berth; systemctl is-active berth")); got != "enabled\nactive" {
		t.Fatalf("berth.service is %q; want enabled and active", got)
	}
	m.mustRun("berth template build minimal")
	// A sandbox at each isolation level.
	var ids []string
	for _, iso := range harness.Isolations() {
		id := strings.TrimSpace(m.mustRun("berth create --template minimal --isolation " + iso))
		if got := m.mustRun("berth exec " + id + " -- sh -c 'echo kept > /dev/shm/marker; echo hello'"); got != "hello\n" {
			t.Fatalf("exec in the %s sandbox = %q", iso, got)
		}
		ids = append(ids, id)
	}
	kept := func(when string) {
		t.Helper()
		for _, id := range ids {
			if got := m.mustRun("berth exec " + id + " -- cat /dev/shm/marker"); got != "kept\n" {
				t.Errorf("%s sandbox %s's memory file says %q; want it kept", when, id, got)
			}
		}
	}

	// A restart ends the daemon only; the sandbox's processes (its
	// in-memory /dev/shm) live on and the new daemon adopts them.
	mainPID := strings.TrimSpace(m.mustRun("systemctl show -p MainPID --value berth"))
	m.mustRun("systemctl restart berth")
	m.waitHealthy("the restarted daemon to answer")
	if again := strings.TrimSpace(m.mustRun("systemctl show -p MainPID --value berth")); again == mainPID {
		t.Errorf("systemctl restart kept the daemon's pid %s", mainPID)
	}
	kept("after systemctl restart")

	// SIGKILL: systemd starts it again (Restart=on-failure).
	m.mustRun("systemctl kill -s KILL --kill-whom=main berth")
	harness.WaitFor(t, 90*time.Second, "systemd to restart the killed daemon", func() bool {
		out, err := m.run(t.Context(), "systemctl show -p NRestarts --value berth; systemctl is-active berth")
		return err == nil && strings.TrimSpace(out) == "1\nactive"
	})
	m.waitHealthy("the daemon systemd restarted to answer")
	kept("after a SIGKILL and systemd's restart")
	if n := strings.Count(m.mustRun("journalctl -u berth -o cat --no-pager"), "msg=daemon_ready"); n != 3 {
		t.Errorf("the journal holds %d daemon_ready lines; want 3 (start, restart, restart after SIGKILL)", n)
	}

	// A reboot: the unit starts the daemon at boot; the sandbox's
	// processes ended with the old boot, which the daemon says.
	m.poweroff()
	m.boot()
	m.waitHealthy("the daemon to answer after a reboot")
	for _, id := range ids {
		var after struct{ State, Reason string }
		if err := json.Unmarshal([]byte(m.mustRun("berth inspect "+id)), &after); err != nil {
			t.Fatal(err)
		}
		t.Logf("after the reboot sandbox %s is %s: %s", id, after.State, after.Reason)
		if !strings.Contains(after.Reason, "ended while the daemon was down") {
			t.Errorf("after a reboot sandbox %s's reason is %q; want it to say its processes ended while the daemon was down", id, after.Reason)
		}
		if after.State == "ready" || after.Reason == "" {
			t.Errorf("after a reboot sandbox %s is %q (reason %q); want it no longer ready, with a reason", id, after.State, after.Reason)
		}
	}
	m.mustRun("berth kill " + strings.Join(ids, " "))
	m.mustRun("systemctl stop berth")
	if left := instanceCgroups(inst); len(left) > 0 {
		t.Errorf("after systemctl stop with no sandbox left, the instance's cgroups remain: %v", left)
	}
	m.poweroff()

	d := &harness.Daemon{DataDir: m.varLib, Instance: inst}
	for _, l := range harness.Leaks(d) {
		t.Errorf("leak after the container is gone: %s", l)
	}
	if left := instanceCgroups(inst); len(left) > 0 {
		t.Errorf("leak after the container is gone: cgroups %v", left)
	}
	if mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Dir(m.root))); err != nil || len(mounts) != 1 {
		t.Errorf("mounts under the test's dir once the container is gone: %d, %v; want its root's overlay only", len(mounts), err)
	}
}

// instanceCgroups lists the cgroup directories named after instance on
// this host, wherever in a hierarchy (a container's cgroup namespace puts
// them below its own cgroup).
func instanceCgroups(instance string) []string {
	var out []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(strings.TrimPrefix(path, "/sys/fs/cgroup"), "/") > 5 {
			return filepath.SkipDir
		}
		if d.Name() == "berth-"+instance {
			out = append(out, path)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// TestStartDaemonWithoutSystemd: where systemd does not run (a container,
// CI), scripts/start-daemon.sh starts the daemon in the background with
// its log file and pid file, and waits until it answers; the daemon runs
// a sandbox; stopped with SIGTERM after its sandbox is gone, it leaves
// nothing of its instance behind.
func TestStartDaemonWithoutSystemd(t *testing.T) {
	inst := requireContainerHost(t)
	m := newMachine(t)
	// No -b: the script is the container's only program, under nspawn's
	// minimal init, as in a container without systemd.
	script := writableCgroups + `
set -e
install -m 0755 /berth-bin/berth /berth-bin/berth-agent /usr/local/bin/
install -m 0755 /berth-runsc /usr/local/bin/runsc
/src/scripts/start-daemon.sh
berth template build minimal >/dev/null
id=$(berth create --template minimal)
echo "exec: $(berth exec "$id" -- echo hello)"
berth kill "$id"
pid=$(cat /var/lib/berth/berth.pid)
kill "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
echo "log: $(grep -c 'msg=daemon_ready' /var/log/berth/berth.log) ready, $(grep -c 'msg=daemon_stopping' /var/log/berth/berth.log) stopping"
`
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := m.nspawn(ctx, "--console=pipe", "--as-pid2", "/bin/bash", "-c", script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the container's script: %v\n%s", err, out)
	}
	got := string(out)
	t.Logf("%s", got)
	for _, want := range []string{"berth daemon started in the background", "exec: hello\n", "log: 1 ready, 1 stopping\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("the container's script said %q; want %q in it", got, want)
		}
	}
	d := &harness.Daemon{DataDir: m.varLib, Instance: inst}
	for _, l := range append(harness.Leaks(d), harness.StoppedLeaks(d)...) {
		t.Errorf("leak after the daemon stopped: %s", l)
	}
	if left := instanceCgroups(inst); len(left) > 0 {
		t.Errorf("leak after the daemon stopped: cgroups %v", left)
	}
}
