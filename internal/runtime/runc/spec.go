package runc

import (
	"fmt"

	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/proto/envd"
)

// agentMount is where the agent binary appears inside every sandbox.
const agentMount = "/.berth/berth-agent"

// agentOOMScoreAdj is the agent's oom_score_adj. 500 makes sandboxes (not
// host daemons, at 0) the preferred victims of a host-wide OOM. Within the
// sandbox's own memory cgroup the agent must outlive the workload: a process
// may raise its own score without privilege but never lower it below what
// the host set, so the agent raises every process it starts to 1000
// (internal/agent), which makes them the victims of a sandbox OOM while the
// agent keeps serving. The agent is not made unkillable (-1000): in a memory
// cgroup where nothing can be killed the OOM would hang instead.
const agentOOMScoreAdj = 500

// capabilities are Docker's default set minus two:
//   - CAP_NET_RAW: raw and packet sockets let a sandbox forge packets
//     (spoofed sources, ARP/ND games) that the host's network policy is
//     not built to reason about; ping works without it via ICMP sockets.
//   - CAP_MKNOD: the sandbox gets a fixed set of device nodes; new nodes are
//     of no use to it and device nodes on a writable layer are an old
//     escape route.
//
// The set is a read-only table.
var capabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FSETID",
	"CAP_FOWNER",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETFCAP",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
	"CAP_KILL",
	"CAP_AUDIT_WRITE",
}

// ociVersion is the runtime-spec version the config declares. Every field
// Berth uses exists in 1.0.2, which Debian's runc 1.1 and crun 1.8 accept;
// crun refuses a newer version string than it knows, even for a config
// that uses nothing new.
const ociVersion = "1.0.2"

// nofileLimit is the sandbox's RLIMIT_NOFILE. runc applies rlimits from
// inside the user namespace, where a hard limit can only be lowered, so it
// is capped at the daemon's own.
func nofileLimit() uint64 {
	nofile := uint64(65536)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Max < nofile {
		nofile = lim.Max
	}
	return nofile
}

// rlimits are the sandbox's resource limits on top of its cgroups.
func (r *Runtime) rlimits(s runtime.Spec, nofile uint64) []specs.POSIXRlimit {
	rl := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}}
	if n := r.nprocLimit(sandboxPids(s.PidsLimit, r.workloadPids(s))); n > 0 {
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	// No core dumps: a crashing workload's memory image is written into the
	// sandbox's disk and fills it for nothing.
	rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_CORE", Hard: 0, Soft: 0})
	return append(rl, poolRlimits(r.sigpending, r.msgqueue)...)
}

// nprocLimit is the RLIMIT_NPROC behind a pids limit, 0 for none.
//
// runc: set only where the kernel counts it per user namespace (Linux
// 5.14 and later, ucounts): before that it counted processes per host
// uid, where a sandbox would also count the processes of whatever else
// runs as its uids (a daemon of an older Berth on the same range). It is
// a second wall behind the pids cgroup, for a host whose pids controller
// is missing or misconfigured, so it sits a little above the pids limit:
// the kernel counts a fork against RLIMIT_NPROC before it charges the
// cgroup, so at an equal value the rlimit refused the forks of a fork
// bomb first, and the cgroup, whose pids.events is what reports a
// sandbox hitting its limit, never saw one.
//
// gVisor: the sentry enforces it itself, per user of its own kernel,
// whatever the host kernel counts, so it is always set. Inside the
// sentry the two walls count differently: the agent's pids cgroup
// (internal/agent/pids.go) lets a task go when it exits, the rlimit only
// when its parent reaps it. A fork bomb's tasks are orphans the agent
// reaps as PID 1, and while the bomb churns hundreds of them wait as
// zombies (measured: at a limit of 512, about 530 zombies next to 50 live
// tasks). At runc's margin the bomb's forks then failed at the rlimit
// forever with the live count short of the limit, so the agent, which
// kills at the limit, never fired and the bomb churned on. With room for
// three times the limit in zombies the live count meets the limit first.
// A zombie has given its address space back, so it costs the host
// nothing but the sentry's record of it.
func (r *Runtime) nprocLimit(pids int64) uint64 {
	switch {
	case pids <= 0:
		return 0
	case r.cfg.GVisor != nil:
		return 4*uint64(pids) + 16
	case r.nsNproc:
		return uint64(pids) + uint64(pids)/8 + 16
	}
	return 0
}

// Per-user kernel pools a sandbox uid may use, below the sandbox-wide
// ceilings of its user namespace (see userns.go).
const (
	// sigpendingLimit is queued signals (sigqueue, POSIX timers) per
	// sandbox uid; the kernel's default for a small machine.
	sigpendingLimit = 4096
	// msgqueueLimit is POSIX message queue bytes per sandbox uid, the
	// kernel's default.
	msgqueueLimit = 819200
)

// poolRlimits bounds what one sandbox uid may take from kernel pools that
// are counted per user (ucounts) and would otherwise be bounded only by
// the daemon's own limits, which runc passes on.
//
// RLIMIT_RTPRIO and RLIMIT_NICE are 0: a real-time task is not subject to
// the CPU cgroup's bandwidth limit, so a SCHED_FIFO spinner would take whole
// host CPUs from its neighbours and the host.
func poolRlimits(sigpending, msgqueue uint64) []specs.POSIXRlimit {
	return []specs.POSIXRlimit{
		{Type: "RLIMIT_SIGPENDING", Hard: sigpending, Soft: sigpending},
		{Type: "RLIMIT_MSGQUEUE", Hard: msgqueue, Soft: msgqueue},
		{Type: "RLIMIT_RTPRIO", Hard: 0, Soft: 0},
		{Type: "RLIMIT_NICE", Hard: 0, Soft: 0},
	}
}

// cappedRlimit returns want, or the daemon's own hard limit of resource if
// that is lower: runc applies rlimits from inside the user namespace,
// where a hard limit can only be lowered.
func cappedRlimit(resource int, want uint64) uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(resource, &lim); err == nil && lim.Max < want {
		return lim.Max
	}
	return want
}

// nprocPerUserNS reports whether the kernel release (uname -r) counts
// RLIMIT_NPROC per user namespace, which Linux does since 5.14.
func nprocPerUserNS(release string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 5 || (major == 5 && minor >= 14)
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// ociSpec builds the OCI runtime config for one sandbox. rootfs is the
// host path of its mounted overlay; uid is the first host uid (and gid) of
// the sandbox's own range.
func (r *Runtime) ociSpec(s runtime.Spec, rootfs string, uid uint32) *specs.Spec {
	caps := append([]string(nil), capabilities...)
	nofile := r.nofile
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: s.NetNSPath}

	resources := &specs.LinuxResources{
		// Deny every device; runc adds back the standard nodes it creates
		// (null, zero, full, random, urandom, tty, ptmx, pts).
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if s.MemoryBytes > 0 {
		mem := &specs.LinuxMemory{Limit: ptr(s.MemoryBytes)}
		if r.swapAcct {
			// memory+swap equal to memory: no swap at all.
			mem.Swap = ptr(s.MemoryBytes)
		}
		resources.Memory = mem
	}
	if s.CPUMillis > 0 {
		const period = 100000
		resources.CPU = &specs.LinuxCPU{
			Period: ptr(uint64(period)),
			Quota:  ptr(s.CPUMillis * period / 1000),
		}
	}
	env := append(s.AgentSecret.Env(r.secretFD()), s.AgentEnv...)
	if s.PidsLimit > 0 {
		resources.Pids = &specs.LinuxPids{Limit: ptr(sandboxPids(s.PidsLimit, r.workloadPids(s)))}
	}
	if r.workloadPids(s) {
		work, root := workloadFDs(s)
		env = append(env, fmt.Sprintf("%s=%d,%d", envd.PidsTasksFDsEnv, work, root))
	}

	return &specs.Spec{
		Version: ociVersion,
		Root:    &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     append([]string{agentMount}, s.AgentArgs...),
			// The secret first: the first of two variables of one name is
			// the one a program reads.
			Env: env,
			Cwd: "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits: r.rlimits(s, nofile),
			// Off only on request (Spec.AllowSetuid): runc then loads
			// the seccomp filter while it still holds its namespace's
			// capabilities, before dropping to caps, so every process
			// is filtered either way.
			NoNewPrivileges: !s.AllowSetuid,
			OOMScoreAdj:     ptr(agentOOMScoreAdj),
		},
		Hostname: s.Hostname,
		Mounts:   r.mounts(s),
		Linux: &specs.Linux{
			UIDMappings: r.idMappings(uid),
			GIDMappings: r.idMappings(uid),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.UserNamespace},
				{Type: specs.CgroupNamespace},
				netns,
			},
			CgroupsPath: r.cgroupsPath(s.ID),
			Resources:   resources,
			Seccomp:     seccompProfile(),
			// runc's defaults: kernel internals and host hardware
			// information are masked, kernel knobs read-only.
			MaskedPaths: []string{
				"/proc/acpi",
				"/proc/asound",
				"/proc/kcore",
				"/proc/keys",
				"/proc/latency_stats",
				"/proc/timer_list",
				"/proc/timer_stats",
				"/proc/sched_debug",
				"/proc/scsi",
				"/sys/firmware",
				"/sys/devices/virtual/powercap",
				// Beyond runc's list: with a joined network namespace /sys
				// is the host's, bound recursively, and these submounts
				// come along. Their files are host root's and mostly 0600,
				// but what is readable describes the host kernel (tracing,
				// LSM policy, pinned BPF objects) and none of it is the
				// sandbox's business.
				"/sys/kernel/debug",
				"/sys/kernel/tracing",
				"/sys/kernel/security",
				"/sys/fs/bpf",
				"/proc/kmsg",
			},
			ReadonlyPaths: []string{
				"/proc/bus",
				"/proc/fs",
				"/proc/irq",
				"/proc/sys",
				"/proc/sysrq-trigger",
				// runc mounts cgroup v1 as a tmpfs holding one read-only
				// mount per controller, but leaves the tmpfs itself
				// writable (the hostile suite's cgroup-release-agent attack
				// made directories there). Nothing in it is a cgroup, yet a
				// writable /sys/fs/cgroup is a place to fake one for tools
				// that trust it.
				"/sys/fs/cgroup",
			},
		},
	}
}

// mounts returns the sandbox's mount list: the standard pseudo
// filesystems, a size-capped /dev/shm, a read-only /sys, the agent and
// then the sandbox's volumes.
func (r *Runtime) mounts(s runtime.Spec) []specs.Mount {
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: devptsOptions()},
		// Capped: /dev/shm is memory the memory cgroup charges, but a cap
		// keeps one sandbox's shm from being its whole memory budget.
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=64m"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
	}
	if s.NetNSPath == "" {
		ms = append(ms, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}})
	} else {
		// A fresh sysfs may only be mounted by the owner of the network
		// namespace, and a joined namespace belongs to the host. A
		// read-only bind of the host's /sys (with the masked paths) is
		// what rootless runtimes do in the same spot. It must be
		// recursive: from inside a user namespace the kernel refuses a
		// plain bind of a tree whose submounts are locked. Submounts keep
		// their own flags, but every file there is owned by host root,
		// which the sandbox's mapped uids cannot write.
		ms = append(ms, specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}})
	}
	ms = append(ms,
		// Read-only and scoped by the cgroup namespace: runtimes inside
		// (JVM, Node, Go) read their limits from here.
		specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		specs.Mount{Destination: agentMount, Type: "bind", Source: s.AgentPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	)
	return append(ms, r.volumeMounts(s)...)
}

// ptyMax is how many pseudo-terminals one sandbox may hold. PTYs come from
// one host-wide pool (kernel.pty.max, 4096 by default, of which
// kernel.pty.reserve, 1024, is kept for the host's own devpts): without a
// per-instance cap one sandbox takes every PTY the other sandboxes' shells
// need.
const ptyMax = 256

// devptsOptions are the mount options of the sandbox's own devpts
// instance, capped at ptyMax terminals.
func devptsOptions() []string {
	return []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5", fmt.Sprintf("max=%d", ptyMax)}
}
