package runc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime"
)

// cgroupLayout is where this host mounts its cgroup hierarchies. Both
// layouts are supported: pure v2 (unified), and v1 with one hierarchy per
// controller set (possibly with a v2 mount beside it, "hybrid").
type cgroupLayout struct {
	v2 bool
	// unified is the v2 mount point: /sys/fs/cgroup on v2 hosts, often
	// /sys/fs/cgroup/unified on hybrid ones ("" if none).
	unified string
	// controllers maps each v1 controller to its hierarchy's mount point.
	controllers map[string]string
	// mounts is every cgroup mount point; runc may create the sandbox's
	// directory in any of them, so teardown looks in all.
	mounts []string
}

// detectCgroups reads the host's cgroup mounts from mountinfo.
func detectCgroups() (cgroupLayout, error) {
	l := cgroupLayout{controllers: map[string]string{}}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		l.v2, l.unified = true, "/sys/fs/cgroup"
		l.mounts = []string{l.unified}
		return l, nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return l, err
	}
	for _, m := range mounts {
		mp := m.Mountpoint
		switch m.FSType {
		case "cgroup2":
			if l.unified == "" {
				l.unified = mp
				l.mounts = append(l.mounts, mp)
			}
		case "cgroup":
			l.mounts = append(l.mounts, mp)
			for _, opt := range strings.Split(m.VFSOptions, ",") {
				if _, dup := l.controllers[opt]; !dup {
					l.controllers[opt] = mp
				}
			}
		}
	}
	if len(l.controllers) == 0 && l.unified == "" {
		return l, errors.New("no cgroup hierarchy mounted")
	}
	if l.controllers["memory"] == "" || l.controllers["pids"] == "" {
		return l, errors.New("cgroup v1 host without memory or pids controller")
	}
	return l, nil
}

// swapAccounting reports whether memory+swap limits can be set.
func (l cgroupLayout) swapAccounting() bool {
	if !l.v2 {
		_, err := os.Stat(filepath.Join(l.controllers["memory"], "memory.memsw.limit_in_bytes"))
		return err == nil
	}
	// The root has no memory.swap.max; any first-level child does when
	// swap accounting is on.
	m, _ := filepath.Glob(filepath.Join(l.unified, "*", "memory.swap.max"))
	return len(m) > 0
}

// cgroupsPath is the sandbox's cgroup path relative to each hierarchy's
// root, as runc's linux.cgroupsPath wants it (cgroupfs driver).
func (r *Runtime) cgroupsPath(id string) string {
	return "/" + r.cfg.CgroupParent + "/" + id
}

// cgroupDirs returns the sandbox's cgroup directory in every hierarchy.
func (r *Runtime) cgroupDirs(id string) []string {
	var out []string
	for _, m := range r.cg.mounts {
		out = append(out, filepath.Join(m, r.cgroupsPath(id)))
	}
	return out
}

// procsDir is a hierarchy in which the sandbox's process list is complete.
func (r *Runtime) procsDir(id string) string {
	if r.cg.v2 {
		return filepath.Join(r.cg.unified, r.cgroupsPath(id))
	}
	return filepath.Join(r.cg.controllers["pids"], r.cgroupsPath(id))
}

// cgroupProcs lists the pids in dir and all its descendants.
func cgroupProcs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// removeCgroups removes the sandbox's cgroup directories (children first)
// in every hierarchy.
func (r *Runtime) removeCgroups(id string) error {
	var errs []error
	for _, dir := range r.cgroupDirs(id) {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirRetry(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// rmdirRetry removes a cgroup directory; EBUSY right after the last
// process died is transient.
func rmdirRetry(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// agentPidsRoom is how far the sandbox cgroup's pids limit sits above its
// workload cgroup's (runtime.Spec.WorkloadPids): room for the agent's own
// threads, about ten idle and more while many of its calls block at once.
const agentPidsRoom = 64

// workloadCgroup is the workload cgroup's directory in the sandbox's.
const workloadCgroup = "workload"

// workloadPids reports whether sandbox s gets a workload cgroup
// (runtime.Spec.WorkloadPids): asked for, with a pids limit, under runc,
// on a host whose pids controller is a cgroup v1 hierarchy. There a
// single thread moves between cgroups (their "tasks" files) and a cgroup
// holds tasks beside its children, so the agent stays in the sandbox's
// cgroup and forks from a thread it moved into the workload's for the
// moment (as under gVisor, agent.PidsCgroup). On cgroup v2 the same needs
// a threaded subtree, and runc refuses to enter a cgroup in one with
// memory or CPU limits: not made there (the agent then keeps its thread
// reserve, agent.ReserveThreads).
func (r *Runtime) workloadPids(s runtime.Spec) bool {
	return s.WorkloadPids && s.PidsLimit > 0 && r.cfg.GVisor == nil && !r.cg.v2 && r.cg.controllers["pids"] != ""
}

// pidsDir is sandbox id's cgroup in the v1 pids hierarchy.
func (r *Runtime) pidsDir(id string) string {
	return filepath.Join(r.cg.controllers["pids"], r.cgroupsPath(id))
}

// workloadDir is sandbox id's workload cgroup, "" where it has none.
func (r *Runtime) workloadDir(id string) string {
	if r.cg.v2 || r.cg.controllers["pids"] == "" {
		return ""
	}
	dir := filepath.Join(r.pidsDir(id), workloadCgroup)
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	return dir
}

// sandboxPids is the sandbox cgroup's pids limit for a workload limit of
// limit: the same, or with room for the agent above a workload cgroup.
func sandboxPids(limit int64, workload bool) int64 {
	if workload {
		return limit + agentPidsRoom
	}
	return limit
}

// workloadTasks makes sandbox id's workload cgroup with pids.max limit
// (before runc makes the sandbox's, which it then joins as it is) and
// opens its and the sandbox cgroup's "tasks" files for writing, for the
// agent (envd.PidsTasksFDsEnv). Opened here, as root: the kernel checks a
// task's move against the credentials its file was opened with, so the
// agent moves its threads with these, and no process of the sandbox can
// open the files itself. The caller closes both once runc has handed
// them over.
func (r *Runtime) workloadTasks(id string, limit int64) (work, root *os.File, err error) {
	dir := filepath.Join(r.pidsDir(id), workloadCgroup)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("workload cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		return nil, nil, fmt.Errorf("workload cgroup: %w", err)
	}
	if work, err = os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0); err != nil {
		return nil, nil, fmt.Errorf("workload cgroup: %w", err)
	}
	if root, err = os.OpenFile(filepath.Join(r.pidsDir(id), "tasks"), os.O_WRONLY, 0); err != nil {
		work.Close()
		return nil, nil, fmt.Errorf("workload cgroup: %w", err)
	}
	return work, root, nil
}

// workloadFDs are the descriptors the agent of sandbox s finds the
// workload cgroup's and the sandbox cgroup's tasks files on: runc hands
// the container its descriptors from 3 on (--preserve-fds), the secret's
// pipe first where there is one (secretFD).
func workloadFDs(s runtime.Spec) (work, root int) {
	work = 3
	if s.AgentSecret.Name != "" {
		work = 4
	}
	return work, work + 1
}
