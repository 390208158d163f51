package runsc_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runsc"
	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
)

const uidBase = 1000000

// harness runs the conformance suite against real runsc with a busybox
// layer and the test agent built once per test. binary is the runsc run:
// "runsc" on PATH unless set.
type harness struct {
	layer, agent string
	binary       string
}

// debianRunsc is Debian's packaged runsc (scripts/deps.sh), a 2022 build.
const debianRunsc = "/usr/bin/runsc"

// runscs are the runsc builds on this host the conformance suite runs
// against: the one on PATH (the tests' current one, scripts/runsc-bin.sh),
// and Debian's where that is another, so both keep working.
func runscs(t *testing.T) map[string]string {
	t.Helper()
	onPath, err := exec.LookPath("runsc")
	if err != nil {
		return nil
	}
	out := map[string]string{"path": onPath}
	a, _ := filepath.EvalSymlinks(onPath)
	if b, err := filepath.EvalSymlinks(debianRunsc); err == nil && a != b {
		out["debian"] = debianRunsc
	}
	return out
}

func requireRunsc(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, loop devices, cgroups)")
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc not installed (apt-get install runsc)")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs)")
	}
}

func newHarness(t *testing.T) *harness {
	requireRunsc(t)
	dir := runtimetest.SandboxReadableDir(t)
	h := &harness{layer: filepath.Join(dir, "layer")}
	runtimetest.BusyboxLayer(t, h.layer, uidBase)
	h.agent = runtimetest.BuildAgent(t, dir)
	return h
}

func (h *harness) config(t *testing.T) runsc.Config {
	dir, err := os.MkdirTemp("", "berth-runsc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return runsc.Config{
		Binary:       h.binary,
		StateDir:     filepath.Join(dir, "state"),
		RunscRoot:    filepath.Join(dir, "runsc"),
		CgroupParent: "berth-test-" + filepath.Base(dir),
		UIDBase:      uidBase,
		UIDCount:     65536,
		Platform:     os.Getenv("BERTH_GVISOR_PLATFORM"),
	}
}

func (h *harness) New(t *testing.T) runtimetest.Instance {
	cfg := h.config(t)
	r, err := runsc.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runsc %s on %s", r.Version(), r.Platform())
	t.Cleanup(func() { removeCgroupParent(cfg.CgroupParent) })
	return runtimetest.Instance{
		Backend: r,
		Reopen: func(t *testing.T) runtimetest.Backend {
			r2, err := runsc.New(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return r2
		},
		Footprint: runtimetest.Footprint{StateDir: cfg.StateDir, RuncRoot: cfg.RunscRoot, CgroupParent: cfg.CgroupParent, SlotDir: "/run/berth/uid-slots"},
		Exec: func(ctx context.Context, id string, argv ...string) ([]byte, error) {
			args := append([]string{"--root", cfg.RunscRoot, "exec", id}, argv...)
			cmd := exec.CommandContext(ctx, r.Binary(), args...)
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				// The sandbox's own stderr (the sentry's, on a crash).
				for _, f := range []string{r.AgentLog(id), filepath.Join(cfg.StateDir, id, "runc.log"), filepath.Join(cfg.StateDir, id, "panic.log")} {
					if b, rerr := os.ReadFile(f); rerr == nil && len(b) > 0 {
						t.Logf("sandbox %s %s:\n%s\n...\n%s", id, filepath.Base(f), b[:min(len(b), 2048)], tail(b, 1024))
					}
				}
			}
			return out, err
		},
		HostUID:         r.HostUID,
		OOMKillsSandbox: r.Platform() != runsc.PlatformSystrap,
		OOMKillsEither:  r.Platform() == runsc.PlatformSystrap,
		ExecUnfiltered:  true,
		// The host pids cgroup counts the sentry's threads and the ptrace
		// platform's stub tasks; the sandbox's own limit is held inside
		// the sentry by berth-agent for the processes it starts
		// (docs/security.md, gVisor section), which this suite's are not.
		Checkpoints:  true,
		UIDBase:      uidBase,
		MountsGap:    r.MountsGap(),
		PidsLimitGap: "gVisor: the sandbox's pids limit is held inside the sentry by berth-agent (--pids-max) for the processes it starts; this suite's come from runsc exec, and the host cgroup counts sentry threads and ptrace stubs",
		SetuidGap:    setuidGap(r),
	}
}

// setuidGap: a runsc without --allow-suid (Debian's 20221219) ignores the
// set-user-ID bit, with or without no_new_privs, so AllowSetuid has no
// effect there (docs/security.md).
func setuidGap(r *runsc.Runtime) string {
	if r.RaisesSetuid() {
		return ""
	}
	return "gVisor: runsc " + r.Version() + " has no --allow-suid: set-user-ID programs do not raise their caller, with or without no_new_privs"
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

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
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
	requireRunsc(t)
	for name, bin := range runscs(t) {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.binary = bin
			runtimetest.Run(t, h)
		})
	}
}
