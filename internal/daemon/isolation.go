package daemon

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
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime/runc"
	"github.com/berth-sandbox/berth/internal/runtime/runsc"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// The runc runtime (both levels) has the optional abilities the Manager
// looks for by assertion; a change that lost one would otherwise only
// slow creates down or blur their errors.
var (
	_ sandbox.InitWatcher   = (*runc.Runtime)(nil)
	_ sandbox.RootWriter    = (*runc.Runtime)(nil)
	_ sandbox.CrashReporter = (*runc.Runtime)(nil)
	_ sandbox.MemoryCopier  = (*runc.Runtime)(nil)
)

// levels are the isolation levels this daemon runs: one runtime per level
// it offers, and for each level it knows but cannot offer, why.
type levels struct {
	runtimes    map[string]sandbox.Runtime
	versions    map[string]string
	unavailable map[string]string
	wire        []types.IsolationLevel
	closers     []func()
}

// Close stops the runtimes' background work (sandboxes keep running).
func (l *levels) Close() {
	for _, c := range slices.Backward(l.closers) {
		c()
	}
}

// gvisorInstall is what an operator installs to get the gvisor level.
const gvisorInstall = "install it with `apt-get install runsc` (or put a gVisor release's runsc on PATH, or set gvisor_runtime)"

// newLevels builds the runc runtime and, when runsc is on the host, the
// gVisor one. Both share the daemon's cgroup parent (sandbox IDs are
// unique across levels, and the sandbox's cgroup is where its limits and
// OOM counts are read either way) and the host-wide uid slot dir; each has
// its own state dir, runtime root and disk pool. A host without runsc
// still starts (gvisor is refused at create, naming the package), unless
// gvisor is the default level, which it then cannot honour.
func newLevels(ctx context.Context, cfg Config, log *slog.Logger) (*levels, error) {
	if !slices.Contains(core.Isolations(), cfg.DefaultIsolation) {
		return nil, fmt.Errorf("default_isolation %q: want one of %s: %w", cfg.DefaultIsolation, strings.Join(core.Isolations(), ", "), errdefs.ErrInvalidArgument)
	}
	l := &levels{runtimes: map[string]sandbox.Runtime{}, versions: map[string]string{}, unavailable: map[string]string{}}
	rc, err := runc.New(runc.Config{
		Binary:       cfg.RuntimeBinary,
		StateDir:     filepath.Join(cfg.DataDir, "sandboxes"),
		RuncRoot:     filepath.Join(cfg.DataDir, "runc"),
		CgroupParent: "berth-" + cfg.Instance,
		UIDBase:      cfg.UIDBase,
		UIDCount:     cfg.UIDCount,
		DiskPoolDir:  filepath.Join(cfg.DataDir, "diskpool"),
		Logger:       log.With("component", "runtime", "isolation", core.IsolationRunc),
	})
	if err != nil {
		return nil, err
	}
	l.closers = append(l.closers, rc.Close)
	// Spare disk images are kept for the default level only: most
	// sandboxes run at it, and each pool costs a few mkfs runs at start.
	if cfg.DefaultIsolation == core.IsolationRunc {
		rc.Warm(cfg.Defaults.DiskBytes)
	}
	l.runtimes[core.IsolationRunc] = rc
	l.versions[core.IsolationRunc] = runcVersion(ctx, cfg.RuntimeBinary)
	l.wire = append(l.wire, types.IsolationLevel{Name: core.IsolationRunc, Available: true, Runtime: l.versions[core.IsolationRunc], Sudo: true, Snapshots: types.SnapshotFilesystem})

	// The gofer reaches the rootfs as the sandbox's unprivileged root: the
	// level's dir must be searchable (as the data dir is; Run checks).
	gdir := filepath.Join(cfg.DataDir, "gvisor")
	if err := os.MkdirAll(gdir, 0o711); err != nil {
		rc.Close()
		return nil, fmt.Errorf("gvisor dir: %w", err)
	}
	if err := os.Chmod(gdir, 0o711); err != nil {
		rc.Close()
		return nil, fmt.Errorf("gvisor dir: %w", err)
	}
	gv, err := runsc.New(ctx, runsc.Config{
		Binary:       cfg.GVisorBinary,
		StateDir:     filepath.Join(gdir, "sandboxes"),
		RunscRoot:    filepath.Join(gdir, "runsc"),
		CgroupParent: "berth-" + cfg.Instance,
		UIDBase:      cfg.UIDBase,
		UIDCount:     cfg.UIDCount,
		DiskPoolDir:  filepath.Join(gdir, "diskpool"),
		Platform:     cfg.GVisorPlatform,
		Logger:       log.With("component", "runtime", "isolation", core.IsolationGVisor),
	})
	switch {
	case err == nil:
		l.closers = append(l.closers, gv.Close)
		if cfg.DefaultIsolation == core.IsolationGVisor {
			gv.Warm(cfg.Defaults.DiskBytes)
		}
		l.runtimes[core.IsolationGVisor] = gv
		l.versions[core.IsolationGVisor] = "runsc " + gv.Version() + " (" + gv.Platform() + ")"
		l.wire = append(l.wire, types.IsolationLevel{Name: core.IsolationGVisor, Available: true, Runtime: "runsc " + gv.Version(), Platform: gv.Platform(), Sudo: gv.RaisesSetuid(), Snapshots: snapshotKind(gv.CopiesMemory())})
	case errors.Is(err, errdefs.ErrUnavailable):
		why := fmt.Sprintf("%v; %s", err, gvisorInstall)
		l.unavailable[core.IsolationGVisor] = why
		l.wire = append(l.wire, types.IsolationLevel{Name: core.IsolationGVisor, Reason: why})
		log.Warn("isolation_unavailable", "isolation", core.IsolationGVisor, "err", err)
	default:
		// A runsc that is there but misconfigured (a bad platform) is
		// the operator's to fix, not a level to drop quietly.
		l.Close()
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	if why, ok := l.unavailable[cfg.DefaultIsolation]; ok {
		l.Close()
		return nil, fmt.Errorf("default_isolation %s is not available on this host: %s: %w", cfg.DefaultIsolation, why, errdefs.ErrFailedPrecondition)
	}
	for i := range l.wire {
		l.wire[i].Default = l.wire[i].Name == cfg.DefaultIsolation
	}
	return l, nil
}

// runcVersion is "runc <version>" from `runc --version`'s first line, or
// "runc" when it says nothing usable (the version is informational).
func runcVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "runc"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if v, ok := strings.CutPrefix(strings.TrimSpace(first), "runc version "); ok && v != "" {
		return "runc " + v
	}
	return "runc"
}

// snapshotKind is what a snapshot at a level keeps (types.IsolationLevel.Snapshots).
func snapshotKind(memory bool) string {
	if memory {
		return types.SnapshotMemory
	}
	return types.SnapshotFilesystem
}
