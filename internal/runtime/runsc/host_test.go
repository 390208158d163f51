package runsc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
	th "github.com/berth-sandbox/berth/test/harness"
)

// TestHostProcesses: what a gVisor sandbox runs on the host never runs as
// host root, nor as any uid but nobody or the sandbox's own. The sentry
// (State.Pid) and its platform's stubs (the rest of the sandbox's cgroup)
// run in a user namespace of their own: as nobody on a runsc that reaches
// files only through the gofer (2022), as the sandbox's root uid on one
// with directfs, where the sentry opens the sandbox's files itself
// (2023+). The gofer (which runsc may place in the cgroup too) runs as the
// sandbox's own host uid. After Destroy none is left.
func TestHostProcesses(t *testing.T) {
	h := newHarness(t)
	inst := h.New(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	if err := inst.Backend.Create(ctx, h.Spec(t, id)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	slotUID, err := inst.HostUID(id)
	if err != nil || slotUID == 0 {
		t.Fatalf("HostUID = %d, %v", slotUID, err)
	}
	if uid := procUID(t, st.Pid); uid != nobody && uid != int(slotUID) {
		t.Errorf("sentry (pid %d) runs as host uid %d, want %d (nobody) or the sandbox's %d", st.Pid, uid, nobody, slotUID)
	}
	// The sentry shares the host's pid namespace (the sandbox's pid
	// namespace is the sentry's own, in Go); the rest are its own.
	for _, ns := range []string{"user", "mnt", "net", "ipc", "uts"} {
		host, _ := os.Readlink("/proc/self/ns/" + ns)
		sb, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", st.Pid, ns))
		if err != nil || sb == host {
			t.Errorf("sentry %s namespace = %q, %v; want its own", ns, sb, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", inst.Footprint.CgroupParent, id, "cgroup.procs")); err == nil {
		for _, p := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(p)
			if uid := procUID(t, pid); uid != nobody && uid != int(slotUID) {
				t.Errorf("process %d in the sandbox's cgroup runs as host uid %d, want %d or %d", pid, uid, nobody, slotUID)
			}
		}
	}
	gofer := goferPid(t, inst.Footprint.RuncRoot, id)
	if uid := procUID(t, gofer); uid != int(slotUID) {
		t.Errorf("gofer (pid %d) runs as host uid %d, want the sandbox's %d", gofer, uid, slotUID)
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{st.Pid, gofer} {
		if running(pid) {
			t.Errorf("process %d still alive after Destroy", pid)
		}
	}
}

// running reports whether pid exists and is not a zombie. Destroy kills;
// reaping the sentry and the gofer is up to whoever they were reparented
// to (init), which may take its time.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

const nobody = 65534

// goferPid reads the gofer's pid from runsc's state file of id.
func goferPid(t *testing.T, root, id string) int {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(root, id+"_sandbox:*.state"))
	if len(m) != 1 {
		t.Fatalf("runsc state files of %s: %v", id, m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GoferPid int `json:"goferPid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.GoferPid <= 0 {
		t.Fatalf("gofer pid in %s: %d, %v", m[0], st.GoferPid, err)
	}
	return st.GoferPid
}

// TestBeforeStartNetNS: a BeforeStart hook gets a pid whose network
// namespace (not the host's) is the one the sandbox then runs in, which
// is how the Manager wires the sandbox's veth before gVisor reads it.
func TestBeforeStartNetNS(t *testing.T) {
	h := newHarness(t)
	inst := h.New(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	spec := h.Spec(t, id)
	var hooked unix.Stat_t
	spec.BeforeStart = func(ctx context.Context, pid int) error {
		return unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &hooked)
	}
	if err := inst.Backend.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var host, got unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &got); err != nil {
		t.Fatal(err)
	}
	if hooked.Ino == 0 || hooked.Ino == host.Ino {
		t.Fatalf("hook saw netns %d (host %d)", hooked.Ino, host.Ino)
	}
	if got.Ino != hooked.Ino || got.Dev != hooked.Dev {
		t.Errorf("sandbox runs in netns %d, hook wired %d", got.Ino, hooked.Ino)
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}

func procUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			uid, _ := strconv.Atoi(f[1]) // effective
			return uid
		}
	}
	t.Fatalf("no Uid in status of %d", pid)
	return -1
}

// TestRestoreCPUQuota: a restore runs under a lifted CPU quota (the
// runtime's restoreCPU) and the sandbox has its own again once Restore
// returns; a daemon killed before it was set again (the cgroup and the
// config still lifted, the runtime's mark still there) gets both set
// again by the next runtime over the same state.
func TestRestoreCPUQuota(t *testing.T) {
	h := newHarness(t)
	inst := h.New(t)
	cp, ok := inst.Backend.(runtimetest.Checkpointer)
	if !ok || !inst.Checkpoints {
		t.Skip("runsc cannot checkpoint")
	}
	ctx := t.Context()
	id, spec := created(t, h, inst)
	want := strconv.FormatInt(spec.CPUMillis*100, 10) // µs per 100 ms period
	if got := cpuQuota(t, inst.Footprint.CgroupParent, id); got != want {
		t.Fatalf("quota after Create = %s, want %s", got, want)
	}
	dir := filepath.Join(t.TempDir(), "image")
	if err := cp.Checkpoint(ctx, id, dir); err != nil {
		t.Fatal(err)
	}
	if err := cp.Restore(ctx, spec, dir); err != nil {
		t.Fatal(err)
	}
	if got := cpuQuota(t, inst.Footprint.CgroupParent, id); got != want {
		t.Errorf("quota after Restore = %s, want the sandbox's %s", got, want)
	}
	mark := filepath.Join(inst.Footprint.StateDir, id, "restore-limits")
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Errorf("restore mark after Restore: %v", err)
	}
	// What a daemon killed mid-restore leaves: the lifted quota in the
	// cgroup and in the config, and the mark holding the sandbox's own
	// limits.
	cfgPath := filepath.Join(inst.Footprint.StateDir, id, "config.json")
	var sp specs.Spec
	b, err := os.ReadFile(cfgPath)
	if err != nil || json.Unmarshal(b, &sp) != nil || sp.Linux == nil || sp.Linux.Resources == nil || sp.Linux.Resources.CPU == nil {
		t.Fatalf("config %s: %v %s", cfgPath, err, b)
	}
	own, err := json.Marshal(sp.Linux.Resources)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mark, own, 0o600); err != nil {
		t.Fatal(err)
	}
	lifted := int64(200000)
	sp.Linux.Resources.CPU.Quota = &lifted
	if b, err = json.Marshal(&sp); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	setCPUQuota(t, inst.Footprint.CgroupParent, id, "200000")
	inst.Reopen(t)
	if got := cpuQuota(t, inst.Footprint.CgroupParent, id); got != want {
		t.Errorf("quota after a restart = %s, want the sandbox's %s", got, want)
	}
	sp = specs.Spec{}
	if b, err = os.ReadFile(cfgPath); err != nil || json.Unmarshal(b, &sp) != nil || sp.Linux.Resources.CPU.Quota == nil || strconv.FormatInt(*sp.Linux.Resources.CPU.Quota, 10) != want {
		t.Errorf("config after a restart: %v %s; want the sandbox's quota %s", err, b, want)
	}
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Errorf("restore mark after a restart: %v", err)
	}
	if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status != runtime.StatusRunning {
		t.Errorf("Inspect = %+v, %v; want running", st, err)
	}
	// A restore made ready ahead: its sentry waits under the lifted
	// quota, and the restore into it sets the sandbox's own again.
	pr, ok := inst.Backend.(runtimetest.RestorePreparer)
	st, ok2 := inst.Backend.(runtimetest.Stopper)
	if ok && ok2 {
		dir := filepath.Join(t.TempDir(), "image")
		if err := cp.Checkpoint(ctx, id, dir); err != nil {
			t.Fatal(err)
		}
		if err := st.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := pr.PrepareRestore(ctx, spec, dir); err == nil {
			if got := cpuQuota(t, inst.Footprint.CgroupParent, id); got != "200000" {
				t.Errorf("quota of the waiting sentry = %s, want the restore's 200000", got)
			}
			if err := cp.Restore(ctx, spec, dir); err != nil {
				t.Fatal(err)
			}
			if got := cpuQuota(t, inst.Footprint.CgroupParent, id); got != want {
				t.Errorf("quota after a restore made ready = %s, want the sandbox's %s", got, want)
			}
			if _, err := os.Stat(mark); !os.IsNotExist(err) {
				t.Errorf("restore mark after a restore made ready: %v", err)
			}
		} else if !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Fatal(err)
		}
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}

// cpuQuota is sandbox id's CPU quota in µs per period, from its cgroup
// (v1's cpu.cfs_quota_us, or the first field of v2's cpu.max).
func cpuQuota(t *testing.T, parent, id string) string {
	t.Helper()
	b, err := os.ReadFile(cpuQuotaFile(parent, id))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))[0]
}

func setCPUQuota(t *testing.T, parent, id, quota string) {
	t.Helper()
	if strings.HasSuffix(cpuQuotaFile(parent, id), "cpu.max") {
		quota += " 100000"
	}
	if err := os.WriteFile(cpuQuotaFile(parent, id), []byte(quota), 0); err != nil {
		t.Fatal(err)
	}
}

func cpuQuotaFile(parent, id string) string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return filepath.Join("/sys/fs/cgroup", parent, id, "cpu.max")
	}
	return filepath.Join("/sys/fs/cgroup/cpu", parent, id, "cpu.cfs_quota_us")
}

// TestPrepareRestoreFails: a restore made ready whose `runsc create`
// fails after the runtime has mounted the sandbox's root filesystem again
// (a runsc that refuses create, standing in for one that fails there)
// leaves the checkpointed, stopped sandbox as it was: nothing mounted, no
// process, cgroup or runsc state. A Restore then brings it back from the
// same image, and a Destroy leaves nothing.
func TestPrepareRestoreFails(t *testing.T) {
	h := newHarness(t)
	real, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	refuse := filepath.Join(dir, "refuse-create")
	wrapper := filepath.Join(dir, "runsc")
	script := fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ] && [ -e %q ]; then echo 'create refused by the test' >&2; exit 1; fi\ndone\nexec %q \"$@\"\n", refuse, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h.binary = wrapper
	inst := h.New(t)
	pr, ok := inst.Backend.(runtimetest.RestorePreparer)
	if !ok {
		t.Skip("runsc cannot restore into a created sandbox")
	}
	ctx := t.Context()
	id, spec, image := checkpointed(t, h, inst, 0)
	if err := os.WriteFile(refuse, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err = pr.PrepareRestore(ctx, spec, image)
	if errors.Is(err, errdefs.ErrNotImplemented) {
		t.Skip("this runsc cannot restore into a created sandbox")
	}
	if err == nil || !strings.Contains(err.Error(), "runsc create") {
		t.Fatalf("PrepareRestore with create refused = %v; want runsc's refusal", err)
	}
	for _, l := range runtimetest.StoppedSandboxLeaks(inst.Footprint, id) {
		t.Errorf("after a failed PrepareRestore the stopped sandbox holds %s", l)
	}
	if err := os.Remove(refuse); err != nil {
		t.Fatal(err)
	}
	if err := inst.Backend.(runtimetest.Checkpointer).Restore(ctx, spec, image); err != nil {
		t.Fatalf("Restore after a failed PrepareRestore = %v", err)
	}
	if s, err := inst.Backend.Inspect(ctx, id); err != nil || s.Status != runtime.StatusRunning {
		t.Errorf("Inspect after Restore = %+v, %v; want running", s, err)
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}

// checkpointed makes a sandbox of h's spec in inst (created), has it write
// pattern bytes of th.PatternScript's pages to /dev/shm/hold (none for 0),
// checkpoints it into image and stops it: a paused sandbox as the runtime
// keeps it.
func checkpointed(t *testing.T, h *harness, inst runtimetest.Instance, pattern int) (id string, spec runtime.Spec, image string) {
	t.Helper()
	cp, ok := inst.Backend.(runtimetest.Checkpointer)
	st, ok2 := inst.Backend.(runtimetest.Stopper)
	if !ok || !ok2 || !inst.Checkpoints {
		t.Skip("runsc cannot checkpoint")
	}
	id, spec = created(t, h, inst)
	if pattern > 0 {
		script := th.PatternScript("/dev/shm/hold", pattern)
		if out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", script); err != nil || string(out) != "held\n" {
			t.Fatalf("%s = %q, %v", script, out, err)
		}
	}
	image = filepath.Join(t.TempDir(), "image")
	if err := cp.Checkpoint(t.Context(), id, image); err != nil {
		t.Fatal(err)
	}
	if err := st.Stop(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	return id, spec, image
}

// created makes a sandbox of h's spec in inst, destroyed when the test
// ends whatever it left.
func created(t *testing.T, h *harness, inst runtimetest.Instance) (string, runtime.Spec) {
	t.Helper()
	id := runtimetest.NewID()
	spec := h.Spec(t, id)
	if err := inst.Backend.Create(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })
	return id, spec
}
