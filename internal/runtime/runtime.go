// Package runtime holds the backend-neutral types the sandbox Manager and
// every runtime backend (runc, gVisor; microVMs later) share: what to
// create and what a backend reports back. Backends live in sub-packages and
// the Manager never imports them; main wires one in.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// Spec says what one sandbox's isolation boundary must hold.
type Spec struct {
	// ID is the sandbox ID: lowercase [a-z0-9], unique on the host.
	ID string
	// Layers are read-only root filesystem layers, lowest first. Each is a
	// host directory whose ownership is already shifted into the sandbox's
	// uid range.
	Layers []string
	// DiskBytes caps what the sandbox may write to its root filesystem.
	DiskBytes int64
	// CPUMillis is the CPU quota in thousandths of a core (1000 = one core).
	CPUMillis int64
	// MemoryBytes caps memory (RAM; no swap).
	MemoryBytes int64
	// PidsLimit caps the number of tasks in the sandbox.
	PidsLimit int64
	// Hostname is the sandbox's UTS hostname.
	Hostname string
	// NetNSPath is an existing network namespace the sandbox joins.
	NetNSPath string
	// AgentPath is the host path of the berth-agent binary, bind-mounted
	// read-only into the sandbox and run as its PID 1.
	AgentPath string
	// AgentArgs are the agent's arguments (after argv[0]).
	AgentArgs []string
	// AgentEnv is the agent's environment, KEY=VALUE.
	AgentEnv []string
	// AgentSecret, when its Name is set, is one more variable of the
	// agent's environment that no other process of the sandbox may read
	// back (Secret).
	AgentSecret Secret
	// AgentPids says the agent holds the sandbox's processes to PidsLimit
	// itself, with the pids cgroup of the sandbox's own kernel (gVisor,
	// whose host-side cgroup counts the sentry's threads; berth-agent
	// --pids-max). The agent then starts with CAP_SYS_ADMIN to mount that
	// hierarchy and drops it before it serves. runc ignores it: its host
	// cgroup counts the sandbox's own tasks.
	AgentPids bool
	// WorkloadPids asks for a cgroup below the sandbox's for the
	// processes the agent starts, limited to PidsLimit, with the
	// sandbox's own cgroup a little above it (room for the agent's
	// threads; runc: 64): a workload that keeps its limit full then
	// leaves the agent room for the threads it needs. runc makes it on a
	// cgroup v1 host and hands the agent its "tasks" files
	// (envd.PidsTasksFDsEnv); elsewhere it is ignored, and the agent's
	// threads count in PidsLimit with the workload's.
	WorkloadPids bool
	// BeforeStart, when set, runs once the sandbox's namespaces exist,
	// with the host pid of the sandbox's init, and Create returns after
	// it. The Manager uses it to wire the sandbox's own network namespace
	// (owned by the sandbox's user namespace, so a fresh sysfs can be
	// mounted in it). An error aborts and undoes the create. Under runc
	// it runs while the agent starts (the agent needs no network to
	// start, and runs nothing else until the daemon asks). Under gVisor
	// the pid is a process holding the new network namespace the sandbox
	// will join (gVisor reads its interfaces when it starts, so they must
	// be wired first); only its /proc/<pid>/ns/net is meaningful.
	BeforeStart func(ctx context.Context, pid int) error
	// AllowSetuid leaves no_new_privs off, so a set-user-ID program (sudo)
	// can raise a process to the sandbox's root: root of the sandbox's
	// user namespace, a host uid of its own range, with the same bounding
	// set and seccomp filter as the agent. Off, every process in the
	// sandbox has no_new_privs. Under gVisor it takes a runsc with
	// --allow-suid (runsc.Runtime.RaisesSetuid); on another it has no
	// effect and no_new_privs stays on.
	AllowSetuid bool
	// RestoreImage, when set, makes Create start the sandbox from this
	// checkpoint image (one another sandbox's CheckpointLive wrote)
	// instead of booting its agent: every process of that sandbox, with
	// its memory, carries on in this one, on this one's root filesystem
	// (which must hold the files the image's sandbox had: its layers and
	// its writable layer as frozen with the image), network namespace,
	// hostname and limits. Only a runtime that can (CopiesMemory) takes
	// it; the agent arguments and mounts must be those the image's
	// sandbox was created with.
	RestoreImage string
	// Mounts are host directories bound into the sandbox over its root
	// filesystem (volumes), in order. Like Layers, each source is owned
	// by the runtime's canonical uid range, and the sandbox sees it
	// mapped onto its own: canonical uid base+N is the sandbox's uid N.
	// A Start, Restore or RestoreImage of a sandbox must be given the
	// same mounts it was created with.
	Mounts []Mount
}

// Mount is one host directory bound into a sandbox.
type Mount struct {
	// Source is an absolute host directory.
	Source string
	// Destination is an absolute path in the sandbox; it is made if
	// missing.
	Destination string
	// ReadOnly binds it read-only.
	ReadOnly bool
}

// Status is a backend's view of a sandbox's boundary.
type Status string

// The statuses a backend reports.
const (
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped"
	// StatusUnknown means the backend has no record of the sandbox.
	StatusUnknown Status = "unknown"
)

// State is what Inspect reports about one sandbox.
type State struct {
	ID     string
	Status Status
	// Pid is the host pid of the sandbox's init process (0 if not running).
	Pid int
}

// Stats is resource usage so far.
type Stats struct {
	CPUUsage    time.Duration // total CPU time consumed
	MemoryBytes int64         // current memory use
	MemoryMax   int64         // peak memory use
	MemoryLimit int64
	// PidsCurrent counts the tasks the pids limit holds: the workload
	// cgroup's where there is one (Spec.WorkloadPids), without the
	// agent's threads.
	PidsCurrent int64
	// PidsRefused counts the forks the pids limit refused so far
	// (pids.events "max"); 0 where the backend cannot tell.
	PidsRefused   int64
	OOMKills      int64 // OOM kills inside the sandbox so far
	DiskUsedBytes int64
	DiskBytes     int64
}

// Limits are the resource limits a running sandbox may be changed to
// (Spec's fields of the same names).
type Limits struct {
	CPUMillis   int64
	MemoryBytes int64
	PidsLimit   int64
}

// reservedPaths are the sandbox paths a Mount may not cover: the kernel's
// pseudo filesystems and where the agent lives.
var reservedPaths = []string{"/proc", "/sys", "/dev", "/.berth"}

// CheckMountDestination says why dst cannot be where a Mount appears in a
// sandbox: it must be absolute and clean, not the root, and not on or
// under /proc, /sys, /dev or /.berth (the agent's).
func CheckMountDestination(dst string) error {
	switch {
	case dst == "":
		return errors.New("empty path")
	case !strings.HasPrefix(dst, "/"):
		return fmt.Errorf("path %q is not absolute", dst)
	case path.Clean(dst) != dst:
		return fmt.Errorf("path %q is not clean (it would be %q)", dst, path.Clean(dst))
	case dst == "/":
		return errors.New("path / is the sandbox's root")
	case len(dst) > 4096:
		return fmt.Errorf("path is %d bytes, over 4096", len(dst))
	case strings.ContainsRune(dst, 0):
		return errors.New("path holds a NUL byte")
	}
	for _, r := range reservedPaths {
		if dst == r || strings.HasPrefix(dst, r+"/") {
			return fmt.Errorf("path %q is on %s, which the sandbox's runtime owns", dst, r)
		}
	}
	return nil
}

// ErrInitExited says a sandbox's init (under runc, its agent) exited
// before the sandbox was up: an agent that died while starting. A
// runtime that sees it during Create wraps it, with the agent's last
// words where it has them.
var ErrInitExited = errors.New("sandbox init exited before its agent answered")

// ExitsWithin reports whether a sandbox's init has exited, or exits
// within grace: watch returns a channel closed at its exit (a runtime's
// InitExited for that sandbox). A watch that fails, or ctx ending first,
// reports false.
func ExitsWithin(ctx context.Context, grace time.Duration, watch func(context.Context) (<-chan struct{}, error)) bool {
	ctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	done, err := watch(ctx)
	if err != nil {
		return false
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// Secret is a variable of the agent's environment that no other process
// of the sandbox may read back. /proc/1/environ shows the environment a
// process started with, whatever it unsets later: a runtime that can
// hands the value over through a pipe the agent inherits, and the agent's
// environment then holds FDName=<the pipe's descriptor> instead of
// Name=Value. Otherwise it is Name=Value there, and the agent drops it by
// executing itself again without it.
type Secret struct {
	Name, Value string
	// FDName is the variable that names the pipe's descriptor.
	FDName string
}

// Env is the secret as the environment carries it: Name=Value, or
// FDName=fd when it comes through descriptor fd (fd > 0); nil when it has
// no name.
func (s Secret) Env(fd int) []string {
	switch {
	case s.Name == "":
		return nil
	case fd > 0:
		return []string{s.FDName + "=" + strconv.Itoa(fd)}
	default:
		return []string{s.Name + "=" + s.Value}
	}
}
