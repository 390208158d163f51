package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// errNoCheckpoint is why a runc sandbox cannot be checkpointed: runc needs
// CRIU, and Debian's (3.17) fails on this kernel's vDSO. The class is
// ErrNotImplemented so callers can tell "not on this runtime" from a
// failure.
var errNoCheckpoint = fmt.Errorf("checkpoint/restore needs gVisor (runc has no working CRIU on this host): %w", errdefs.ErrNotImplemented)

// errNoCopies is why a sandbox cannot be copied with its memory: runc
// cannot checkpoint at all, and an old runsc cannot restore one
// sandbox's image into another.
var errNoCopies = fmt.Errorf("copying a sandbox with its memory needs gVisor with a runsc that has --restore-spec-validation (releases from 2024 on): %w", errdefs.ErrNotImplemented)

// CopiesMemory reports whether a running sandbox's memory image can be
// taken without stopping it (CheckpointLive) and started as another
// sandbox (runtime.Spec.RestoreImage).
func (r *Runtime) CopiesMemory() bool {
	return r.cfg.GVisor != nil && r.cfg.GVisor.RestoreCopies
}

// CheckpointLive saves sandbox id's whole state (processes, memory, open
// files, sockets) into dir, as Checkpoint does, and leaves the sandbox as
// it was: a paused one stays paused, a running one runs on. The image
// starts new sandboxes (runtime.Spec.RestoreImage); it never replaces
// this one. A failed save leaves the sandbox as it was too.
func (r *Runtime) CheckpointLive(ctx context.Context, id, dir string) error {
	if err := r.prepareCheckpoint(id, dir, r.CopiesMemory(), errNoCopies); err != nil {
		return err
	}
	start := time.Now()
	cmd := r.command(ctx, id, "checkpoint", "--leave-running", "--image-path", dir, id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := runPinned(cmd, ""); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: runsc checkpoint --leave-running: %w: %s%s", id, err, strings.TrimSpace(stderr.String()), r.logTail(id))
	}
	r.log.Debug("sandbox checkpointed, left running", "sandbox_id", id, "total", time.Since(start))
	return nil
}

// prepareCheckpoint checks a checkpoint of sandbox id into dir may go
// ahead (the runtime can, or cannot says why not) and makes dir. No
// `runsc state` first (a runsc start costs a few hundred milliseconds on
// a busy host): runsc checkpoint refuses a sandbox that is not running,
// and the caller asks the runtime then.
func (r *Runtime) prepareCheckpoint(id, dir string, can bool, cannot error) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !can {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, cannot)
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("checkpoint sandbox %s: image dir %q is not absolute: %w", id, dir, errdefs.ErrInvalidArgument)
	}
	if !r.hasState(id) {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	return nil
}

// Checkpoint saves sandbox id's whole state (processes, memory, open
// files, sockets) into dir and stops it. Its filesystem stays, for
// Restore. Only gVisor sandboxes can; runc ones fail with
// ErrNotImplemented.
func (r *Runtime) Checkpoint(ctx context.Context, id, dir string) error {
	if err := r.prepareCheckpoint(id, dir, r.cfg.GVisor != nil, errNoCheckpoint); err != nil {
		return err
	}
	start := time.Now()
	phases := phaseTimer{last: start}
	// Like every runsc CLI (cli.go), it dies with the daemon, so a
	// restarted daemon never races a checkpoint it did not start (the
	// sentry may still finish a save already under way; the restart
	// stops the sandbox then, see sandbox.adoptPause).
	args := append(append([]string{"checkpoint"}, r.cfg.GVisor.checkpointArgs()...), "--image-path", dir, id)
	cmd := r.command(ctx, id, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := runPinned(cmd, ""); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: runsc checkpoint: %w: %s%s", id, err, strings.TrimSpace(stderr.String()), r.logTail(id))
	}
	phases.mark("runsc_checkpoint")
	// The sentry exits once its state is saved; what is left of the
	// sandbox is its gofer, cgroup and runsc's record. They go here
	// rather than through `runsc delete`, which does the same but takes
	// a second on a busy host, so the Stop that follows finds nothing
	// to ask runsc about.
	// The checkpoint is complete either way: what this could not
	// release, Stop (which the caller runs next) or Destroy does.
	if err := errors.Join(r.dropCheckpointed(ctx, id)...); err != nil {
		r.log.Warn("release_checkpointed", "sandbox_id", id, "err", err)
	}
	phases.mark("release")
	r.log.Debug("sandbox checkpointed", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
	return nil
}

// dropCheckpointed removes what a sandbox whose sentry exited after its
// checkpoint leaves: its processes (the gofer, a sentry still exiting),
// cgroups and runsc's state files, as endProcesses does after a failed
// `runsc delete`.
func (r *Runtime) dropCheckpointed(ctx context.Context, id string) []error {
	var errs []error
	gofer := r.goferPid(id)
	if err := r.killCgroup(ctx, id); err != nil {
		errs = append(errs, err)
	}
	killGofer(gofer)
	if err := r.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	if err := r.removeState(id); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// Restore brings a checkpointed sandbox back from dir. spec.ID names the
// sandbox, whose filesystem Checkpoint kept; its limits are those it was
// created with. The network is spec's: NetNSPath, or a new namespace wired
// by spec.BeforeStart as in Create, so a restored sandbox may come back in
// a namespace it has never seen. On failure the sandbox stays stopped, for
// the caller to destroy or retry. With GVisor.BackgroundRestore the
// sandbox runs before all its memory is back: the sentry goes on loading
// pages from the image files it holds open, so dir may be removed once
// Restore returns (a load that fails later kills the sandbox).
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	id := spec.ID
	if err := checkID(id); err != nil {
		return err
	}
	start := time.Now()
	phases := phaseTimer{last: start}
	if r.cfg.GVisor == nil {
		return fmt.Errorf("restore sandbox %s: %w", id, errNoCheckpoint)
	}
	if spec.NetNSPath != "" && !filepath.IsAbs(spec.NetNSPath) {
		return fmt.Errorf("restore sandbox %s: netns path %q is not absolute: %w", id, spec.NetNSPath, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return fmt.Errorf("restore sandbox %s: no checkpoint in %s: %w", id, dir, errdefs.ErrNotFound)
	}
	b, err := os.ReadFile(filepath.Join(r.dir(id), "config.json"))
	if err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	var sp specs.Spec
	if err := json.Unmarshal(b, &sp); err != nil {
		return fmt.Errorf("restore sandbox %s: config: %w", id, err)
	}
	// Never on top of a running sandbox. The state file settles this
	// without runsc for a checkpointed one (its sentry is gone); one
	// whose sentry lives but does not answer is stopped like the rest.
	if st, ok, err := r.state(ctx, id); err != nil && !errors.Is(err, errUnresponsive) {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	} else if err == nil && ok && st.Status != "stopped" {
		return fmt.Errorf("restore sandbox %s: it is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	// What is left of the checkpointed sandbox: runsc's record and the
	// cgroup it ran in. Killed first, then runsc's record goes (without
	// runsc, once the sentry is gone).
	gofer := r.goferPid(id)
	if err := r.killCgroup(ctx, id); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	if err := r.deleteRecord(ctx, id); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	killGofer(gofer)
	if err := r.removeState(id); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	if err := r.removeCgroups(id); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	phases.mark("cleanup")
	slot, ok := r.slots.lookup(r.dir(id))
	if !ok {
		return fmt.Errorf("restore sandbox %s: no uid range recorded: %w", id, errdefs.ErrNotFound)
	}
	// A sandbox Stop released after its checkpoint gets its root
	// filesystem back first.
	if !r.rootfsMounted(id) {
		if err := r.unmountRootfs(ctx, id); err != nil {
			return fmt.Errorf("restore sandbox %s: %w", id, err)
		}
		if err := r.remountRootfs(id, hostBase(slot)); err != nil {
			_ = r.unmountRootfs(ctx, id) // err says why; the sandbox stays stopped
			return fmt.Errorf("restore sandbox %s: %w", id, err)
		}
		phases.mark("mount")
	}
	netns, done, err := sandboxNetNS(ctx, spec)
	if err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	defer done()
	phases.mark("network")
	gvisorSpec(&sp, spec, netns, r.raisesSetuid(spec))
	if err := r.writeConfig(id, &sp); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	// The volumes the checkpoint's config binds, attached again where
	// it names them (the spec's mounts are the ones it was created with).
	if err := r.checkMounts(spec); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	detach, err := r.attachVolumes(spec, hostBase(slot))
	if err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	args := append(append([]string{"--detach"}, r.cfg.GVisor.restoreArgs()...), "--image-path", dir)
	err = r.runscStart(ctx, spec, "restore", args...)
	if derr := detach(); err == nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	phases.mark("runsc_restore")
	r.log.Debug("sandbox restored", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
	return nil
}
