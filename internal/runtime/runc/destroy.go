package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	var errs []error
	st, ok, err := r.state(ctx, id)
	if err != nil {
		errs = append(errs, err)
	}
	if ok {
		if st.Status == "paused" {
			// A frozen init cannot die; thaw it so SIGKILL lands.
			if _, err := r.runcOutput(ctx, "resume", id); err != nil {
				r.log.Warn("resume before destroy failed", "sandbox_id", id, "err", err)
			}
		}
		// delete --force SIGKILLs init; the pid namespace then takes every
		// other process in the sandbox with it.
		if _, err := r.runcOutput(ctx, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
			errs = append(errs, err)
		}
	}
	// Whatever runc missed (a failed delete, a crash mid-create): the
	// cgroup knows every process the sandbox ever forked.
	if err := r.killCgroup(id); err != nil {
		errs = append(errs, err)
	}
	if err := r.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	// runc's own state, if its delete failed; the processes are gone now.
	if err := os.RemoveAll(filepath.Join(r.cfg.RuncRoot, id)); err != nil {
		errs = append(errs, err)
	}
	if err := unmountAll(ctx, r.dir(id)); err != nil {
		errs = append(errs, err)
	}
	if err := detachLoops(r.image(id)); err != nil {
		errs = append(errs, err)
	}
	if mps, err := mountsUnder(r.dir(id)); err != nil || len(mps) > 0 {
		errs = append(errs, fmt.Errorf("mounts left under %s: %v (%v)", r.dir(id), mps, err))
	} else if err := os.RemoveAll(r.dir(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	return nil
}
