package hostile

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestSandboxUIDs: every sandbox runs as its own host uid range, also
// across two daemons on one host, so a process of one sandbox that reached
// another's files or processes would meet the kernel's ordinary uid checks:
// it can neither read the other's private files nor signal its processes.
// Each check has a positive control run as the owner's own uid. No kernel
// key is charged to a sandbox uid (no session keyring per sandbox), and
// the keyring calls stay denied inside. A SIGKILLed and restarted daemon
// keeps every sandbox on its range.
func TestSandboxUIDs(t *testing.T) {
	l := newLab(t, client.CreateRequest{})
	other := harness.StartDaemon(t, bin)
	far := other.Create(t, client.CreateRequest{})

	attacker := sandboxUID(t, l.d, l.sb.ID)
	neighbour := sandboxUID(t, l.d, l.nb.ID)
	farUID := sandboxUID(t, other, far.ID)
	t.Logf("host uids: attacker %d, neighbour %d, other daemon's sandbox %d", attacker, neighbour, farUID)
	if attacker == neighbour || attacker == farUID || neighbour == farUID {
		t.Fatalf("sandboxes share a host uid: %d %d %d", attacker, neighbour, farUID)
	}
	for _, u := range []int{attacker, neighbour, farUID} {
		// The canonical range owns the template layers on disk; no
		// sandbox may run in it.
		if u < uidBase+uidCount {
			t.Errorf("sandbox host uid %d is in or below the canonical range %d..%d", u, uidBase, uidBase+uidCount-1)
		}
	}

	// Files: the neighbour's private file, seen from the host.
	harness.MustRun(t, l.nb, "echo private > /secret && chmod 600 /secret")
	secret := filepath.Join(l.d.DataDir, "sandboxes", l.nb.ID, "disk", "upper", "secret")
	if out, err := runAs(neighbour, "cat", secret); err != nil || strings.TrimSpace(out) != "private" {
		t.Fatalf("control: the neighbour's uid reads its own file: %q, %v", out, err)
	}
	if out, err := runAs(attacker, "cat", secret); err == nil {
		t.Errorf("the attacker's uid read the neighbour's private file: %q", out)
	}
	// Processes: signal 0 to the neighbour's agent.
	nbAgent := strconv.Itoa(sandboxPids(t, l.d, l.nb.ID)[0])
	if out, err := runAs(neighbour, "kill", "-0", nbAgent); err != nil {
		t.Fatalf("control: the neighbour's uid signals its own agent: %q, %v", out, err)
	}
	if out, err := runAs(attacker, "kill", "-0", nbAgent); err == nil {
		t.Errorf("the attacker's uid may signal the neighbour's agent: %q", out)
	}
	// Keys: nothing is charged to any sandbox uid, and the attacker
	// cannot make a keyring of its own.
	l.attack(t, "keyctl")
	users := harness.KeyUsers(t)
	for _, u := range []int{attacker, neighbour, farUID} {
		if users[u] {
			t.Errorf("host uid %d has kernel keys (/proc/key-users)", u)
		}
	}

	// A SIGKILLed daemon's successor keeps each sandbox on its range.
	l.d.Kill9()
	l.d.Start()
	if got := sandboxUID(t, l.d, l.nb.ID); got != neighbour {
		t.Errorf("after restart the neighbour runs as %d, want %d", got, neighbour)
	}
	harness.MustRun(t, l.nb, "cat /secret")
	if claims := harness.UIDClaims(l.d); len(claims) != 2 {
		t.Errorf("uid range claims after restart = %v, want 2", claims)
	}
	l.check(t)
}

// sandboxPids lists the host pids in a sandbox's pids cgroup; the first is
// its agent (the first process runc put there).
func sandboxPids(t *testing.T, d *harness.Daemon, id string) []int {
	t.Helper()
	for _, f := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		b, err := os.ReadFile(filepath.Join(f, "berth-"+d.Instance, id, "cgroup.procs"))
		if err != nil {
			continue
		}
		var pids []int
		for _, s := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(s); err == nil {
				pids = append(pids, p)
			}
		}
		if len(pids) > 0 {
			return pids
		}
	}
	t.Fatalf("no processes found for sandbox %s", id)
	return nil
}

// sandboxUID is the host uid of a sandbox's agent: its root's.
func sandboxUID(t *testing.T, d *harness.Daemon, id string) int {
	t.Helper()
	u, err := harness.ProcUID(sandboxPids(t, d, id)[0])
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// runAs runs a host command as uid (and gid) uid.
func runAs(uid int, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestForkBombKill: a sandbox whose pids limit a fork bomb keeps full is
// destroyed every time, through the API and through the CLI, with
// nothing left on the host. Its agent answers meanwhile: the bomb takes
// every task the limit allows, and a Go program that cannot make a thread
// when it needs one dies (the agent did, about once in twenty runs under
// a CPU hog, with the bomb's exec unanswered, while its threads counted
// in the workload's limit). The workload now has a cgroup of its own that
// the agent's threads are not in (runc on a cgroup v1 host: bombed checks
// it), or the agent made its threads at its start (agent.ReserveThreads).
func TestForkBombKill(t *testing.T) {
	d := harness.StartDaemon(t, bin)
	for i := range 4 {
		// Half a CPU: the bomb spins, and the host is shared.
		sb := d.Create(t, client.CreateRequest{CPU: 0.5})
		bombed(t, d, sb, fmt.Sprintf("round %d", i))
		if i%2 == 0 {
			if err := sb.Kill(t.Context()); err != nil {
				t.Fatalf("round %d: kill via API: %v", i, err)
			}
		} else if o, e, code := d.CLI(t, nil, "kill", sb.ID); code != 0 {
			t.Fatalf("round %d: berth kill: exit %d\n%s%s", i, code, o, e)
		}
		// The kernel removes a cgroup only once no task is left in it.
		if !d.CgroupGone(sb.ID) {
			t.Errorf("round %d: the bombed sandbox's cgroup outlived its kill", i)
		}
		harness.AssertNoLeaks(t, d)
	}
}

// TestForkBombMinimumLimit: at the smallest pids limit a sandbox may have
// (16), the agent runs a command and answers while a fork bomb fills the
// limit.
func TestForkBombMinimumLimit(t *testing.T) {
	d := harness.StartDaemon(t, bin)
	sb := d.Create(t, client.CreateRequest{CPU: 0.5, PIDs: 16})
	if got := harness.MustRun(t, sb, "echo ok"); got != "ok\n" {
		t.Fatalf("a command at pids 16 = %q", got)
	}
	bombed(t, d, sb, "pids 16")
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	harness.AssertNoLeaks(t, d)
}

// bombed starts a fork bomb in sb, waits until the kernel refuses it a
// fork at the sandbox's pids limit, and checks that the agent answers
// (a file read, which starts no process).
func bombed(t *testing.T, d *harness.Daemon, sb *client.Sandbox, what string) {
	t.Helper()
	got, err := d.Client.Get(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The bomb of the issue: processes fork pipelines of copies of
	// themselves as fast as they can, refilling the pids limit as it
	// frees up.
	if _, err := sb.Start(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "b() { while :; do b & done; }; b 2>/dev/null"}}); err != nil {
		t.Fatalf("%s: starting the bomb: %v", what, err)
	}
	events := d.WorkloadPidsFile(sb.ID, "pids.events")
	if events == "" {
		t.Fatalf("sandbox %s has no pids.events", sb.ID)
	}
	// The sandbox is full of bomb once the kernel reports refusing a
	// fork at the pids limit.
	harness.WaitFor(t, 2*time.Minute, "the kernel to refuse a fork at the pids limit (pids.events max > 0)", func() bool {
		n, err := harness.CgroupKV(events, "max")
		return err == nil && n > 0
	})
	n, _ := harness.CgroupInt(d.WorkloadPidsFile(sb.ID, "pids.current"))
	t.Logf("%s: %d processes (limit %d)", what, n, got.PIDsLimit)
	// Where the workload has a cgroup of its own, the agent is not in
	// it: no thread of the agent (the one process with tasks in the
	// sandbox's cgroup itself) is among the workload's.
	if harness.PidsV1() {
		outer := d.CgroupFile(sb.ID, "pids", "")
		work := d.CgroupFile(sb.ID, "pids", "workload")
		if work == "" {
			t.Fatalf("%s: no workload cgroup in %s on a cgroup v1 host", what, outer)
		}
		agent, err := harness.CgroupProcs(outer)
		if err != nil || len(agent) != 1 {
			t.Fatalf("%s: processes in the sandbox's own pids cgroup = %v, %v; want the agent alone", what, agent, err)
		}
		// (The bomb's refusals were counted in the workload cgroup's
		// events, above; its shells may all have died of them by now.)
		workload, err := harness.CgroupProcs(work)
		if err != nil || slices.Contains(workload, agent[0]) {
			t.Fatalf("%s: processes in the workload cgroup = %v, %v; want the bomb's, not the agent (%d)", what, workload, err, agent[0])
		}
	}
	var b bytes.Buffer
	if err := sb.ReadFile(t.Context(), "/etc/hostname", &b); err != nil || b.Len() == 0 {
		t.Fatalf("%s: the agent amid the bomb: read /etc/hostname = %q, %v", what, b.String(), err)
	}
}
