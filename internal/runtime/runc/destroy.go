package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/diskimg"
)

// Destroy kills every process of the sandbox and removes all it left: the
// runc container, its cgroups, the rootfs and disk mounts, the loop device
// and StateDir/<id>. It is idempotent: nil when nothing is left. Each step
// runs even if an earlier one failed, so a partial failure still removes as
// much as it can; the state directory is removed only once nothing is
// mounted below it, so a failed unmount never turns into deleting the
// sandbox's layers through a live mount.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	start := time.Now()
	phases := phaseTimer{last: start}
	r.sentrySamples.Delete(id)
	r.runscAnswers.Delete(id)
	slot, hasSlot := r.slots.lookup(r.dir(id))
	errs := r.endProcesses(ctx, id, &phases)
	if err := diskimg.UnmountAll(ctx, r.dir(id)); err != nil {
		errs = append(errs, err)
	}
	phases.mark("unmount")
	if err := diskimg.DetachLoops(r.image(id)); err != nil {
		errs = append(errs, err)
	} else if err := waitLoopsGone(r.image(id), loopsGoneLimit); err != nil {
		// As in Stop: a process still dying holds the disk until it is gone.
		errs = append(errs, err)
	}
	if mps, err := diskimg.MountsUnder(r.dir(id)); err != nil || len(mps) > 0 {
		errs = append(errs, fmt.Errorf("mounts left under %s: %v (%v)", r.dir(id), mps, err))
	} else if err := os.RemoveAll(r.dir(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	phases.mark("remove")
	// The uid range goes back to the pool last, and only once everything
	// above worked: processes with its ids must be gone before another
	// sandbox can get them. A failed destroy keeps the claim for the next
	// attempt (or the next start's orphan sweep).
	if len(errs) == 0 {
		if err := r.slots.release(id, slot, hasSlot); err != nil {
			errs = append(errs, err)
		} else if hasSlot {
			r.idmaps.drop(hostBase(slot))
		}
	}
	r.log.Debug("sandbox destroyed", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	return nil
}

// endProcesses kills every process of sandbox id and removes what only
// running processes need: the runc container and its state, the cgroups
// and, on gVisor, the gofer. Destroy and Stop both start with it; every
// step runs even if an earlier one failed. phases gets a mark per step.
func (r *Runtime) endProcesses(ctx context.Context, id string, phases *phaseTimer) []error {
	var errs []error
	gofer := 0
	if r.cfg.GVisor != nil {
		r.resumeOld(ctx, id)
		gofer = r.goferPid(id)
	}
	// Kill first, through the cgroup, and ask the runtime nothing before:
	// the cgroup knows every process the sandbox ever forked (setsid and
	// double-forked ones too), the kill thaws a paused or frozen sandbox
	// so SIGKILL lands, it needs no answer from a sentry that may not
	// give one (runscstate.go), and it is much faster than letting runc
	// poll for its init to die.
	if err := r.killCgroup(ctx, id); err != nil {
		errs = append(errs, err)
	}
	phases.mark("kill")
	if err := r.deleteRecord(ctx, id); err != nil {
		errs = append(errs, err)
	}
	killGofer(gofer)
	phases.mark("runc_delete")
	if err := r.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	// runc's own state, if its delete failed; the processes are gone now.
	if err := r.removeState(id); err != nil {
		errs = append(errs, err)
	}
	phases.mark("cgroups")
	return errs
}

// deleteRecord runs the runtime's delete on id's container, if it has
// one. A gVisor sandbox whose sentry is gone (the cgroup kill got it)
// skips it: runsc would only take the flock, find the sandbox dead and
// remove its files, which removeState does without runsc.
func (r *Runtime) deleteRecord(ctx context.Context, id string) error {
	if !r.hasState(id) || (r.cfg.GVisor != nil && r.sentryGone(id)) {
		return nil
	}
	if _, err := r.runcOutput(ctx, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
		return err
	}
	return nil
}

// resumeOld thaws sandbox id if it is paused and its runsc is one that
// cannot delete a paused sandbox (GVisor.ResumeBeforeDelete). "Paused" is
// the state file's word, and a sentry that is dead or frozen is left to
// the kill: it would not answer.
func (r *Runtime) resumeOld(ctx context.Context, id string) {
	if !r.cfg.GVisor.ResumeBeforeDelete {
		return
	}
	rec, ok, err := r.readRunscRecord(id)
	if err != nil || !ok || rec.Status != "paused" || !r.sentryAlive(rec.sentryPid()) || r.cgroupFrozen(id) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	if _, err := r.runcOutput(ctx, "resume", id); err != nil {
		r.log.Warn("resume_before_delete", "sandbox_id", id, "err", err)
	}
}
