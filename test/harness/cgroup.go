package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CgroupFile is the path of a file in the sandbox's own cgroup: on cgroup
// v1 in the controller's hierarchy (controller "pids", "cpu", "memory"),
// on v2 in the unified one. It returns "" if the sandbox has no such
// cgroup (yet, or any more).
func (d *Daemon) CgroupFile(id, controller, name string) string {
	rel := filepath.Join("berth-"+d.Instance, id, name)
	for _, root := range []string{filepath.Join("/sys/fs/cgroup", controller), "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		p := filepath.Join(root, rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// WorkloadPidsFile is the path of a file in the cgroup the sandbox's
// processes run in, as far as the pids controller goes: the workload
// cgroup below the sandbox's where the runtime made one (runc on a cgroup
// v1 host; its limit is the sandbox's, and the sandbox's own cgroup holds
// room for the agent's threads above it), otherwise the sandbox's own.
func (d *Daemon) WorkloadPidsFile(id, name string) string {
	if p := d.CgroupFile(id, "pids", filepath.Join("workload", name)); p != "" {
		return p
	}
	return d.CgroupFile(id, "pids", name)
}

// PidsV1 reports whether the host's pids controller is a cgroup v1
// hierarchy, where runc sandboxes with a pids limit get a workload cgroup.
func PidsV1() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup/pids", &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC
}

// CgroupProcs lists the processes with a task in the cgroup directory
// dir itself (v1: not its children's).
func CgroupProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// CgroupGone reports whether nothing is left of the sandbox's cgroups in
// any hierarchy: the kernel removes a cgroup directory only once no task
// is in it.
func (d *Daemon) CgroupGone(id string) bool {
	for _, root := range cgroupRoots {
		if _, err := os.Stat(filepath.Join(root, "berth-"+d.Instance, id)); err == nil {
			return false
		}
	}
	return true
}

// CgroupKV reads one "key value" line of a flat-keyed cgroup file such as
// pids.events ("max 12"), cpu.stat ("nr_throttled 3") or memory.events.
func CgroupKV(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == key {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no key %q in %q", path, key, b)
}

// CgroupInt reads a cgroup file holding one number (pids.current,
// pids.max; "max" reads as -1).
func CgroupInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// CgroupMemory is what the sandbox's memory cgroup holds (memory.current
// on v2, memory.usage_in_bytes on v1), -1 without one.
func (d *Daemon) CgroupMemory(id string) int64 {
	for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
		if p := d.CgroupFile(id, "memory", f); p != "" {
			if n, err := CgroupInt(p); err == nil {
				return n
			}
		}
	}
	return -1
}
