package runc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runc"
	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
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
