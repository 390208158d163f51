package runc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runc"
	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
	// Aliased: this file has a harness of its own (the conformance one).
	testharness "github.com/berth-sandbox/berth/test/harness"
)

const uidBase = 1000000

// harness runs the conformance suite against real runc with a busybox
// layer and the test agent built once per test.
type harness struct {
	layer, agent string
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, loop devices, cgroups)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc not installed")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs)")
	}
}

// newHarness builds the fixtures. The layer and the agent must be
// reachable by the sandbox's host uid, so their directories are opened up.
func newHarness(t *testing.T) *harness {
	requireRoot(t)
	dir := runtimetest.SandboxReadableDir(t)
	h := &harness{layer: filepath.Join(dir, "layer")}
	runtimetest.BusyboxLayer(t, h.layer, uidBase)
	h.agent = runtimetest.BuildAgent(t, dir)
	return h
}

func (h *harness) config(t *testing.T) runc.Config {
	dir, err := os.MkdirTemp("", "berth-runc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return runc.Config{
		StateDir:     filepath.Join(dir, "state"),
		RuncRoot:     filepath.Join(dir, "runc"),
		CgroupParent: "berth-test-" + filepath.Base(dir),
		UIDBase:      uidBase,
		UIDCount:     65536,
	}
}

func (h *harness) New(t *testing.T) runtimetest.Instance {
	cfg := h.config(t)
	r, err := runc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupParent(cfg.CgroupParent) })
	return runtimetest.Instance{
		Backend: r,
		Reopen: func(t *testing.T) runtimetest.Backend {
			r2, err := runc.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return r2
		},
		Footprint: runtimetest.Footprint{StateDir: cfg.StateDir, RuncRoot: cfg.RuncRoot, CgroupParent: cfg.CgroupParent, SlotDir: "/run/berth/uid-slots"},
		Exec: func(ctx context.Context, id string, argv ...string) ([]byte, error) {
			args := append([]string{"--root", cfg.RuncRoot, "exec", id}, argv...)
			cmd := exec.CommandContext(ctx, "runc", args...)
			cmd.WaitDelay = 10 * time.Second
			return cmd.CombinedOutput()
		},
		HostUID:       r.HostUID,
		HostPidIsInit: true,
		UIDBase:       uidBase,
	}
}

func (h *harness) Spec(t *testing.T, id string) runtime.Spec {
	return runtime.Spec{
		ID:          id,
		Layers:      []string{h.layer},
		DiskBytes:   64 << 20,
		CPUMillis:   1000,
		MemoryBytes: 64 << 20,
		PidsLimit:   64,
		Hostname:    "sb-" + id,
		AgentPath:   h.agent,
	}
}

// removeCgroupParent removes the per-test parent cgroup in every
// hierarchy once its sandboxes are gone.
func removeCgroupParent(parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parent))
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}

func TestConformance(t *testing.T) {
	runtimetest.Run(t, newHarness(t))
}

// TestHookFailsAfterAgentExit: under runc the agent starts while the
// BeforeStart hook runs; an agent that exits at once takes its namespaces
// along and the hook fails on that. The create then reports the agent's
// exit with its last words (runtime.ErrInitExited), not the hook's
// failure, and leaves nothing.
func TestHookFailsAfterAgentExit(t *testing.T) {
	h := newHarness(t)
	inst := h.New(t)
	id := runtimetest.NewID()
	spec := h.Spec(t, id)
	spec.AgentArgs = []string{"exit"}
	spec.BeforeStart = func(ctx context.Context, pid int) error {
		// Fail only once the init has exited, as a hook whose network
		// namespace went away does.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 1000)
			if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
				continue // a signal to this thread, or a second without the exit
			}
			if err != nil {
				return err
			}
			return errors.New("network namespace gone")
		}
		return fmt.Errorf("init %d did not exit within a minute", pid)
	}
	err := inst.Backend.Create(t.Context(), spec)
	if err == nil {
		_ = inst.Backend.Destroy(context.Background(), id)
		t.Fatal("Create with an agent that exits succeeded")
	}
	t.Logf("Create error: %v", err)
	if !errors.Is(err, runtime.ErrInitExited) || !strings.Contains(err.Error(), "giving up at once") {
		t.Errorf("Create error = %v, want the agent's exit with its last words", err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}

// TestCreateTiming logs how long Create and its phases take, the number
// the project's "well under 100 ms" target is about.
func TestCreateTiming(t *testing.T) {
	h := newHarness(t)
	cfg := h.config(t)
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := runc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupParent(cfg.CgroupParent) })
	var total []time.Duration
	for range 5 {
		id := runtimetest.NewID()
		t0 := time.Now()
		if err := r.Create(t.Context(), h.Spec(t, id)); err != nil {
			t.Fatal(err)
		}
		total = append(total, time.Since(t0))
		t1 := time.Now()
		if err := r.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		t.Logf("destroy took %v", time.Since(t1))
	}
	slices.Sort(total)
	t.Logf("create: min %v median %v max %v", total[0], total[len(total)/2], total[len(total)-1])
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestWorkloadCgroup: a sandbox that asks for a workload cgroup
// (runtime.Spec.WorkloadPids) gets one on a cgroup v1 host: its pids.max
// is the sandbox's limit, the sandbox cgroup's sits a little above it,
// the agent holds the two tasks files on the descriptors its environment
// names, an update moves both limits, and Destroy leaves nothing.
func TestWorkloadCgroup(t *testing.T) {
	if !testharness.PidsV1() {
		t.Skip("no cgroup v1 pids hierarchy")
	}
	h := newHarness(t)
	inst := h.New(t)
	id := runtimetest.NewID()
	spec := h.Spec(t, id)
	spec.WorkloadPids = true
	if err := inst.Backend.Create(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			_ = inst.Backend.Destroy(context.Background(), id)
		}
	}()
	sandbox := filepath.Join("/sys/fs/cgroup/pids", inst.Footprint.CgroupParent, id)
	work := filepath.Join(sandbox, "workload")
	limits := func() (outer, inner string) {
		t.Helper()
		o, err := os.ReadFile(filepath.Join(sandbox, "pids.max"))
		if err != nil {
			t.Fatal(err)
		}
		i, err := os.ReadFile(filepath.Join(work, "pids.max"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(o)), strings.TrimSpace(string(i))
	}
	if o, i := limits(); i != fmt.Sprint(spec.PidsLimit) || o != fmt.Sprint(spec.PidsLimit+64) {
		t.Errorf("pids.max: sandbox %s, workload %s; want %d and %d", o, i, spec.PidsLimit+64, spec.PidsLimit)
	}
	// The agent, the sandbox cgroup's one process, was told where the
	// files are (no secret here: from descriptor 3 on) and holds them.
	pids, err := testharness.CgroupProcs(sandbox)
	if err != nil || len(pids) != 1 {
		t.Fatalf("sandbox cgroup processes %v, %v; want the agent alone", pids, err)
	}
	// The environment runc gives the agent (its config; `runc run
	// --detach` returns before the init has executed the agent, so its
	// /proc environ may still be runc's).
	b, err := os.ReadFile(filepath.Join(inst.Footprint.StateDir, id, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Process struct{ Env []string }
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.Process.Env, "BERTH_PIDS_TASKS_FDS=3,4") {
		t.Errorf("agent environment %q lacks BERTH_PIDS_TASKS_FDS=3,4", cfg.Process.Env)
	}
	for fd, want := range map[string]string{"3": filepath.Join(work, "tasks"), "4": filepath.Join(sandbox, "tasks")} {
		if got, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pids[0]), "fd", fd)); err != nil || got != want {
			t.Errorf("agent descriptor %s = %q, %v; want %s", fd, got, err, want)
		}
	}
	if _, err := inst.Backend.(*runc.Runtime).Update(t.Context(), id, runtime.Limits{PidsLimit: 32}); err != nil {
		t.Fatal(err)
	}
	if o, i := limits(); i != "32" || o != "96" {
		t.Errorf("after an update to 32, pids.max: sandbox %s, workload %s; want 96 and 32", o, i)
	}
	destroyed = true
	if err := inst.Backend.Destroy(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sandbox); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox cgroup %s after Destroy: %v", sandbox, err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}
