package runc

import (
	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/internal/runtime"
)

// agentMount is where the agent binary appears inside every sandbox.
const agentMount = "/.berth/berth-agent"

// agentOOMScoreAdj is the agent's oom_score_adj, inherited by everything it
// starts. 500 makes sandboxes (not host daemons, at 0) the preferred victims
// of a host-wide OOM. Within the sandbox's own memory cgroup the agent
// should outlive the workload: a process may raise its own score without
// privilege but never lower it below what the host set, so the agent is
// expected to raise the processes it spawns to 1000, which makes them the
// victims of a sandbox OOM while the agent keeps serving. The agent is not
// made unkillable (-1000): in a memory cgroup where nothing can be killed
// the OOM would hang instead.
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

// ociSpec builds the OCI runtime config for one sandbox. rootfs is the
// host path of its mounted overlay.
func (r *Runtime) ociSpec(s runtime.Spec, rootfs string) *specs.Spec {
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
	if s.PidsLimit > 0 {
		resources.Pids = &specs.LinuxPids{Limit: ptr(s.PidsLimit)}
	}

	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     append([]string{agentMount}, s.AgentArgs...),
			Env:      append([]string(nil), s.AgentEnv...),
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			// No RLIMIT_NPROC: it counts processes per real uid across the
			// whole host, and every sandbox's uid 0 is the same host uid
			// (UIDBase), so one sandbox's processes would use up every
			// other sandbox's allowance. The pids cgroup is the per-sandbox
			// cap.
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile},
			},
			NoNewPrivileges: true,
			OOMScoreAdj:     ptr(agentOOMScoreAdj),
		},
		Hostname: s.Hostname,
		Mounts:   r.mounts(s),
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: r.cfg.UIDBase, Size: r.cfg.UIDCount}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: r.cfg.UIDBase, Size: r.cfg.UIDCount}},
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
			},
			ReadonlyPaths: []string{
				"/proc/bus",
				"/proc/fs",
				"/proc/irq",
				"/proc/sys",
				"/proc/sysrq-trigger",
			},
		},
	}
}

// mounts returns the sandbox's mount list: the standard pseudo
// filesystems, a size-capped /dev/shm, a read-only /sys and the agent.
func (r *Runtime) mounts(s runtime.Spec) []specs.Mount {
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
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
	return ms
}
