package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// cpuPeriod is the CFS period of every sandbox's CPU quota (spec.go).
const cpuPeriod = 100000

// Update sets a running sandbox's CPU, memory and pids limits to what a
// create with them would have set (spec.go): its cgroup files, on v2 and
// v1 hosts. The disk cap is the size of its image and cannot change. A
// warm-pool sandbox gets its claimer's limits this way.
//
// The RLIMIT_NPROC that backs the pids limit (nprocLimit in spec.go) is
// returned as nproc, for the sandbox's init to lower its own to (which
// every process it starts inherits): setting it from outside would take
// CAP_SYS_RESOURCE, which a daemon in a container may lack, and a `runc
// state` for the init's pid. It is the second wall behind the pids
// cgroup, which the host sets itself. 0: none to set.
//
// gVisor returns errdefs.ErrNotImplemented: its host cgroup holds the
// sentry (its pids limit carries headroom, and the sentry sizes itself
// at start); the caller makes a sandbox with the limits instead.
func (r *Runtime) Update(_ context.Context, id string, l runtime.Limits) (nproc uint64, err error) {
	if r.cfg.GVisor != nil {
		return 0, fmt.Errorf("update limits of %s: %w", id, errdefs.ErrNotImplemented)
	}
	return r.update(id, l)
}

func (r *Runtime) update(id string, l runtime.Limits) (uint64, error) {
	write := r.cgroupWriter(id)
	if l.MemoryBytes > 0 {
		if err := r.updateMemory(write, l.MemoryBytes); err != nil {
			return 0, err
		}
	}
	if l.CPUMillis > 0 {
		if err := r.setCPUQuota(write, l.CPUMillis*cpuPeriod/1000); err != nil {
			return 0, err
		}
	}
	if l.PidsLimit <= 0 {
		return 0, nil
	}
	work := r.workloadDir(id)
	if work != "" {
		if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte(strconv.FormatInt(l.PidsLimit, 10)), 0); err != nil {
			return 0, fmt.Errorf("update limits of %s: %w", id, err)
		}
	}
	total := sandboxPids(l.PidsLimit, work != "")
	if err := write("pids", "pids.max", total); err != nil {
		return 0, err
	}
	// The init lowers its own RLIMIT_NPROC: from outside it would take
	// CAP_SYS_RESOURCE (another user's process) and a `runc state` for
	// its pid.
	return r.nprocLimit(total), nil
}

// cgroupWriter returns a function that writes val into file of sandbox
// id's cgroup in controller's hierarchy (the unified one on v2).
func (r *Runtime) cgroupWriter(id string) func(controller, file string, val int64) error {
	return func(controller, file string, val int64) error {
		dir := filepath.Join(r.cg.controllers[controller], r.cgroupsPath(id))
		if r.cg.v2 {
			dir = filepath.Join(r.cg.unified, r.cgroupsPath(id))
		}
		s := strconv.FormatInt(val, 10)
		if file == "cpu.max" {
			s += " " + strconv.Itoa(cpuPeriod)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(s), 0); err != nil {
			return fmt.Errorf("update limits of %s: %w", id, err)
		}
		return nil
	}
}

// setCPUQuota sets the CPU bandwidth limit: quota µs every cpuPeriod.
func (r *Runtime) setCPUQuota(write func(controller, file string, val int64) error, quota int64) error {
	if r.cg.v2 {
		return write("cpu", "cpu.max", quota)
	}
	if err := write("cpu", "cpu.cfs_period_us", cpuPeriod); err != nil {
		return err
	}
	return write("cpu", "cpu.cfs_quota_us", quota)
}

// updateMemory sets the memory limit with no swap. On v1 the memory+swap
// limit may never be below the memory limit, so which goes first depends
// on whether the limit grows.
func (r *Runtime) updateMemory(write func(controller, file string, val int64) error, mem int64) error {
	if r.cg.v2 {
		if err := write("memory", "memory.max", mem); err != nil {
			return err
		}
		if r.swapAcct {
			return write("memory", "memory.swap.max", 0)
		}
		return nil
	}
	if !r.swapAcct {
		return write("memory", "memory.limit_in_bytes", mem)
	}
	if err := write("memory", "memory.limit_in_bytes", mem); err != nil {
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
		// Growing: memory+swap first.
		if err := write("memory", "memory.memsw.limit_in_bytes", mem); err != nil {
			return err
		}
		return write("memory", "memory.limit_in_bytes", mem)
	}
	return write("memory", "memory.memsw.limit_in_bytes", mem)
}
