package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

func TestRestartAdoptsRunningSandboxes(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		sb := d.Create(t, client.CreateRequest{Isolation: iso})
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
		if last := evs[len(evs)-1]; last.Type != "adopted" {
			t.Errorf("last event = %+v, want adopted", last)
		}
		if err := d.Client.Kill(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		AssertNoLeaks(t, d)
	})
}

func TestRestartCleansBrokenSandboxes(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		sb := d.Create(t, client.CreateRequest{Isolation: iso})
		// Its init dies while the daemon is down: the restart must clean it
		// up and say why.
		d.Kill9()
		pid := sandboxInitPid(t, d, iso, sb.ID)
		p, _ := os.FindProcess(pid)
		p.Kill()
		d.Start()
		got, err := d.Client.Get(t.Context(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != client.StateFailed || got.Reason == "" {
			t.Errorf("after restart with a dead sandbox: state %s reason %q, want failed with a reason", got.State, got.Reason)
		}
		AssertNoLeaks(t, d)
	})
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	// A runtime that always fails: everything made before it must go.
	d := StartDaemon(t, "--runtime", "/bin/false")
	_, err := d.Client.Create(t.Context(), client.CreateRequest{Template: "minimal"})
	if err == nil {
		t.Fatal("create with a failing runtime succeeded")
	}
	sbs, _ := d.Client.List(t.Context(), client.ListOptions{})
	if len(sbs) != 1 || sbs[0].State != client.StateFailed || sbs[0].Reason == "" {
		t.Errorf("after failed create: %+v, want one failed sandbox with a reason", sbs)
	}
	AssertNoLeaks(t, d)
}

// TestAgentNeverReadyLeavesNothing fails a create after the network is
// attached and the egress services are up (an agent that exits at once):
// the create's undo stack must remove all of them, and the container.
func TestAgentNeverReadyLeavesNothing(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t, "--agent", agent)
	_, err := d.Client.Create(t.Context(), client.CreateRequest{Template: "minimal", Network: &client.NetworkPolicy{Mode: "allow", Allow: []string{"example.test"}}})
	if err == nil {
		t.Fatal("create with an agent that exits succeeded")
	}
	// The create fails as the agent exits, not at the ready timeout,
	// and says so.
	sbs, _ := d.Client.List(t.Context(), client.ListOptions{})
	if len(sbs) != 1 || sbs[0].State != client.StateFailed || !strings.Contains(sbs[0].Reason, "sandbox init exited before its agent answered") {
		t.Errorf("after failed create: %+v, want one failed sandbox whose reason is the agent's exit", sbs)
	}
	t.Logf("reason: %s", sbs[0].Reason)
	AssertNoLeaks(t, d)
}

func TestTwoDaemonsSideBySide(t *testing.T) {
	a := StartDaemon(t)
	b := StartDaemon(t)
	sa := a.Create(t, client.CreateRequest{})
	sbb := b.Create(t, client.CreateRequest{})
	if _, err := b.Client.Get(t.Context(), sa.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("daemon b sees daemon a's sandbox: %v", err)
	}
	MustRun(t, sa, "echo a > /tmp/who")
	MustRun(t, sbb, "echo b > /tmp/who")
	if err := a.Client.Kill(t.Context(), sa.ID); err != nil {
		t.Fatal(err)
	}
	if got := MustRun(t, sbb, "cat /tmp/who"); got != "b\n" {
		t.Errorf("b's sandbox after a's kill: %q", got)
	}
	AssertNoLeaks(t, a)
}

func TestIsolation(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})
	other := d.Create(t, client.CreateRequest{})
	status := MustRun(t, sb, "cat /proc/self/status")
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, want) {
			t.Errorf("/proc/self/status lacks %q", want)
		}
	}
	// uid 0 inside maps to an unprivileged host uid of the sandbox's own
	// range, above the canonical range (1000000..1065535) that owns the
	// template layers; the other sandbox has a different one.
	pid := MustAgentPid(t, d, sb.ID)
	uid := hostUID(t, pid)
	if uid < 1000000+65536 {
		t.Errorf("sandbox root is host uid %d, want one above the canonical range", uid)
	}
	if got := MustRun(t, sb, "cat /proc/self/uid_map"); strings.Join(strings.Fields(got), " ") != "0 "+itoa(uid)+" 65536" {
		t.Errorf("uid_map = %q, want 0 %d 65536", got, uid)
	}
	if o := hostUID(t, MustAgentPid(t, d, other.ID)); o == uid {
		t.Errorf("both sandboxes run as host uid %d", uid)
	}
	for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts", "user"} {
		host, _ := os.Readlink("/proc/self/ns/" + ns)
		box, _ := os.Readlink("/proc/" + itoa(pid) + "/ns/" + ns)
		if host == box || box == "" {
			t.Errorf("namespace %s: sandbox %q, host %q; want its own", ns, box, host)
		}
	}
	// Only its own processes are visible.
	ps := MustRun(t, sb, "ls /proc | grep -c '^[0-9]'")
	if n := atoi(strings.TrimSpace(ps)); n > 6 {
		t.Errorf("sandbox sees %d processes, want only its own few", n)
	}
	// Its /sys is its own: only its own interfaces, no host or
	// neighbour links (whose aliases would name other sandboxes).
	if got := MustRun(t, sb, "ls /sys/class/net | sort | tr '\\n' ' '"); got != "eth0 lo " {
		t.Errorf("/sys/class/net inside = %q, want only eth0 and lo", got)
	}
	// It cannot mount, and cannot see the other sandbox's files.
	if _, _, code := Run(t, sb, "mount -t tmpfs x /mnt"); code == 0 {
		t.Error("mount inside the sandbox succeeded")
	}
	MustRun(t, other, "echo private > /tmp/other-secret")
	if _, _, code := Run(t, sb, "cat /tmp/other-secret"); code == 0 {
		t.Error("one sandbox read another's file")
	}
	// Nothing leaves: a host service on all addresses is unreachable.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := itoa(ln.Addr().(*net.TCPAddr).Port)
	gw := strings.TrimSpace(MustRun(t, sb, "ip route 2>/dev/null | awk '/default/ {print $3}'; true"))
	targets := []string{"127.0.0.1"}
	if gw != "" {
		targets = append(targets, gw)
	}
	// Nor can it reach the other sandbox, even on its agent port.
	otherIP := strings.TrimSpace(MustRun(t, other, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"))
	if otherIP == "" {
		t.Fatal("no address on the other sandbox's eth0")
	}
	targets = append(targets, otherIP)
	for _, host := range targets {
		ports := []string{port, "49983"}
		if host == "127.0.0.1" {
			ports = ports[:1] // its own loopback, where its own agent listens
		}
		for _, p := range ports {
			if _, _, code := Run(t, sb, "timeout 3 nc -w 2 "+host+" "+p+" </dev/null"); code == 0 {
				t.Errorf("sandbox reached port %s on %s", p, host)
			}
		}
	}
}

func TestLimits(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		if iso == client.IsolationGVisor {
			// Disk: the same size-capped disk image, so writes hit
			// ENOSPC at the limit and the sandbox lives on, in /tmp
			// too (on the disk, as under runc, not a tmpfs in the
			// sentry's memory: runc.diskTmp), which disk usage shows.
			sb := d.Create(t, client.CreateRequest{Disk: "128M", Isolation: iso})
			MustRun(t, sb, "head -c 20000000 /dev/zero > /tmp/blob")
			got, err := d.Client.Get(t.Context(), sb.ID)
			if err != nil || got.Usage == nil || got.Usage.DiskUsedBytes < 20_000_000 {
				t.Errorf("disk usage after writing 20 MB to /tmp = %+v, %v; want at least 20 MB", got.Usage, err)
			}
			out, errOut, _ := Run(t, sb, "dd if=/dev/zero of=/tmp/fill bs=1M count=400 2>&1; echo rc=$?")
			if !strings.Contains(out+errOut, "No space left") {
				t.Errorf("filling a gvisor sandbox's disk through /tmp: %q %q, want ENOSPC", out, errOut)
			}
			MustRun(t, sb, "rm /tmp/fill; echo still alive")
			if err := d.Client.Kill(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			AssertNoLeaks(t, d)
			limitsGVisor(t, d)
			return
		}
		sb := d.Create(t, client.CreateRequest{Memory: "64M", Disk: "128M", Isolation: iso})
		neighbour := d.Create(t, client.CreateRequest{Isolation: iso})
		// Memory: a balloon is OOM-killed inside; the sandbox lives on.
		_, _, code := Run(t, sb, "head -c 300000000 /dev/zero | tail > /dev/null")
		if code == 0 {
			t.Error("a 300 MB allocation in a 64 MiB sandbox succeeded")
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		waitFor(t, time.Minute, "an oom event", func() bool {
			evs, _ := d.Client.Events(ctx, sb.ID)
			for _, e := range evs {
				if e.Type == "oom" {
					return true
				}
			}
			return false
		})
		MustRun(t, sb, "echo still alive")
		// Disk: writes hit ENOSPC at the limit.
		out, errOut, code := Run(t, sb, "dd if=/dev/zero of=/tmp/fill bs=1M count=400 2>&1; echo rc=$?")
		if !strings.Contains(out+errOut, "No space left") {
			t.Errorf("filling the disk: %q %q %d, want ENOSPC", out, errOut, code)
		}
		MustRun(t, sb, "rm /tmp/fill")
		// Pids: a fork bomb stays inside and the neighbour is unaffected.
		// Its output goes nowhere: bombs forked as timeout's signal
		// lands outlive it, and holding the exec's stdout they would
		// keep the exec open until they die. The default pids limit
		// was lowered to what 64 MiB holds (sandbox.fitPids: 256), so
		// the bomb meets it instead of filling the memory with tasks
		// that thrash (which starved the exec and the kill).
		if sb.PIDsLimit != 256 {
			t.Errorf("pids limit of a 64 MiB runc sandbox = %d, want 256 (one per 256 KiB)", sb.PIDsLimit)
		}
		Run(t, sb, "timeout 5 sh -c 'b() { b | b & }; b' >/dev/null 2>&1; true")
		MustRun(t, neighbour, "echo neighbour fine")
		got, err := d.Client.Get(t.Context(), sb.ID)
		if err != nil || got.Usage == nil || got.Usage.PIDs > got.PIDsLimit {
			t.Errorf("after the fork bomb: %+v %v, want at most %d pids", got.Usage, err, got.PIDsLimit)
		}
		// The bombed sandbox still dies cleanly, taking every process along.
		for _, id := range []string{sb.ID, neighbour.ID} {
			if err := d.Client.Kill(t.Context(), id); err != nil {
				t.Fatalf("kill %s after the fork bomb: %v", id, err)
			}
		}
		AssertNoLeaks(t, d)
	})
}

// limitsGVisor: under gVisor on ptrace (and kvm) the host's OOM killer
// sees one process, the sentry, holding all the sandbox's memory, so an
// out-of-memory sandbox dies whole (docs/security.md, gVisor): an exec
// streaming from it ends with "out of memory" instead of hanging, the
// daemon records why, and the neighbour is unaffected. On systrap each
// guest address space has a host stub process of its own, so the kernel
// may pick the balloon's stub (only the balloon dies, as under runc) or
// the sentry (the sandbox dies whole); either way an oom event says so.
// A fork bomb meets the sandbox's pids limit inside the sentry and the
// sandbox lives on; nothing leaks.
func limitsGVisor(t *testing.T, d *Daemon) {
	iso := client.IsolationGVisor
	sb := d.Create(t, client.CreateRequest{Memory: "64M", Isolation: iso})
	neighbour := d.Create(t, client.CreateRequest{Isolation: iso})
	done, _ := streamingExec(t, sb)
	code, err := sb.Exec(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "head -c 300000000 /dev/zero | tail > /dev/null"}})
	switch {
	case err == nil && code != 0 && gvisorPlatform(t, d) == "systrap":
		// The balloon alone was killed: the sandbox lives on, and the
		// monitor's sampling reports the kill.
		t.Logf("systrap: the balloon alone was killed (exit %d)", code)
		waitFor(t, time.Minute, "an oom event", func() bool {
			evs, _ := d.Client.Events(t.Context(), sb.ID)
			return slices.ContainsFunc(evs, func(e client.Event) bool { return e.Type == client.EventOOM })
		})
		MustRun(t, sb, "echo still alive")
		if err := d.Client.Kill(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	case !errors.Is(err, errdefs.ErrFailedPrecondition):
		t.Errorf("a 300 MB allocation in a 64 MiB gvisor sandbox = %d, %v; want failed_precondition (the sandbox died)", code, err)
	default:
		// The balloon's own exec ended with the sandbox, with an error.
		waitEnded(t, d, sb.ID, done, "out of memory")
		got, err := d.Client.Get(t.Context(), sb.ID)
		if err != nil || got.State != client.StateStopped || !strings.Contains(got.Reason, "out of memory") {
			t.Errorf("OOM-killed gvisor sandbox = %+v, %v; want stopped, reason out of memory", got, err)
		}
		evs, _ := d.Client.Events(t.Context(), sb.ID)
		if !slices.ContainsFunc(evs, func(e client.Event) bool { return e.Type == client.EventOOM }) {
			t.Errorf("events of the OOM-killed gvisor sandbox = %+v, want an oom event", evs)
		}
	}
	MustRun(t, neighbour, "echo neighbour fine")

	// A fork bomb meets the sandbox's own limit inside the sentry: the
	// agent kills every process it started, the exec ends with SIGKILL
	// and the reason in the work log, and the sandbox lives on. At the
	// default limit, which under gVisor fits the memory (one task per
	// 2 MiB, sandbox.fitPids: 256 in the default 512 MiB), so the bomb
	// meets the pids limit before the memory one; a limit asked above
	// that is refused, naming the field.
	if _, err := d.Client.Create(t.Context(), client.CreateRequest{Isolation: iso, PIDs: 1024}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "pids 1024") {
		t.Errorf("create gvisor with 1,024 pids in 512 MiB = %v; want invalid_argument naming pids", err)
	}
	bomb := d.Create(t, client.CreateRequest{Isolation: iso})
	b, err := d.Client.Get(t.Context(), bomb.ID)
	if err != nil || b.PIDsLimit != 256 {
		t.Fatalf("bomb sandbox = %+v, %v; want the default pids limit fitted to 512 MiB: 256", b, err)
	}
	limit := fmt.Sprintf("reached its limit of %d", b.PIDsLimit)
	code, err = bomb.Exec(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "b() { b | b & }; b; sleep 600"}})
	if err != nil || code != 137 {
		t.Errorf("fork bomb in a gvisor sandbox = %d, %v; want 137 (killed at the pids limit)", code, err)
	}
	MustRun(t, neighbour, "echo neighbour fine")
	if out := MustRun(t, bomb, "echo alive"); strings.TrimSpace(out) != "alive" {
		t.Errorf("exec after the fork bomb = %q, want alive", out)
	}
	b, err = d.Client.Get(t.Context(), bomb.ID)
	if err != nil || b.State != client.StateReady {
		t.Errorf("bombed gvisor sandbox = %+v, %v; want ready", b, err)
	}
	log, err := d.Client.Worklog(t.Context(), bomb.ID)
	if err != nil || !slices.ContainsFunc(log, func(e client.WorklogEntry) bool {
		return strings.Contains(e.Error, limit)
	}) {
		t.Errorf("work log of the bombed sandbox = %+v, %v; want an exec killed: %q", log, err, limit)
	}
	peak, _ := harness.CgroupInt(d.CgroupFile(bomb.ID, "pids", "pids.peak"))
	hostMax, _ := harness.CgroupInt(d.CgroupFile(bomb.ID, "pids", "pids.max"))
	t.Logf("host pids of the bombed gvisor sandbox: peak %d, limit %d", peak, hostMax)
	if err := d.Client.Kill(t.Context(), bomb.ID); err != nil {
		t.Fatalf("kill the bombed sandbox: %v", err)
	}
	if err := d.Client.Kill(t.Context(), neighbour.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// gvisorPlatform is the syscall platform the daemon's runsc runs on.
func gvisorPlatform(t *testing.T, d *Daemon) string {
	t.Helper()
	return isolationLevel(t, d, client.IsolationGVisor).Platform
}

// MustAgentPid returns the host pid of a sandbox's agent, from runc's state.
func MustAgentPid(t *testing.T, d *Daemon, id string) int {
	t.Helper()
	pid, err := agentPid(d, id)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// agentPid is the host pid of a runc sandbox's agent, from runc's state.
func agentPid(d *Daemon, id string) (int, error) {
	b, err := os.ReadFile(d.DataDir + "/runc/" + id + "/state.json")
	if err != nil {
		return 0, fmt.Errorf("runc state of %s: %w", id, err)
	}
	var st struct {
		Pid int `json:"init_process_pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		return 0, fmt.Errorf("runc state of %s: no init pid (%v)", id, err)
	}
	return st.Pid, nil
}

func TestConfigFile(t *testing.T) {
	cfg := t.TempDir() + "/berth.yaml"
	if err := os.WriteFile(cfg, []byte("pool: 198.19.240.0/20\ndefault_template: minimal\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t, "--config", cfg)
	sb := d.Create(t, client.CreateRequest{})
	ip := strings.TrimSpace(MustRun(t, sb, "ip -4 -o addr show eth0 | awk '{print $4}'"))
	if !strings.HasPrefix(ip, "198.19.24") && !strings.HasPrefix(ip, "198.19.25") {
		t.Errorf("sandbox address %q is outside the configured pool 198.19.240.0/20", ip)
	}
	// A config file with an unknown key is refused, naming it.
	bad := t.TempDir() + "/bad.yaml"
	os.WriteFile(bad, []byte("listne: 127.0.0.1:1\n"), 0o600)
	out, err := exec.Command(bin.Berth, "serve", "--config", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "listne") {
		t.Errorf("serve with an unknown config key = %v: %s", err, out)
	}
}

// sandboxInitPid is the host pid whose death ends the sandbox: runc's init
// (the agent), or under gVisor the sandbox process (the sentry), as
// `runsc state` reports it.
func sandboxInitPid(t *testing.T, d *Daemon, iso, id string) int {
	t.Helper()
	if iso != client.IsolationGVisor {
		return MustAgentPid(t, d, id)
	}
	out, err := exec.Command("runsc", "--root", filepath.Join(d.DataDir, "gvisor", "runsc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state %s = %s: %v", id, out, err)
	}
	return st.Pid
}
