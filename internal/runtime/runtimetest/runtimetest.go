// Package runtimetest is the conformance suite every runtime backend
// passes: lifecycle, isolation, cleanup on failure and on destroy, recovery
// by a restarted daemon, and resource limits. A backend's test provides a
// Harness and calls Run; the leak checks (AssertNoLeaks) are exported for
// end-to-end tests too.
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/test/harness"
)

// Backend is what the suite drives: the runtime operations the Manager
// uses.
type Backend interface {
	Create(ctx context.Context, spec runtime.Spec) error
	Destroy(ctx context.Context, id string) error
	Inspect(ctx context.Context, id string) (runtime.State, error)
	List(ctx context.Context) ([]string, error)
	Stats(ctx context.Context, id string) (runtime.Stats, error)
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Instance is one backend under test plus what the suite needs to look
// behind it.
type Instance struct {
	Backend Backend
	// Reopen returns a second backend with the same configuration, as a
	// restarted daemon would build it.
	Reopen func(t *testing.T) Backend
	// Footprint says where the backend leaves traces on the host.
	Footprint Footprint
	// Exec runs argv inside sandbox id and returns its combined output.
	// Cases that need it are skipped when it is nil.
	Exec func(ctx context.Context, id string, argv ...string) ([]byte, error)
	// HostUID returns the host uid (and gid) sandbox id's root maps to.
	// Every sandbox must get its own.
	HostUID func(id string) (uint32, error)
	// HostPidIsInit says State.Pid is the sandbox's init as a host
	// process (containers), so the suite checks its credentials and
	// namespaces through /proc.
	HostPidIsInit bool
	// OOMKillsSandbox says an out-of-memory sandbox dies whole instead of
	// losing only its biggest process: under gVisor the host's OOM killer
	// sees one process (the sentry) holding all the sandbox's memory. The
	// suite then checks that the OOM is reported and the sandbox stopped.
	OOMKillsSandbox bool
	// OOMKillsEither says the host's OOM killer may take the sandbox whole
	// or only its biggest process, the kernel's pick (gVisor on systrap:
	// each guest address space is a stub process of its own, next to
	// the sentry). The suite then accepts either outcome.
	OOMKillsEither bool
	// ExecUnfiltered says Exec's processes do not descend from the agent
	// and do not carry its seccomp filter (runsc exec), so the suite
	// checks the agent's own filter instead of probing through Exec.
	ExecUnfiltered bool
	// PidsLimitGap, when set, says why the backend cannot yet keep a
	// sandbox alive at its pids limit; the pids cases are skipped with it.
	PidsLimitGap string
	// SetuidGap, when set, says why a set-user-ID program does not raise
	// a process even with Spec.AllowSetuid; SetuidContained then expects
	// no raise either way (the sandbox must still run).
	SetuidGap string
	// Checkpoints says the backend can checkpoint and restore; one that
	// cannot must refuse with ErrNotImplemented.
	Checkpoints bool
	// MountsGap, when set, says why the backend cannot bind
	// runtime.Spec.Mounts; the suite then expects them refused with
	// ErrNotImplemented.
	MountsGap string
	// UIDBase is the first host uid of the backend's canonical range, the
	// one layers and mount sources are owned by (runtime.Spec.Mounts).
	UIDBase uint32
}

// Harness builds backends and specs for the suite.
type Harness interface {
	// New returns a fresh backend with its own state directories.
	New(t *testing.T) Instance
	// Spec returns a valid spec for id. Its root filesystem must hold
	// busybox (see BusyboxLayer) and its agent must be the test agent
	// (see BuildAgent). Limits: DiskBytes 64 MiB, MemoryBytes 64 MiB,
	// PidsLimit 64 or thereabouts.
	Spec(t *testing.T, id string) runtime.Spec
}

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"Lifecycle", testLifecycle},
		{"AgentSecret", testAgentSecret},
		{"Isolation", testIsolation},
		{"Seccomp", testSeccomp},
		{"SetuidContained", testSetuidContained},
		{"AlreadyExists", testAlreadyExists},
		{"BadLayerLeavesNothing", testBadLayer},
		{"FailingStartLeavesNothing", testFailingStart},
		{"FailingExecLeavesNothing", testFailingExec},
		{"FailingHookLeavesNothing", testFailingHook},
		{"JoinNetNS", testJoinNetNS},
		{"Recover", testRecover},
		{"DestroyKillsEscapedProcesses", testEscaped},
		{"PauseResume", testPauseResume},
		{"DiskLimit", testDiskLimit},
		{"MemoryLimit", testMemoryLimit},
		{"PidsLimit", testPidsLimit},
		{"DistinctUIDs", testDistinctUIDs},
		{"DestroyForkBomb", testDestroyForkBomb},
		{"CheckpointRestore", testCheckpointRestore},
		{"StopStart", testStopStart},
		{"CheckpointStopRestore", testCheckpointStopRestore},
		{"PrepareRestore", testPrepareRestore},
		{"CutShortImage", testCutShortImage},
		{"CheckpointLiveCopy", testCheckpointLiveCopy},
		{"Mounts", testMounts},
		{"RootFiles", testRootFiles},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
	}
}

// NewID returns a fresh sandbox ID.
func NewID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "rt" + hex.EncodeToString(b)
}

// start creates a sandbox and registers its destruction.
func start(t *testing.T, h Harness, inst Instance) (string, runtime.Spec) {
	t.Helper()
	id := NewID()
	spec := h.Spec(t, id)
	create(t, inst, spec)
	return id, spec
}

// create creates sandbox spec on inst, destroyed when the test ends.
func create(t *testing.T, inst Instance, spec runtime.Spec) {
	t.Helper()
	t0 := time.Now()
	if err := inst.Backend.Create(t.Context(), spec); err != nil {
		t.Fatalf("Create(%s) = %v", spec.ID, err)
	}
	t.Logf("Create took %v", time.Since(t0))
	t.Cleanup(func() {
		if err := inst.Backend.Destroy(context.Background(), spec.ID); err != nil {
			t.Errorf("cleanup Destroy(%s) = %v", spec.ID, err)
		}
	})
}

func testLifecycle(t *testing.T, h Harness) {
	inst := h.New(t)
	b, ctx := inst.Backend, t.Context()
	id, spec := start(t, h, inst)

	st, err := b.Inspect(ctx, id)
	if err != nil || st.Status != runtime.StatusRunning || st.Pid <= 0 || st.ID != id {
		t.Fatalf("Inspect = %+v, %v; want running with a pid", st, err)
	}
	ids, err := b.List(ctx)
	if err != nil || !slices.Contains(ids, id) {
		t.Errorf("List = %v, %v; want it to contain %s", ids, err, id)
	}
	// The agent may still be starting; poll until it has used some CPU.
	var s runtime.Stats
	harness.WaitFor(t, 60*time.Second, "non-zero stats", func() bool {
		s, err = b.Stats(ctx, id)
		return err == nil && s.CPUUsage > 0 && s.MemoryBytes > 0 && s.PidsCurrent > 0
	})
	if err != nil {
		t.Fatalf("Stats = %v", err)
	}
	if s.MemoryLimit != spec.MemoryBytes || s.DiskBytes != spec.DiskBytes || s.DiskUsedBytes <= 0 {
		t.Errorf("Stats = %+v; want memory limit %d, disk %d, some disk used", s, spec.MemoryBytes, spec.DiskBytes)
	}
	if s.OOMKills != 0 {
		t.Errorf("Stats.OOMKills = %d, want 0", s.OOMKills)
	}

	if err := b.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	assertGone(t, inst, id)
	if err := b.Destroy(ctx, id); err != nil {
		t.Errorf("second Destroy = %v, want nil", err)
	}
	if _, err := b.Stats(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stats after Destroy = %v, want ErrNotFound", err)
	}
}

// testAgentSecret: the agent gets its secret (runtime.Spec.AgentSecret)
// intact, and the environment its process started with, which the host
// shows in /proc/<pid>/environ, does not hold it where the runtime hands
// it over through a pipe (runc, a runsc with --pass-fd; the environment
// runsc's sandbox process started with is the host-side one, never the
// sandbox's), nor does the sandbox's own /proc/1/environ then.
func testAgentSecret(t *testing.T, h Harness) {
	inst := h.New(t)
	ctx := t.Context()
	id := NewID()
	spec := h.Spec(t, id)
	value := "s3cret-" + id
	spec.AgentArgs = []string{"secret", "/secret"}
	spec.AgentSecret = runtime.Secret{Name: "TEST_SECRET", Value: value, FDName: "TEST_SECRET_FD"}
	create(t, inst, spec)
	var got string
	harness.WaitFor(t, 30*time.Second, "the agent to write its secret", func() bool {
		out, err := inst.Exec(ctx, id, "/bin/cat", "/secret")
		got = string(out)
		return err == nil && strings.HasSuffix(got, "\n")
	})
	if got != value+"\n" {
		t.Errorf("the agent got secret %q, want %q", got, value)
	}
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", st.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), value) {
		t.Errorf("the secret is in the environment the sandbox's process %d started with", st.Pid)
	}
	// Inside, where the sandbox's kernel serves /proc/1/environ (gVisor's
	// sentry, to every process of the agent's uid): a runtime that hands
	// the secret over by descriptor leaves it out there too.
	inside, err := inst.Exec(ctx, id, "/bin/cat", "/proc/1/environ")
	if err != nil {
		t.Fatalf("read /proc/1/environ inside: %v", err)
	}
	if strings.Contains(string(inside), "TEST_SECRET_FD=") && strings.Contains(string(inside), value) {
		t.Errorf("the secret came by descriptor and is in the sandbox's /proc/1/environ too")
	}
	t.Logf("handed over by descriptor: %v", strings.Contains(string(inside), "TEST_SECRET_FD="))
}

// assertGone checks that id is gone from the backend and the host.
func assertGone(t *testing.T, inst Instance, id string) {
	t.Helper()
	ctx := t.Context()
	if st, err := inst.Backend.Inspect(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Inspect after Destroy = %+v, %v; want ErrNotFound", st, err)
	}
	if ids, err := inst.Backend.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Errorf("List after Destroy = %v, %v; want no %s", ids, err, id)
	}
	AssertNoLeaks(t, inst.Footprint, id)
}

func testIsolation(t *testing.T, h Harness) {
	inst := h.New(t)
	if !inst.HostPidIsInit && inst.Exec == nil {
		t.Skip("backend's pid is not the sandbox init and harness has no Exec")
	}
	id, spec := start(t, h, inst)
	if inst.HostPidIsInit {
		checkInitProcess(t, inst, id)
	}
	if inst.Exec == nil {
		return
	}
	// The agent writes its marker once it runs, which under load may be
	// after Create returned.
	harness.WaitFor(t, 30*time.Second, "the agent's marker", func() bool {
		out, err := inst.Exec(t.Context(), id, "/bin/cat", "/tmp/agent-started")
		return err == nil && strings.Contains(string(out), "ok")
	})
	// One stream (exec 2>&1): stdout and stderr are separate pipes, and
	// under load the shell's error lines could overtake the first lines.
	out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", "exec 2>&1; hostname; id -u; cat /etc/hosts; cat /tmp/agent-started; "+
		"echo x > /sys/x && echo WROTE-sys; [ -e /sys/x ] && echo EXISTS-sys; "+
		"echo berthx > /proc/sys/kernel/domainname && echo WROTE-domainname; echo domainname=$(cat /proc/sys/kernel/domainname); true")
	t.Logf("inside:\n%s", out)
	if err != nil {
		t.Fatalf("exec = %v", err)
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) < 2 || lines[0] != spec.Hostname || lines[1] != "0" {
		t.Errorf("hostname, uid inside = %q; want %s, 0", lines[:2], spec.Hostname)
	}
	if !strings.Contains(string(out), spec.Hostname) || !strings.Contains(string(out), "ok") {
		t.Errorf("hosts file or agent marker missing inside:\n%s", out)
	}
	// The effect, not the error text: runc says EROFS for both; gVisor's
	// 2022 release refuses the /proc/sys open (EPERM), later ones take
	// the open (root's CAP_DAC_OVERRIDE) and fail the write (EIO, a
	// read-only file). Either way nothing may change.
	if s := string(out); strings.Contains(s, "WROTE-") || strings.Contains(s, "EXISTS-sys") || strings.Contains(s, "domainname=berthx") {
		t.Errorf("/sys or /proc/sys writable inside:\n%s", out)
	}
}

// checkInitProcess checks the sandbox's init as a host process: its host
// uid is the sandbox's own, not root; no new privileges, seccomp on, no
// dangerous capabilities, and no namespace shared with the host.
func checkInitProcess(t *testing.T, inst Instance, id string) {
	t.Helper()
	st, err := inst.Backend.Inspect(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	status := procStatus(t, st.Pid)
	hostUID, err := inst.HostUID(id)
	if err != nil {
		t.Fatal(err)
	}
	if hostUID == 0 {
		t.Fatalf("sandbox %s root is host root", id)
	}
	uid := fmt.Sprint(hostUID)
	for _, key := range []string{"Uid", "Gid"} {
		if f := strings.Fields(status[key]); len(f) != 4 || slices.ContainsFunc(f, func(s string) bool { return s != uid }) {
			t.Errorf("%s of init = %q, want all %s", key, status[key], uid)
		}
	}
	want := map[string]string{"NoNewPrivs": "1", "Seccomp": "2"}
	for k, v := range want {
		if status[k] != v {
			t.Errorf("%s of init = %q, want %q", k, status[k], v)
		}
	}
	var bnd uint64
	if _, err := fmt.Sscanf(status["CapBnd"], "%x", &bnd); err != nil {
		t.Fatalf("CapBnd %q: %v", status["CapBnd"], err)
	}
	const capMknod, capNetRaw, capSysAdmin = 27, 13, 21
	for _, c := range []uint{capMknod, capNetRaw, capSysAdmin} {
		if bnd&(1<<c) != 0 {
			t.Errorf("CapBnd %s has capability %d", status["CapBnd"], c)
		}
	}
	for _, ns := range []string{"mnt", "pid", "ipc", "uts", "user", "net", "cgroup"} {
		host, err1 := os.Readlink("/proc/self/ns/" + ns)
		sb, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", st.Pid, ns))
		if err1 != nil || err2 != nil {
			t.Errorf("read ns %s: %v %v", ns, err1, err2)
			continue
		}
		if host == sb {
			t.Errorf("sandbox shares the host's %s namespace (%s)", ns, sb)
		}
	}
}

func testSeccomp(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	id, _ := start(t, h, inst)
	if inst.ExecUnfiltered {
		// The agent (pid 1 inside) carries the filter; everything the
		// product runs descends from it.
		out, err := inst.Exec(t.Context(), id, "/bin/cat", "/proc/1/status")
		if err != nil || !strings.Contains(string(out), "Seccomp:\t2") {
			t.Errorf("agent's /proc/1/status = %v:\n%s\nwant Seccomp: 2", err, out)
		}
		return
	}
	out, err := inst.Exec(t.Context(), id, "/.berth/berth-agent", "probe")
	if err != nil {
		t.Fatalf("probe = %v: %s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	const ok, eperm, enosys = "0", "1", "38"
	want := map[string]string{
		"unshare_none":    ok, // the CLONE_NEWUSER filter is not a blanket ban
		"unshare_user":    eperm,
		"clone3":          enosys, // so libc falls back to the filterable clone
		"socket_tcp":      ok,
		"socket_packet":   eperm,
		"socket_raw":      eperm,
		"mount":           eperm,
		"keyctl":          eperm,
		"bpf":             eperm,
		"io_uring_setup":  eperm,
		"userfaultfd":     eperm,
		"setns":           eperm, // EBADF if unfiltered
		"ptrace":          eperm,
		"perf_event_open": eperm,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("inside the sandbox %s returned %q, want %q", k, got[k], v)
		}
	}
}

func testAlreadyExists(t *testing.T, h Harness) {
	inst := h.New(t)
	id, spec := start(t, h, inst)
	if err := inst.Backend.Create(t.Context(), spec); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Create(%s) = %v, want ErrAlreadyExists", id, err)
	}
	if st, err := inst.Backend.Inspect(t.Context(), id); err != nil || st.Status != runtime.StatusRunning {
		t.Errorf("Inspect after duplicate Create = %+v, %v; want running", st, err)
	}
}

func testBadLayer(t *testing.T, h Harness) {
	inst := h.New(t)
	id := NewID()
	spec := h.Spec(t, id)
	spec.Layers = append(spec.Layers, filepath.Join(t.TempDir(), "missing"))
	if err := inst.Backend.Create(t.Context(), spec); err == nil {
		_ = inst.Backend.Destroy(context.Background(), id)
		t.Fatal("Create with a missing layer succeeded")
	} else {
		t.Logf("Create error: %v", err)
	}
	assertGone(t, inst, id)
}

func testFailingStart(t *testing.T, h Harness) {
	inst := h.New(t)
	id := NewID()
	spec := h.Spec(t, id)
	// Passes validation, fails late: the runtime cannot join a network
	// namespace that does not exist, after the rootfs is all set up.
	spec.NetNSPath = filepath.Join(t.TempDir(), "no-such-netns")
	err := inst.Backend.Create(t.Context(), spec)
	if err == nil {
		_ = inst.Backend.Destroy(context.Background(), id)
		t.Fatal("Create with a missing netns succeeded")
	}
	t.Logf("Create error: %v", err)
	assertGone(t, inst, id)
}

func testFailingExec(t *testing.T, h Harness) {
	inst := h.New(t)
	id := NewID()
	spec := h.Spec(t, id)
	// Fails as late as possible: namespaces and cgroups exist, and the
	// agent cannot be executed.
	bad := filepath.Join(t.TempDir(), "not-a-binary")
	if err := os.WriteFile(bad, []byte("not a program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	spec.AgentPath = bad
	err := inst.Backend.Create(t.Context(), spec)
	if err == nil {
		_ = inst.Backend.Destroy(context.Background(), id)
		t.Fatal("Create with a non-executable agent succeeded")
	}
	t.Logf("Create error: %v", err)
	assertGone(t, inst, id)
}

// testFailingHook: a BeforeStart hook that fails fails the create with
// its error and leaves nothing, whether or not the runtime started the
// agent meanwhile (runc starts it while the hook runs).
func testFailingHook(t *testing.T, h Harness) {
	inst := h.New(t)
	id := NewID()
	spec := h.Spec(t, id)
	spec.BeforeStart = func(context.Context, int) error { return errors.New("wiring refused") }
	err := inst.Backend.Create(t.Context(), spec)
	if err == nil {
		_ = inst.Backend.Destroy(context.Background(), id)
		t.Fatal("Create with a failing BeforeStart hook succeeded")
	}
	if !strings.Contains(err.Error(), "wiring refused") {
		t.Errorf("Create error = %v, want the hook's", err)
	}
	assertGone(t, inst, id)
}

func testJoinNetNS(t *testing.T, h Harness) {
	inst := h.New(t)
	ipBin, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("ip (iproute2) not installed")
	}
	id := NewID()
	name := "berth-" + id
	if out, err := exec.Command(ipBin, "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ipBin, "netns", "del", name).Run() })
	spec := h.Spec(t, id)
	spec.NetNSPath = "/run/netns/" + name
	if err := inst.Backend.Create(t.Context(), spec); err != nil {
		t.Fatalf("Create with netns = %v", err)
	}
	t.Cleanup(func() { _ = inst.Backend.Destroy(context.Background(), id) })
	if inst.HostPidIsInit {
		st, err := inst.Backend.Inspect(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		var want, got unix.Stat_t
		if err := unix.Stat(spec.NetNSPath, &want); err != nil {
			t.Fatal(err)
		}
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &got); err != nil {
			t.Fatal(err)
		}
		if want.Ino != got.Ino || want.Dev != got.Dev {
			t.Errorf("sandbox netns inode %d, want the joined one %d", got.Ino, want.Ino)
		}
		// Look through the sandbox's root from the host: runc 1.1's exec
		// cannot join a host-owned netns after the user namespace.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/sys/class/net/lo", st.Pid)); err != nil {
			t.Errorf("sandbox /sys does not show its netns: %v", err)
		}
	}
	if err := inst.Backend.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	assertGone(t, inst, id)
}

func testRecover(t *testing.T, h Harness) {
	inst := h.New(t)
	id, _ := start(t, h, inst)
	st1, err := inst.Backend.Inspect(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	b2 := inst.Reopen(t)
	ids, err := b2.List(t.Context())
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("restarted List = %v, %v; want %s", ids, err, id)
	}
	st2, err := b2.Inspect(t.Context(), id)
	if err != nil || st2 != st1 {
		t.Errorf("restarted Inspect = %+v, %v; want %+v", st2, err, st1)
	}
	if _, err := b2.Stats(t.Context(), id); err != nil {
		t.Errorf("restarted Stats = %v", err)
	}
	if err := b2.Destroy(t.Context(), id); err != nil {
		t.Fatalf("restarted Destroy = %v", err)
	}
	assertGone(t, inst, id)
}

func testEscaped(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	id, _ := start(t, h, inst)
	// A session leader in the background, reparented away from the
	// process that started it.
	if out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", "setsid sh -c 'sleep 1000 & sleep 1000' >/dev/null 2>&1 &"); err != nil {
		t.Fatalf("exec = %v: %s", err, out)
	}
	// At least the agent and the two sleeps (a backend may count threads,
	// which only adds).
	var last runtime.Stats
	var lastErr error
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last stats: %+v, %v", last, lastErr)
		}
	})
	harness.WaitFor(t, 60*time.Second, "escaped processes running", func() bool {
		last, lastErr = inst.Backend.Stats(t.Context(), id)
		return lastErr == nil && last.PidsCurrent >= 3
	})
	if err := inst.Backend.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	assertGone(t, inst, id)
}

func testPauseResume(t *testing.T, h Harness) {
	inst := h.New(t)
	b, ctx := inst.Backend, t.Context()
	id, _ := start(t, h, inst)
	if err := b.Pause(ctx, id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	if st, err := b.Inspect(ctx, id); err != nil || st.Status != runtime.StatusPaused {
		t.Errorf("Inspect after Pause = %+v, %v; want paused", st, err)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	if st, err := b.Inspect(ctx, id); err != nil || st.Status != runtime.StatusRunning {
		t.Errorf("Inspect after Resume = %+v, %v; want running", st, err)
	}
	if err := b.Pause(ctx, "nosuchsandbox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Pause(unknown) = %v, want ErrNotFound", err)
	}
	// A paused sandbox must still be destroyable.
	if err := b.Pause(ctx, id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy paused = %v", err)
	}
	assertGone(t, inst, id)
}

func testDiskLimit(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	id, spec := start(t, h, inst)
	out, err := inst.Exec(t.Context(), id, "/.berth/berth-agent", "fill", "/fill")
	if err != nil || !strings.Contains(string(out), "ENOSPC") {
		t.Fatalf("fill = %v: %s; want ENOSPC", err, out)
	}
	s, err := inst.Backend.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if s.DiskUsedBytes < spec.DiskBytes*8/10 || s.DiskUsedBytes > spec.DiskBytes {
		t.Errorf("disk used %d of %d after filling", s.DiskUsedBytes, spec.DiskBytes)
	}
	if st, err := inst.Backend.Inspect(t.Context(), id); err != nil || st.Status != runtime.StatusRunning {
		t.Errorf("Inspect after fill = %+v, %v; want running", st, err)
	}
	// Space comes back once the file is gone.
	if out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", "rm /fill && echo ok > /after && cat /after"); err != nil || !strings.Contains(string(out), "ok") {
		t.Errorf("write after freeing space = %v: %s", err, out)
	}
}

func testMemoryLimit(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	id, _ := start(t, h, inst)
	out, err := inst.Exec(t.Context(), id, "/.berth/berth-agent", "hog")
	if err == nil {
		t.Fatalf("memory hog exited cleanly: %s", out)
	}
	var s runtime.Stats
	harness.WaitFor(t, 60*time.Second, "an OOM kill in stats", func() bool {
		s, err = inst.Backend.Stats(t.Context(), id)
		return err == nil && s.OOMKills > 0
	})
	// The kernel may force a charge past the limit while it OOM-kills (charges
	// that must not fail, e.g. page tables of the dying task): cgroup v1's
	// max_usage_in_bytes was seen one page over. Allow 1 %, far below what an
	// unenforced limit would show (the hog allocates without bound).
	if slack := s.MemoryLimit / 100; s.MemoryMax > s.MemoryLimit+slack {
		t.Errorf("peak memory %d over limit %d (+%d slack)", s.MemoryMax, s.MemoryLimit, slack)
	}
	want := runtime.StatusRunning
	if inst.OOMKillsSandbox {
		want = runtime.StatusStopped
	}
	st, err := inst.Backend.Inspect(t.Context(), id)
	switch {
	case err == nil && inst.OOMKillsEither && (st.Status == runtime.StatusRunning || st.Status == runtime.StatusStopped):
		t.Logf("after the OOM the sandbox is %s (the kernel's pick)", st.Status)
	case err != nil || st.Status != want:
		t.Errorf("Inspect after OOM = %+v, %v; want %s", st, err, want)
	}
}

func testPidsLimit(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	if inst.PidsLimitGap != "" {
		t.Skip(inst.PidsLimitGap)
	}
	id, spec := start(t, h, inst)
	if spec.PidsLimit <= 0 {
		t.Skip("spec has no pids limit")
	}
	// Fork well past the limit; the shell reports failed forks and goes on.
	// Its stdio is detached so the background sleepers do not hold the
	// exec's output open.
	script := fmt.Sprintf("(i=0; while [ $i -lt %d ]; do sleep 1000 & i=$((i+1)); done) >/dev/null 2>&1; echo done", 2*spec.PidsLimit)
	out, _ := inst.Exec(t.Context(), id, "/bin/sh", "-c", script)
	t.Logf("fork bomb: %s", out)
	s, err := inst.Backend.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if s.PidsCurrent > spec.PidsLimit || s.PidsCurrent < spec.PidsLimit/2 {
		t.Errorf("pids current %d with limit %d after fork bomb", s.PidsCurrent, spec.PidsLimit)
	}
	if st, err := inst.Backend.Inspect(t.Context(), id); err != nil || st.Status != runtime.StatusRunning {
		t.Errorf("Inspect after fork bomb = %+v, %v; want running", st, err)
	}
	if err := inst.Backend.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	assertGone(t, inst, id)
}

// procStatus parses /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}

// testSetuidContained: with Spec.AllowSetuid a set-user-ID program raises
// a uid-1000 process to the sandbox's root, and no further: as the host
// sees it, that process runs as the sandbox's own host uid (never 0), under
// the same seccomp filter and bounding set as the agent. Without it
// (every other case checks no_new_privs on the init) the same program
// stays uid 1000.
func testSetuidContained(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprint("allow=", allow), func(t *testing.T) {
			// A backend with a gap still runs the sandbox; the program
			// just does not raise.
			raises := allow && inst.SetuidGap == ""
			if allow && !raises {
				t.Log(inst.SetuidGap)
			}
			id := NewID()
			spec := h.Spec(t, id)
			spec.AllowSetuid = allow
			if err := inst.Backend.Create(t.Context(), spec); err != nil {
				t.Fatalf("Create(%s) = %v", id, err)
			}
			t.Cleanup(func() {
				if err := inst.Backend.Destroy(context.Background(), id); err != nil {
					t.Errorf("cleanup Destroy(%s) = %v", id, err)
				}
			})
			var hostUID uint32
			var initPid int
			if inst.HostPidIsInit {
				st, err := inst.Backend.Inspect(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				initPid = st.Pid
				status := procStatus(t, st.Pid)
				wantNNP := "1"
				if allow {
					wantNNP = "0"
				}
				if status["NoNewPrivs"] != wantNNP || status["Seccomp"] != "2" {
					t.Errorf("init NoNewPrivs %q Seccomp %q, want %s and 2", status["NoNewPrivs"], status["Seccomp"], wantNNP)
				}
				if hostUID, err = inst.HostUID(id); err != nil || hostUID == 0 {
					t.Fatalf("HostUID = %d, %v", hostUID, err)
				}
			}
			done := make(chan execResult, 1)
			go func() {
				out, err := inst.Exec(context.WithoutCancel(t.Context()), id, "/.berth/berth-agent", "raise")
				done <- execResult{out, err}
			}()
			if inst.HostPidIsInit {
				p := waitRaised(t, initPid, done)
				// Uid: real, effective, saved, filesystem.
				want := fmt.Sprintf("%d %d %d %d", hostUID+1000, hostUID+1000, hostUID+1000, hostUID+1000)
				if allow {
					want = fmt.Sprintf("%d %d %d %d", hostUID+1000, hostUID, hostUID, hostUID)
				}
				if p["Uid"] != want {
					t.Errorf("raised process's host Uid = %q, want %q", p["Uid"], want)
				}
				if p["Seccomp"] != "2" {
					t.Errorf("raised process's Seccomp = %q, want 2", p["Seccomp"])
				}
				var bnd uint64
				if _, err := fmt.Sscanf(p["CapBnd"], "%x", &bnd); err != nil {
					t.Fatalf("CapBnd %q: %v", p["CapBnd"], err)
				}
				const capMknod, capNetRaw, capSysAdmin = 27, 13, 21
				for _, c := range []uint{capMknod, capNetRaw, capSysAdmin} {
					if bnd&(1<<c) != 0 {
						t.Errorf("raised process's CapBnd %s has capability %d", p["CapBnd"], c)
					}
				}
			}
			// Without a host view, the FIFO's appearing says the raised
			// process is about to hold. Opening it for writing, without
			// writing, releases it (a write could meet a reader already
			// gone: SIGPIPE).
			if out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", "i=0; while [ ! -p /tmp/hold ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; : > /tmp/hold"); err != nil {
				t.Fatalf("release: %v: %s", err, out)
			}
			var r execResult
			select {
			case r = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the raised process did not end once released")
			}
			want := "ruid=1000 euid=1000"
			if raises {
				want = "ruid=1000 euid=0"
			}
			if r.err != nil || !strings.Contains(string(r.out), want) {
				t.Errorf("raise = %v: %q, want %q", r.err, r.out, want)
			}
		})
	}
}

// execResult is what an Exec returned.
type execResult struct {
	out []byte
	err error
}

// waitRaised finds the host process of the agent's "raised" mode in the
// sandbox whose init is initPid and returns its /proc status.
func waitRaised(t *testing.T, initPid int, done <-chan execResult) map[string]string {
	t.Helper()
	initNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", initPid))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, p := range harness.Procs(func(p harness.Proc) bool { return strings.HasPrefix(p.Cmdline, "/tmp/raise raised") }) {
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.PID)); err == nil && ns == initNS {
				return procStatus(t, p.PID)
			}
		}
		select {
		case r := <-done:
			t.Fatalf("raise ended before the host saw it: %v: %s", r.err, r.out)
		case <-time.After(50 * time.Millisecond): // polling /proc: a process's start sends no event
		}
	}
	t.Fatal("the raised process never appeared")
	return nil
}
