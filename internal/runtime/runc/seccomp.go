package runc

import (
	goruntime "runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The seccomp profile is default-allow with a deny list: sandboxes run
// arbitrary agent workloads (compilers, language runtimes, browsers), and an
// allow list tight enough to matter breaks them. The deny list removes the
// kernel surfaces a sandbox has no business with and that carry most
// container-escape history. Capabilities and the user namespace already
// block most of these; seccomp is the second wall, and it also covers calls
// that need no capability at all (userfaultfd, io_uring, keyctl, ...).
//
// Denied calls fail with EPERM, which programs handle as "not allowed"
// rather than crashing the way they might on SIGSYS.

const (
	errnoEPERM  = 1
	errnoENOSYS = 38

	cloneNewUser = 0x10000000 // CLONE_NEWUSER
	afPacket     = 17         // AF_PACKET
	afINET       = 2          // AF_INET
	afINET6      = 10         // AF_INET6
	afVSOCK      = 40         // AF_VSOCK
	sockRaw      = 3          // SOCK_RAW
	sockTypeMask = 0xf        // type argument without SOCK_NONBLOCK/SOCK_CLOEXEC
	tiocsti      = 0x5412     // TIOCSTI
	tioclinux    = 0x541c     // TIOCLINUX

	// low32 masks an argument the kernel reads as a 32-bit int (socket's
	// family, ioctl's request). seccomp compares all 64 bits of the
	// register, so an equality rule on such an argument is bypassed by
	// setting any of the upper 32 bits, which the kernel then ignores:
	// ioctl(fd, 1<<32|TIOCSTI) passed the old rule and pushed input. The
	// hostile suite's tiocsti-highbits and socket-packet-highbits attacks
	// pin this.
	low32 = 0xffffffff
)

// deniedGroups lists the plainly denied syscalls, grouped by why. Names
// unknown on an architecture are skipped by runc's libseccomp.
// It is a read-only table.
var deniedGroups = []struct {
	why   string
	names []string
}{
	// Mount table changes: the sandbox's mounts are fixed by the host at
	// create time; new mounts (even in a nested namespace) are how
	// filesystem escapes start.
	{"mounts", []string{"mount", "umount", "umount2", "pivot_root",
		"fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr"}},
	// Looking into or writing other processes' memory: tracing would let
	// one sandbox process take over the agent (PID 1).
	{"process inspection", []string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp"}},
	// Kernel attack surface with a long CVE record and no agent use:
	// eBPF, perf, userfaultfd (stalls the kernel mid-copy in exploits),
	// io_uring (bypasses seccomp for the operations it performs).
	{"kernel surfaces", []string{"bpf", "perf_event_open", "userfaultfd",
		"io_uring_setup", "io_uring_enter", "io_uring_register"}},
	// The kernel keyring is not namespaced by the user namespace in a way
	// that isolates sandboxes from each other (same host uid range).
	{"keyring", []string{"keyctl", "add_key", "request_key"}},
	// Loading code into the kernel or replacing it.
	{"kernel modules and kexec", []string{"kexec_load", "kexec_file_load",
		"init_module", "finit_module", "delete_module", "create_module",
		"query_module", "get_kernel_syms"}},
	// Host-wide state: power, swap, process accounting, the system clock,
	// the kernel log.
	{"host state", []string{"reboot", "swapon", "swapoff", "acct",
		"settimeofday", "stime", "clock_settime", "clock_settime64",
		"adjtimex", "clock_adjtime", "clock_adjtime64", "syslog"}},
	// Joining other namespaces: the sandbox's namespaces are set up once.
	{"namespaces", []string{"setns"}},
	// File handles bypass path-based access checks (the "shocker" escape).
	{"file handles", []string{"name_to_handle_at", "open_by_handle_at"}},
	// fanotify groups are a per-user kernel pool (max_fanotify_groups,
	// charged up the user-namespace hierarchy) that file watching does not
	// need: inotify covers it. Unprivileged fanotify (FAN_REPORT_FID, Linux
	// 5.13+) would otherwise be open to every sandbox.
	{"fanotify", []string{"fanotify_init", "fanotify_mark"}},
	// Obsolete or host-administrative calls with no sandbox use.
	{"obsolete and admin", []string{"quotactl", "quotactl_fd", "vhangup", "lookup_dcookie",
		"nfsservctl", "uselib", "ustat", "sysfs", "_sysctl"}},
}

// seccompProfile returns the sandbox's seccomp filter for this host's
// architecture.
func seccompProfile() *specs.LinuxSeccomp {
	var syscalls []specs.LinuxSyscall
	for _, g := range deniedGroups {
		syscalls = append(syscalls, specs.LinuxSyscall{
			Names:    g.names,
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
		})
	}
	syscalls = append(syscalls,
		// New user namespaces give an unprivileged process a full
		// capability set over fresh namespaces: the entry point of most
		// recent kernel escapes. Other namespace types need CAP_SYS_ADMIN,
		// which the sandbox does not have.
		specs.LinuxSyscall{
			Names:    []string{"unshare", "clone"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
			Args: []specs.LinuxSeccompArg{{
				Index: 0, Value: cloneNewUser, ValueTwo: cloneNewUser, Op: specs.OpMaskedEqual,
			}},
		},
		// clone3 passes its flags in memory, which seccomp cannot read.
		// ENOSYS makes glibc and Go fall back to clone, whose flags the
		// rule above filters.
		specs.LinuxSyscall{
			Names:    []string{"clone3"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoENOSYS)),
		},
		// Raw and packet sockets forge traffic past the host's network
		// policy (spoofed sources, ARP); CAP_NET_RAW is dropped too.
		specs.LinuxSyscall{
			Names:    []string{"socket"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
			Args:     []specs.LinuxSeccompArg{int32Arg(0, afPacket)},
		},
		// vsock is not scoped by the network namespace: on a VM host it
		// reaches the hypervisor's services (and other guests' where the
		// host routes them) past the sandbox's netns and egress policy.
		// socketpair(AF_VSOCK) has no use either.
		specs.LinuxSyscall{
			Names:    []string{"socket", "socketpair"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
			Args:     []specs.LinuxSeccompArg{int32Arg(0, afVSOCK)},
		},
		// Kernel AIO contexts come from one host-wide pool (fs.aio-max-nr)
		// that any process can fill, after which every io_setup on the
		// machine fails, the host's included. ENOSYS, as for a kernel
		// without AIO: libaio users (databases, qemu) fall back to
		// threads, and glibc's POSIX aio never used these calls.
		specs.LinuxSyscall{
			Names:    []string{"io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents", "io_pgetevents_time64"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoENOSYS)),
		},
		// Raw IP sockets only: netlink sockets are SOCK_RAW too, and
		// glibc's getifaddrs, getaddrinfo(AI_ADDRCONFIG) and `ip` need
		// them. Conditions in one rule are ANDed.
		rawIPSocket(afINET),
		rawIPSocket(afINET6),
		// TIOCSTI pushes input into a terminal's queue: a sandboxed
		// process must not type commands into a terminal it shares with a
		// host session. TIOCLINUX has the same power on a console.
		specs.LinuxSyscall{
			Names:    []string{"ioctl"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
			Args:     []specs.LinuxSeccompArg{int32Arg(1, tiocsti)},
		},
		specs.LinuxSyscall{
			Names:    []string{"ioctl"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
			Args:     []specs.LinuxSeccompArg{int32Arg(1, tioclinux)},
		},
		// 32-bit x86 multiplexes sockets through socketcall, whose
		// arguments are in memory and cannot be filtered; glibc uses the
		// direct socket calls on any kernel we support.
		specs.LinuxSyscall{
			Names:    []string{"socketcall"},
			Action:   specs.ActErrno,
			ErrnoRet: ptr(uint(errnoEPERM)),
		},
	)
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: seccompArches(goruntime.GOARCH),
		Syscalls:      syscalls,
	}
}

// seccompArches lists the syscall ABIs the filter covers. The compat ABIs
// (x86 and x32 on amd64, arm on arm64) are listed so the deny rules apply
// to them too instead of leaving a 32-bit path around the filter.
func seccompArches(goarch string) []specs.Arch {
	switch goarch {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64, specs.ArchARM}
	default:
		return nil // the native ABI only
	}
}

func ptr[T any](v T) *T { return &v }

// rawIPSocket denies socket(family, SOCK_RAW|flags, …).
func rawIPSocket(family uint64) specs.LinuxSyscall {
	return specs.LinuxSyscall{
		Names:    []string{"socket"},
		Action:   specs.ActErrno,
		ErrnoRet: ptr(uint(errnoEPERM)),
		Args: []specs.LinuxSeccompArg{
			int32Arg(0, family),
			{Index: 1, Value: sockTypeMask, ValueTwo: sockRaw, Op: specs.OpMaskedEqual},
		},
	}
}

// int32Arg matches argument index when its low 32 bits equal v, whatever
// the upper bits hold (see low32). For OpMaskedEqual, Value is the mask and
// ValueTwo the datum.
func int32Arg(index uint, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: index, Value: low32, ValueTwo: v, Op: specs.OpMaskedEqual}
}
