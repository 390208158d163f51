package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
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
	slot, hasSlot := r.slots.lookup(r.dir(id))
	errs := r.endProcesses(ctx, id, &phases)
	if err := unmountAll(ctx, r.dir(id)); err != nil {
		errs = append(errs, err)
	}
	phases.mark("unmount")
	if err := detachLoops(r.image(id)); err != nil {
		errs = append(errs, err)
	} else if err := waitLoopsGone(r.image(id), loopsGoneLimit); err != nil {
		// As in Stop: a process still dying holds the disk until it is gone.
		errs = append(errs, err)
	}
	if mps, err := mountsUnder(r.dir(id)); err != nil || len(mps) > 0 {
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
		// runsc cannot delete a paused sandbox (it panics on the
		// paused => stopped transition); thawed, it can.
		if st, ok, _ := r.state(ctx, id); ok && st.Status == "paused" {
			_, _ = r.runcOutput(ctx, "resume", id)
		}
		gofer = r.goferPid(id)
	}
	// Kill first, through the cgroup: it knows every process the sandbox
	// ever forked (setsid and double-forked ones too), thaws a paused
	// sandbox so SIGKILL lands, and is much faster than letting runc
	// poll for its init to die.
	if err := r.killCgroup(ctx, id); err != nil {
		errs = append(errs, err)
	}
	phases.mark("kill")
	if r.hasState(id) {
		if _, err := r.runcOutput(ctx, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
			errs = append(errs, err)
		}
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
