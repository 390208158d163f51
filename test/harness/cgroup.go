package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
