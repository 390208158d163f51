// Command attacker is the hostile suite's attack tool: a static binary the
// tests copy into a sandbox and run there, for the system calls busybox
// cannot make. Each subcommand tries one escape and reports the outcome on
// stdout: "blocked: <why>" with exit status 0 when the sandbox held, or
// "ESCAPED: <what>" with exit status 3 when it did not. Exit status 2 means
// the attack could not be attempted at all.
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "setuid":
		asUserViaSetuid(os.Args[2:])
	case "raised":
		raised(os.Args[2:])
	}
	fn, ok := table()[os.Args[1]]
	if !ok {
		fn, ok = poolTable()[os.Args[1]]
	}
	if !ok {
		fn, ok = floods()[os.Args[1]]
	}
	if !ok {
		usage()
	}
	fn(os.Args[2:])
}

func usage() {
	names := []string{}
	for n := range table() {
		names = append(names, n)
	}
	for n := range poolTable() {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: attacker {%s} [args]\n", strings.Join(names, "|"))
	os.Exit(2)
}

func blocked(format string, args ...any) {
	fmt.Printf("blocked: "+format+"\n", args...)
	os.Exit(0)
}

func escaped(format string, args ...any) {
	fmt.Printf("ESCAPED: "+format+"\n", args...)
	os.Exit(3)
}

func failed(format string, args ...any) {
	fmt.Printf("could not attempt: "+format+"\n", args...)
	os.Exit(2)
}

// expectErr ends the attack: an error is the sandbox holding.
func expectErr(what string, err error) {
	if err != nil {
		blocked("%s: %v (%s)", what, err, errnoName(err))
	}
	escaped("%s succeeded", what)
}

func errnoName(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return "?"
}

func errno(_, _ uintptr, e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// table maps subcommand names to attacks.
func table() map[string]func([]string) {
	return map[string]func([]string){
		"userns": func([]string) { expectErr("unshare(CLONE_NEWUSER)", unix.Unshare(unix.CLONE_NEWUSER)) },
		"userns-clone": func([]string) {
			r, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
			if e == 0 && r == 0 {
				unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
			}
			if e == 0 {
				var ws unix.WaitStatus
				unix.Wait4(int(r), &ws, 0, nil)
			}
			expectErr("clone(CLONE_NEWUSER)", errno(0, 0, e))
		},
		"clone3": func([]string) {
			// struct clone_args with flags = CLONE_NEWUSER, exit_signal = SIGCHLD.
			args := [11]uint64{unix.CLONE_NEWUSER, 0, 0, 0, uint64(unix.SIGCHLD)}
			r, _, e := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args), 0)
			if e == 0 && r == 0 {
				unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
			}
			expectErr("clone3(CLONE_NEWUSER)", errno(0, 0, e))
		},
		"unshare-mount": func([]string) { expectErr("unshare(CLONE_NEWNS)", unix.Unshare(unix.CLONE_NEWNS)) },
		"mount": func([]string) {
			os.MkdirAll("/tmp/mnt", 0o755)
			expectErr("mount tmpfs", unix.Mount("none", "/tmp/mnt", "tmpfs", 0, ""))
		},
		"remount-proc": func([]string) {
			expectErr("remount /proc/sys rw", unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND, ""))
		},
		"umount-mask": func([]string) { expectErr("umount /proc/kcore", unix.Unmount("/proc/kcore", unix.MNT_DETACH)) },
		"fsopen": func([]string) {
			_, err := unix.Fsopen("tmpfs", 0)
			expectErr("fsopen(tmpfs)", err)
		},
		"open-tree": func([]string) {
			_, err := unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE)
			expectErr("open_tree(/)", err)
		},
		"pivot-root": func([]string) { expectErr("pivot_root", unix.PivotRoot("/tmp", "/tmp")) },
		"ptrace-pid1": func([]string) {
			expectErr("ptrace(PTRACE_ATTACH, 1)", unix.PtraceAttach(1))
		},
		"ptrace-seize": func([]string) {
			_, _, e := unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, 1, 0, 0, 0, 0)
			expectErr("ptrace(PTRACE_SEIZE, 1)", errno(0, 0, e))
		},
		"process-vm-readv": func([]string) {
			buf := make([]byte, 8)
			local := []unix.Iovec{{Base: &buf[0], Len: 8}}
			remote := []unix.RemoteIovec{{Base: 0x400000, Len: 8}}
			_, err := unix.ProcessVMReadv(1, local, remote, 0)
			expectErr("process_vm_readv(1)", err)
		},
		"pid1-mem": func([]string) {
			f, err := os.OpenFile("/proc/1/mem", os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			expectErr("open /proc/1/mem for write", err)
		},
		"pid1-environ": func([]string) {
			b, err := os.ReadFile("/proc/1/environ")
			if err == nil && strings.Contains(string(b), "TOKEN") {
				escaped("read the agent's environment: %d bytes with its token", len(b))
			}
			if err == nil {
				blocked("environ readable but holds no token")
			}
			expectErr("read /proc/1/environ", err)
		},
		"keyctl": func([]string) {
			_, err := unix.KeyctlJoinSessionKeyring("hostile")
			expectErr("keyctl(JOIN_SESSION_KEYRING)", err)
		},
		"add-key": func([]string) {
			_, err := unix.AddKey("user", "hostile", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
			expectErr("add_key", err)
		},
		"socket-packet": func([]string) {
			_, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)
			expectErr("socket(AF_PACKET)", err)
		},
		"socket-raw": func([]string) {
			_, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
			expectErr("socket(AF_INET, SOCK_RAW)", err)
		},
		"socket-raw6": func([]string) {
			_, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
			expectErr("socket(AF_INET6, SOCK_RAW|SOCK_CLOEXEC)", err)
		},
		"socket-packet-highbits": func([]string) {
			// The kernel reads socket's family as a 32-bit int; a filter
			// comparing all 64 bits misses a value with high bits set.
			_, _, e := unix.RawSyscall(unix.SYS_SOCKET, 1<<32|unix.AF_PACKET, unix.SOCK_DGRAM, 0x0300)
			expectErr("socket(1<<32|AF_PACKET)", errno(0, 0, e))
		},
		"socket-netlink": func([]string) {
			// Not an attack: netlink must keep working (getifaddrs).
			fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
			if err != nil {
				failed("netlink socket: %v", err)
			}
			unix.Close(fd)
			fmt.Println("netlink ok")
		},
		"io-uring": func([]string) {
			params := make([]byte, 120)
			_, _, e := unix.RawSyscall(unix.SYS_IO_URING_SETUP, 8, uintptr(unsafe.Pointer(&params[0])), 0)
			expectErr("io_uring_setup", errno(0, 0, e))
		},
		"bpf": func([]string) {
			attr := make([]byte, 128)
			// BPF_MAP_CREATE of an array map: needs no program.
			*(*uint32)(unsafe.Pointer(&attr[0])) = 2
			*(*uint32)(unsafe.Pointer(&attr[4])) = 4
			*(*uint32)(unsafe.Pointer(&attr[8])) = 4
			*(*uint32)(unsafe.Pointer(&attr[12])) = 1
			_, _, e := unix.RawSyscall(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr[0])), 128)
			expectErr("bpf(BPF_MAP_CREATE)", errno(0, 0, e))
		},
		"perf-event": func([]string) {
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
			attr.Size = uint32(unsafe.Sizeof(attr))
			_, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
			expectErr("perf_event_open", err)
		},
		"userfaultfd": func([]string) {
			_, _, e := unix.RawSyscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
			expectErr("userfaultfd", errno(0, 0, e))
		},
		"open-by-handle": func([]string) {
			h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
			_, err := unix.OpenByHandleAt(unix.AT_FDCWD, h, unix.O_RDONLY)
			expectErr("open_by_handle_at", err)
		},
		"setns": func([]string) {
			fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY, 0)
			if err != nil {
				failed("open ns: %v", err)
			}
			expectErr("setns", unix.Setns(fd, 0))
		},
		"kexec": func([]string) {
			_, _, e := unix.RawSyscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
			expectErr("kexec_load", errno(0, 0, e))
		},
		"init-module": func([]string) {
			expectErr("init_module", unix.InitModule([]byte("\x7fELF"), ""))
		},
		"reboot": func([]string) {
			expectErr("reboot(CAD_OFF)", unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF))
		},
		"settime": func([]string) {
			tv := unix.NsecToTimeval(0)
			expectErr("settimeofday", unix.Settimeofday(&tv))
		},
		"swapon": func([]string) {
			p, _ := unix.BytePtrFromString("/tmp/swap")
			_, _, e := unix.RawSyscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), 0, 0)
			expectErr("swapon", errno(0, 0, e))
		},
		"mknod-block": func([]string) {
			expectErr("mknod b 8 0", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
		},
		"mknod-mem": func([]string) {
			expectErr("mknod c 1 1 (/dev/mem)", unix.Mknod("/tmp/mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))))
		},
		"tiocsti": func(a []string) { tiocsti(0) },
		"tiocsti-highbits": func(a []string) {
			// ioctl's request is a 32-bit int to the kernel.
			tiocsti(1 << 32)
		},
		"exe-write": func([]string) {
			// CVE-2019-5736: rewrite the runtime binary through
			// /proc/<pid>/exe. PID 1 is the agent, bind-mounted read-only;
			// runc itself never runs inside the sandbox's pid namespace
			// after start.
			for _, p := range []string{"/proc/self/exe", "/proc/1/exe", "/.berth/berth-agent"} {
				f, err := os.OpenFile(p, os.O_WRONLY, 0)
				if err == nil {
					f.Close()
					escaped("opened %s for writing", p)
				}
				fmt.Printf("%s: %v\n", p, err)
			}
			blocked("no runtime binary writable")
		},
		"chroot-escape": func(a []string) {
			// The classic chroot breakout: chroot into a subdirectory, then
			// walk up from a cwd left outside it. runc pivots into a new
			// mount namespace, so "up" ends at the sandbox's own root.
			os.MkdirAll("/tmp/jail", 0o755)
			if err := unix.Chroot("/tmp/jail"); err != nil {
				blocked("chroot: %v", err)
			}
			for i := 0; i < 64; i++ {
				unix.Chdir("..")
			}
			if err := unix.Chroot("."); err != nil {
				blocked("chroot .: %v", err)
			}
			for _, p := range a {
				if _, err := os.Stat(p); err == nil {
					escaped("host path %s visible after chroot breakout", p)
				}
			}
			blocked("breakout ends at the sandbox root")
		},
		"nofile": func([]string) {
			// Opens files until the limit; reports how many.
			n := 0
			var err error
			for n < 200000 {
				if _, err = unix.Open("/dev/null", unix.O_RDONLY, 0); err != nil {
					break
				}
				n++
			}
			fmt.Printf("opened %d: %v\n", n, err)
			if n >= 100000 {
				escaped("opened %d files", n)
			}
			blocked("stopped at %d open files: %v", n, err)
		},
		"inodes": func(a []string) {
			// Creates empty files until the filesystem runs out, in
			// the directory given after the count (default /tmp/inodes).
			dir := "/tmp/inodes"
			if len(a) > 1 {
				dir = a[1]
			}
			os.MkdirAll(dir, 0o755)
			limit := 2000000
			if len(a) > 0 {
				limit, _ = strconv.Atoi(a[0])
			}
			n := 0
			var err error
			for ; n < limit; n++ {
				var fd int
				fd, err = unix.Open(dir+"/"+strconv.Itoa(n), unix.O_CREAT|unix.O_WRONLY, 0o644)
				if err != nil {
					break
				}
				unix.Close(fd)
			}
			fmt.Printf("created %d: %v\n", n, err)
			if err == nil {
				escaped("created %d files without running out", n)
			}
			blocked("created %d files, then %v", n, err)
		},
	}
}

// tiocsti pushes a byte into the input queue of the attacker's own
// controlling terminal, with extra bits in the ioctl request.
func tiocsti(high uintptr) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		failed("open ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		failed("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		failed("ptsname: %v", err)
	}
	if _, err := unix.Setsid(); err != nil && !errors.Is(err, unix.EPERM) {
		failed("setsid: %v", err)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR, 0)
	if err != nil {
		failed("open pts: %v", err)
	}
	if err := unix.IoctlSetInt(int(pts.Fd()), unix.TIOCSCTTY, 0); err != nil {
		failed("TIOCSCTTY: %v", err)
	}
	c := byte('x')
	_, _, e := unix.Syscall(unix.SYS_IOCTL, pts.Fd(), high|unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	expectErr(fmt.Sprintf("ioctl(%#x)", high|unix.TIOCSTI), errno(0, 0, e))
}
