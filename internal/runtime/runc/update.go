package runc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Update sets a running sandbox's CPU, memory and pids limits to what a
// create with them would have set (spec.go): the cgroup v2 files and the
// RLIMIT_NPROC of its init, which every process it starts inherits. The
// disk cap is the size of its image and cannot change. A warm-pool
// sandbox gets its claimer's limits this way.
//
// Only runc on cgroup v2: gVisor's host cgroup holds the sentry (its pids
// limit carries headroom) and v1 splits the files across hierarchies;
// those return errdefs.ErrNotImplemented and the caller makes a sandbox
// with the limits instead.
func (r *Runtime) Update(ctx context.Context, id string, l runtime.Limits) error {
	if r.cfg.GVisor != nil || !r.cg.v2 {
		return fmt.Errorf("update limits of %s: %w", id, errdefs.ErrNotImplemented)
	}
	dir := filepath.Join(r.cg.unified, r.cgroupsPath(id))
	write := func(file, val string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
			return fmt.Errorf("update limits of %s: %w", id, err)
		}
		return nil
	}
	if l.MemoryBytes > 0 {
		if err := write("memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
		if r.swapAcct {
			if err := write("memory.swap.max", "0"); err != nil {
				return err
			}
		}
	}
	if l.CPUMillis > 0 {
		const period = 100000
		if err := write("cpu.max", strconv.FormatInt(l.CPUMillis*period/1000, 10)+" "+strconv.Itoa(period)); err != nil {
			return err
		}
	}
	if l.PidsLimit > 0 {
		if err := write("pids.max", strconv.FormatInt(l.PidsLimit, 10)); err != nil {
			return err
		}
		if r.nsNproc {
			st, err := r.Inspect(ctx, id)
			if err != nil {
				return err
			}
			if st.Pid <= 0 {
				return fmt.Errorf("update limits of %s: not running: %w", id, errdefs.ErrFailedPrecondition)
			}
			n := uint64(l.PidsLimit) + uint64(l.PidsLimit)/8 + 16
			if err := unix.Prlimit(st.Pid, unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}, nil); err != nil {
				return fmt.Errorf("update limits of %s: RLIMIT_NPROC: %w", id, err)
			}
		}
	}
	return nil
}
