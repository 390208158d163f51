package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sync/errgroup"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/diskimg"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// errNoCheckpoint is why a runc sandbox cannot be checkpointed: runc needs
// CRIU, and Debian's (3.17) fails on this kernel's vDSO. The class is
// ErrNotImplemented so callers can tell "not on this runtime" from a
// failure.
var errNoCheckpoint = fmt.Errorf("checkpoint/restore needs gVisor (runc has no working CRIU on this host): %w", errdefs.ErrNotImplemented)

// errNoPreparedRestore is why a restore cannot be prepared: this runsc
// does not restore into a container made beforehand.
var errNoPreparedRestore = fmt.Errorf("cannot restore into a sandbox made beforehand (releases from 2024 on can): %w", errdefs.ErrNotImplemented)

// errNoCopies is why a sandbox cannot be copied with its memory: runc
// cannot checkpoint at all, and an old runsc cannot restore one
// sandbox's image into another.
var errNoCopies = fmt.Errorf("copying a sandbox with its memory needs gVisor with a runsc that has --restore-spec-validation (releases from 2024 on): %w", errdefs.ErrNotImplemented)

// SavesMemory reports whether Checkpoint saves the sandbox's memory (under
// gVisor); runc's returns errdefs.ErrNotImplemented.
func (r *Runtime) SavesMemory() bool { return r.cfg.GVisor != nil }

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
	args := append(append([]string{"checkpoint", "--leave-running"}, r.cfg.GVisor.checkpointArgs(dir)...), "--image-path", dir, id)
	cmd := r.command(ctx, id, args...)
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
	args := append(append([]string{"checkpoint"}, r.cfg.GVisor.checkpointArgs(dir)...), "--image-path", dir, id)
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
	sp, err := r.checkpointedConfig(id, dir)
	if err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	if done, err := r.restorePrepared(ctx, spec, dir); done {
		if err != nil {
			return fmt.Errorf("restore sandbox %s: %w", id, err)
		}
		phases.mark("runsc_restore_prepared")
		r.log.Debug("sandbox restored", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
		return nil
	}
	if err := r.clearCheckpointed(ctx, id); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	phases.mark("cleanup")
	slot, ok := r.slots.lookup(r.dir(id))
	if !ok {
		return fmt.Errorf("restore sandbox %s: no uid range recorded: %w", id, errdefs.ErrNotFound)
	}
	// The network comes up (spec.BeforeStart included) while the root
	// filesystem is mounted again: neither needs the other, and each is
	// several milliseconds of kernel work. A failure of one leaves the
	// other's result to what undoes a failed restore (done here, the
	// caller's hook's own undo for what BeforeStart made).
	var (
		netns string
		done  func()
		ns    errgroup.Group
	)
	ns.Go(func() (err error) {
		netns, done, err = sandboxNetNS(ctx, spec)
		return err
	})
	mountErr := r.rootfsBack(ctx, id, hostBase(slot))
	nsErr := ns.Wait()
	if done != nil {
		defer done()
	}
	if err := errors.Join(mountErr, nsErr); err != nil {
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	phases.mark("rootfs_network")
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
	flags, err := r.restoreFlags(id, dir)
	if err != nil {
		_ = detach()
		return fmt.Errorf("restore sandbox %s: %w", id, err)
	}
	err = r.runscRestore(ctx, spec, &sp, append(flags, "--image-path", dir)...)
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

// WaitRestored waits until sandbox id, restored or started from a memory
// image, has all its memory back. With GVisor.BackgroundRestore a restore
// returns once the sentry's kernel state is loaded and the sandbox runs
// while the sentry reads the rest of its pages in; this waits for that
// (`runsc wait --restore`). A load that fails ends with the sentry killing
// every process of the sandbox, and the error here says why. Without a
// background restore there is nothing to wait for: nil at once. An error
// may also mean runsc could not ask (the sandbox stopped meanwhile, ctx
// ended); asked again, a load that failed fails again.
func (r *Runtime) WaitRestored(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if r.cfg.GVisor == nil || !r.cfg.GVisor.BackgroundRestore {
		return nil
	}
	// A sandbox that was not restored in the background since it last
	// started (or whose load was seen to end well) has nothing loading,
	// and runsc would refuse the question ("not being restored").
	if _, err := os.Stat(r.loadingMark(id)); err != nil {
		return nil
	}
	cmd := r.command(ctx, id, "wait", "--restore", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := runPinned(cmd, ""); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("runsc wait --restore: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if err := os.Remove(r.loadingMark(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Warn("loading_mark_not_removed", "sandbox_id", id, "err", err)
	}
	return nil
}

// loadingMark is the file that says sandbox id was restored in the
// background (GVisor.BackgroundRestore) since it last started: its
// memory may still be loading. It outlives the daemon, so a restarted
// one asks about the load of a sandbox it adopts, and only of those;
// Stop, and a WaitRestored that saw the load end well, remove it.
func (r *Runtime) loadingMark(id string) string { return filepath.Join(r.dir(id), "restore-loading") }

// restoreFlags are `runsc restore`'s flags for sandbox id's restore from
// the image in dir, but the image's path; a restore in the background
// writes id's loading mark first.
func (r *Runtime) restoreFlags(id, dir string) ([]string, error) {
	flags := append([]string{"--detach"}, r.cfg.GVisor.restoreArgs(dir)...)
	if r.cfg.GVisor.BackgroundRestore {
		if err := os.WriteFile(r.loadingMark(id), nil, 0o600); err != nil {
			return nil, err
		}
	}
	return flags, nil
}

// checkpointedConfig is the config sandbox id was created with, whose
// checkpoint is in dir.
func (r *Runtime) checkpointedConfig(id, dir string) (specs.Spec, error) {
	var sp specs.Spec
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return sp, fmt.Errorf("no checkpoint in %s: %w", dir, errdefs.ErrNotFound)
	}
	b, err := os.ReadFile(filepath.Join(r.dir(id), "config.json"))
	if err != nil {
		return sp, fmt.Errorf("config: %w", errdefs.ErrNotFound)
	}
	if err := json.Unmarshal(b, &sp); err != nil {
		return sp, fmt.Errorf("config: %w", err)
	}
	return sp, nil
}

// clearCheckpointed removes what is left of checkpointed sandbox id before
// a gVisor sandbox is made for it again: runsc's record and the cgroup it
// ran in, and a sandbox PrepareRestore made that is not used.
func (r *Runtime) clearCheckpointed(ctx context.Context, id string) error {
	// Never on top of a running sandbox. The state file settles this
	// without runsc for a checkpointed one (its sentry is gone); one
	// whose sentry lives but does not answer is stopped like the rest,
	// and so is one only created (by PrepareRestore).
	if st, ok, err := r.state(ctx, id); err != nil && !errors.Is(err, errUnresponsive) {
		return err
	} else if err == nil && ok && st.Status != "stopped" && st.Status != "created" {
		return fmt.Errorf("it is %s: %w", st.Status, errdefs.ErrFailedPrecondition)
	}
	// Killed first, then runsc's record goes (without runsc, once the
	// sentry is gone).
	_ = os.Remove(r.preparedMark(id))
	gofer := r.goferPid(id)
	if err := r.killCgroup(ctx, id); err != nil {
		return err
	}
	if err := r.deleteRecord(ctx, id); err != nil {
		return err
	}
	killGofer(gofer)
	if err := r.removeState(id); err != nil {
		return err
	}
	return r.removeCgroups(id)
}

// preparedMark is the file that says sandbox id has a gVisor sandbox made
// for its next restore (PrepareRestore); it holds the checkpoint's
// directory.
func (r *Runtime) preparedMark(id string) string { return filepath.Join(r.dir(id), "restore-prepared") }

// PrepareRestore makes, ahead of its Restore from dir, the gVisor sandbox
// that checkpointed sandbox spec.ID will be restored into: its root
// filesystem mounted, a network namespace of its own (empty: the network
// is attached by spec.BeforeStart at the Restore, before runsc hands the
// namespace's links to the sentry), and `runsc create` run, which starts
// its gofer and its sentry, waiting. A Restore then skips all that (about
// a third of a 256 MiB resume). While it waits the sandbox holds the
// sentry's and gofer's memory (tens of MiB, in its cgroup), a mount and a
// loop device; Stop (or a Restore) releases them. Not for a sandbox with
// volumes (spec.Mounts), which are bound at the Restore. On an error
// nothing of it is left.
func (r *Runtime) PrepareRestore(ctx context.Context, spec runtime.Spec, dir string) (err error) {
	id := spec.ID
	if err := checkID(id); err != nil {
		return err
	}
	if r.cfg.GVisor == nil {
		return fmt.Errorf("prepare restore of sandbox %s: %w", id, errNoCheckpoint)
	}
	if !r.cfg.GVisor.PrepareRestore {
		return fmt.Errorf("prepare restore of sandbox %s: runsc %w", id, errNoPreparedRestore)
	}
	if len(spec.Mounts) > 0 {
		return fmt.Errorf("prepare restore of sandbox %s: it has volumes, bound at the restore: %w", id, errdefs.ErrNotImplemented)
	}
	start := time.Now()
	sp, err := r.checkpointedConfig(id, dir)
	if err != nil {
		return fmt.Errorf("prepare restore of sandbox %s: %w", id, err)
	}
	if err := r.clearCheckpointed(ctx, id); err != nil {
		return fmt.Errorf("prepare restore of sandbox %s: %w", id, err)
	}
	slot, ok := r.slots.lookup(r.dir(id))
	if !ok {
		return fmt.Errorf("prepare restore of sandbox %s: no uid range recorded: %w", id, errdefs.ErrNotFound)
	}
	defer func() {
		if err != nil {
			// Back to what a Stop leaves: nothing running or mounted.
			if serr := r.Stop(context.WithoutCancel(ctx), id); serr != nil {
				err = errors.Join(err, serr)
			}
			err = fmt.Errorf("prepare restore of sandbox %s: %w", id, err)
		}
	}()
	if err := r.rootfsBack(ctx, id, hostBase(slot)); err != nil {
		return err
	}
	h, err := newNetHolder(ctx, "")
	if err != nil {
		return err
	}
	defer h.close()
	if err := checkNotHostNetNS(h.path()); err != nil {
		return err
	}
	gvisorSpec(&sp, spec, h.path(), r.raisesSetuid(spec))
	if err := r.writeConfig(id, &sp); err != nil {
		return err
	}
	// Created under the limits a restore lifts (its cgroup is made now);
	// restorePrepared sets its own again, from the mark.
	if _, err := r.runLifted(ctx, spec, &sp, "create"); err != nil {
		return err
	}
	if err := os.WriteFile(r.preparedMark(id), []byte(dir), 0o600); err != nil {
		return err
	}
	r.log.Debug("sandbox restore prepared", "sandbox_id", id, "total", time.Since(start))
	return nil
}

// restorePrepared restores sandbox spec.ID from dir into the sandbox
// PrepareRestore made for it, if there is one, still waiting: done says
// it was used (err is then the restore's). The mark is used once: a
// sandbox that is not there as it was left is cleared by the Restore that
// follows, which makes one afresh.
func (r *Runtime) restorePrepared(ctx context.Context, spec runtime.Spec, dir string) (done bool, err error) {
	id := spec.ID
	b, err := os.ReadFile(r.preparedMark(id))
	if err != nil || len(spec.Mounts) > 0 {
		return false, nil
	}
	if err := os.Remove(r.preparedMark(id)); err != nil {
		return false, nil
	}
	if string(b) != dir {
		return false, nil
	}
	st, ok, err := r.state(ctx, id)
	if err != nil || !ok || st.Status != "created" || st.Pid <= 0 {
		r.log.Warn("prepared_restore_not_used", "sandbox_id", id, "status", st.Status, "err", err)
		return false, nil
	}
	if spec.BeforeStart != nil {
		// The sentry's namespace is the one it was created in; runsc
		// reads its links at the restore.
		if err := spec.BeforeStart(ctx, st.Pid); err != nil {
			return true, fmt.Errorf("before start: %w", err)
		}
	}
	flags, err := r.restoreFlags(id, dir)
	if err != nil {
		return true, err
	}
	if err := r.runscStart(ctx, spec, "restore", nil, append(flags, "--image-path", dir)...); err != nil {
		return true, err
	}
	if _, err := os.Stat(r.restoreMark(id)); err == nil {
		if err := r.settleLimits(id); err != nil {
			return true, err
		}
		return true, os.Remove(r.restoreMark(id))
	}
	return true, nil
}

// rootfsBack mounts the root filesystem of sandbox id, which a Stop
// released after its checkpoint, again; hostBase is its uid range's
// start. What a Stop cut short left mounted goes first; a loop device
// still on the image is remountRootfs's to wait for (each look at the
// host's loop devices costs milliseconds, and a resume after a whole Stop
// needs none of the unmount's). One still mounted is kept. On an error
// nothing of it stays mounted.
func (r *Runtime) rootfsBack(ctx context.Context, id string, hostBase uint32) error {
	mps, err := diskimg.MountsUnder(r.dir(id))
	if err != nil {
		return err
	}
	if slices.Contains(mps, r.rootfs(id)) {
		return nil
	}
	if len(mps) > 0 {
		if err := r.unmountRootfs(ctx, id); err != nil {
			return err
		}
	}
	if err := r.remountRootfs(id, hostBase); err != nil {
		_ = r.unmountRootfs(ctx, id) // err says why; the sandbox stays stopped
		return err
	}
	return nil
}

// runscRestore runs `runsc restore` with args for sandbox spec, whose
// config sp (its own limits) is written, under the limits
// restoreResources lifts (runLifted), and sets its own again once runsc
// returns.
func (r *Runtime) runscRestore(ctx context.Context, spec runtime.Spec, sp *specs.Spec, args ...string) error {
	lifted, err := r.runLifted(ctx, spec, sp, "restore", args...)
	if err != nil || !lifted {
		return err
	}
	if err := r.setLimits(spec.ID, sp.Linux.Resources); err != nil {
		return err
	}
	return os.Remove(r.restoreMark(spec.ID))
}

// runLifted runs `runsc verb args` for sandbox spec, whose config sp (its
// own limits) is written, under the limits restoreResources lifts, if
// any (lifted says so): the config on disk is the lifted one while runsc
// runs, and its own again after, whatever runsc did. The cgroup runsc
// made keeps the lifted limits; the caller sets its own again (setLimits)
// and removes the mark, which holds them until then for a daemon killed
// in between (settleRestoreLimits).
func (r *Runtime) runLifted(ctx context.Context, spec runtime.Spec, sp *specs.Spec, verb string, args ...string) (lifted bool, err error) {
	own := sp.Linux.Resources
	up := restoreResources(own)
	if up == nil {
		return false, r.runscStart(ctx, spec, verb, nil, args...)
	}
	if err := r.markLifted(spec.ID, own); err != nil {
		return true, err
	}
	sp.Linux.Resources = up
	err = r.writeConfig(spec.ID, sp)
	sp.Linux.Resources = own
	if err == nil {
		err = r.runscStart(ctx, spec, verb, nil, args...)
	}
	if werr := r.writeConfig(spec.ID, sp); werr != nil {
		return true, errors.Join(err, werr)
	}
	return true, err
}

// markLifted writes sandbox id's restore mark, which holds its own limits
// own while a restore's are lifted.
func (r *Runtime) markLifted(id string, own *specs.LinuxResources) error {
	b, err := json.Marshal(own)
	if err != nil {
		return err
	}
	return os.WriteFile(r.restoreMark(id), b, 0o600)
}

// restoreResources are the limits a gVisor sandbox with limits res
// restores under, nil when none needs lifting: its CPU quota lifted
// (restoreCPU), the rest its own. Only for the restore: Restore sets the
// sandbox's own again as soon as runsc returns.
//
// The memory limit stays: the sentry reads the image through the page
// cache, charged to the sandbox's cgroup beside the memory it loads, and
// at a limit near the sandbox's use that costs reclaim (1 GiB held under
// a 1.25 GiB limit resumed in 0.90 s, with 4 GiB of room in 0.58 s,
// README); lifting it for the restore measured little faster (0.85 s),
// as setting it back reclaims those pages then, and that could fail.
func restoreResources(res *specs.LinuxResources) *specs.LinuxResources {
	if res == nil {
		return nil
	}
	cpu := restoreCPU(res.CPU)
	if cpu == nil {
		return nil
	}
	out := *res
	out.CPU = cpu
	return &out
}

// setLimits sets sandbox id's cgroup CPU quota to res's.
func (r *Runtime) setLimits(id string, res *specs.LinuxResources) error {
	if res == nil || res.CPU == nil || res.CPU.Quota == nil || *res.CPU.Quota <= 0 {
		return nil
	}
	return r.setCPUQuota(r.cgroupWriter(id), *res.CPU.Quota)
}

// restoreCPU is the CPU limit a gVisor sandbox with limit cpu restores
// under, nil when it needs none lifted: as many whole cores as its sentry
// has CPUs (runsc's --cpu-num-from-quota: the quota rounded up, at least
// 2). A restore loads the sandbox's whole memory back with many parallel
// readers beside the decode of its kernel state; under a one-core quota
// they wait for the quota more than for the disk (a 256 MiB resume: 0.51
// s p50 under 1 core against 0.38 s under 2, README). Only the cap is
// lifted, never the weight: on a busy host the restoring sandbox gets its
// share like any other, and it takes more only of cores nobody uses, for
// the restore alone; Restore sets the sandbox's own quota again as soon as
// runsc returns.
func restoreCPU(cpu *specs.LinuxCPU) *specs.LinuxCPU {
	if cpu == nil || cpu.Quota == nil || *cpu.Quota <= 0 || cpu.Period == nil || *cpu.Period == 0 {
		return nil
	}
	period := int64(*cpu.Period)
	cores := max((*cpu.Quota+period-1)/period, 2)
	if *cpu.Quota >= cores*period {
		return nil
	}
	lifted := *cpu
	lifted.Quota = ptr(cores * period)
	return &lifted
}

// restoreMark is the file that says sandbox id's limits are lifted for a
// restore (restoreResources); it holds the sandbox's own (the
// LinuxResources of its config, as JSON).
func (r *Runtime) restoreMark(id string) string { return filepath.Join(r.dir(id), "restore-limits") }

// settleRestoreLimits sets again the limits of every sandbox a daemon
// killed mid-restore left lifted (restoreResources), from its mark: in its
// config, which may hold the lifted ones, and in its cgroup, if it runs.
func (r *Runtime) settleRestoreLimits() {
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || !validID(id) {
			continue
		}
		if _, err := os.Stat(r.restoreMark(id)); err != nil {
			continue
		}
		if err := r.settleLimits(id); err != nil {
			r.log.Warn("restore_limits_not_set_again", "sandbox_id", id, "err", err)
			continue
		}
		_ = os.Remove(r.restoreMark(id))
	}
}

func (r *Runtime) settleLimits(id string) error {
	b, err := os.ReadFile(r.restoreMark(id))
	if err != nil {
		return err
	}
	var own *specs.LinuxResources
	if err := json.Unmarshal(b, &own); err != nil || own == nil {
		return fmt.Errorf("restore mark %s: %q", r.restoreMark(id), b)
	}
	path := filepath.Join(r.dir(id), "config.json")
	cfg, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var sp specs.Spec
	if err := json.Unmarshal(cfg, &sp); err != nil {
		return err
	}
	if sp.Linux == nil {
		return fmt.Errorf("config %s has no linux section", path)
	}
	sp.Linux.Resources = own
	if err := r.writeConfig(id, &sp); err != nil {
		return err
	}
	err = r.setLimits(id, own)
	if errors.Is(err, os.ErrNotExist) {
		return nil // not running: no cgroup to set
	}
	return err
}
