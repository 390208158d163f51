package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Attacks on kernel pools shared beyond the sandbox. A hog takes all it
// can of one pool, across as many sandbox uids as it needs (sandbox root
// can become any of them, and the kernel counts many pools per uid), then
// prints "holding: ..." and keeps what it took until killed, so the test
// can check from the host that host root and a neighbour still get the
// resource.

func poolTable() map[string]func([]string) {
	return map[string]func([]string){
		"hog":     hog,
		"hog-one": hogOne,
		"take-one": func(a []string) {
			// Not an attack: the neighbour's check that it still gets one.
			if len(a) < 1 {
				failed("take-one needs a pool")
			}
			if _, err := take(a[0], 1); err != nil {
				failed("take one %s: %v", a[0], err)
			}
			fmt.Println("took one", a[0])
		},
		"fanotify": func([]string) {
			// FAN_CLASS_NOTIF|FAN_REPORT_FID: the unprivileged mode.
			_, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID, unix.O_RDONLY)
			expectErr("fanotify_init(FAN_REPORT_FID)", err)
		},
		"io-setup": func([]string) {
			var ctx uintptr
			_, _, e := unix.RawSyscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&ctx)), 0)
			expectErr("io_setup", errno(0, 0, e))
		},
		"socket-vsock": func([]string) {
			_, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
			expectErr("socket(AF_VSOCK)", err)
		},
		"socket-vsock-highbits": func([]string) {
			_, _, e := unix.RawSyscall(unix.SYS_SOCKET, 1<<32|unix.AF_VSOCK, unix.SOCK_DGRAM, 0)
			expectErr("socket(1<<32|AF_VSOCK)", errno(0, 0, e))
		},
		"sched-fifo": func([]string) {
			// A real-time task escapes the CPU cgroup's quota.
			p := struct{ prio int32 }{1}
			_, _, e := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, 0, 1 /* SCHED_FIFO */, uintptr(unsafe.Pointer(&p)))
			expectErr("sched_setscheduler(SCHED_FIFO)", errno(0, 0, e))
		},
	}
}

// hog kind: takes the pool named kind across uids 0, 1, 2, ... until a
// uid gets nothing more (the sandbox-wide bound) or 64 uids were used.
func hog(a []string) {
	if len(a) < 1 {
		failed("hog needs a pool")
	}
	kind := a[0]
	if kind == "pty" {
		// Not per uid: one devpts instance per sandbox.
		n, err := take(kind, 1<<20)
		fmt.Printf("holding: %s %d (then %v)\n", kind, n, err)
		holdForever()
	}
	total, uids := 0, 0
	var last string
	for u := 0; u < 64; u++ {
		c := exec.Command("/proc/self/exe", "hog-one", kind)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u), Gid: uint32(u), Groups: []uint32{}}}
		c.Stderr = os.Stderr
		if _, err := c.StdinPipe(); err != nil { // held open: the child waits on it
			failed("pipe: %v", err)
		}
		out, err := c.StdoutPipe()
		if err != nil {
			failed("pipe: %v", err)
		}
		if err := c.Start(); err != nil {
			failed("start uid %d: %v", u, err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		f := strings.SplitN(strings.TrimSpace(line), " ", 2)
		n, err := strconv.Atoi(f[0])
		if err != nil {
			failed("uid %d said %q", u, line)
		}
		if len(f) > 1 {
			last = f[1]
		}
		total += n
		uids++
		if n == 0 {
			break
		}
	}
	fmt.Printf("holding: %s %d over %d uids (then %s)\n", kind, total, uids, last)
	holdForever()
}

// holdForever keeps the process, and what it holds, alive until killed.
func holdForever() {
	for {
		time.Sleep(time.Hour)
	}
}

// hogOne takes what this uid can of one pool, prints "<count> <error>"
// and holds it until its stdin closes.
func hogOne(a []string) {
	n, err := take(a[0], 1<<20)
	fmt.Printf("%d %v\n", n, err)
	bufio.NewReader(os.Stdin).ReadString('\n')
}

// take allocates from pool until the kernel refuses; it returns how many
// it got and the refusal.
func take(kind string, max int) (int, error) {
	n := 0
	for ; n < max; n++ {
		var err error
		switch kind {
		case "inotify":
			_, err = unix.InotifyInit1(unix.IN_CLOEXEC)
		case "timers":
			err = timerCreate()
		case "mqueue":
			err = mqOpen(fmt.Sprintf("/take-%d-%d-%d", os.Getuid(), os.Getpid(), n))
		case "pty":
			_, err = unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		case "pipes":
			err = bigPipe()
		case "scm":
			err = sendRights()
		default:
			failed("no pool %q", kind)
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// timerCreate makes a POSIX timer that never fires; the kernel charges
// its preallocated signal to the caller's queued-signal count.
func timerCreate() error {
	var ev [64]byte
	*(*int32)(unsafe.Pointer(&ev[12])) = 1 // sigev_notify = SIGEV_NONE
	var id int32
	_, _, e := unix.RawSyscall(unix.SYS_TIMER_CREATE, uintptr(unix.CLOCK_MONOTONIC), uintptr(unsafe.Pointer(&ev[0])), uintptr(unsafe.Pointer(&id)))
	return errno(0, 0, e)
}

// mqOpen creates a POSIX message queue of 10 messages of 8 KiB, charged
// to the caller's RLIMIT_MSGQUEUE.
func mqOpen(name string) error {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return err
	}
	attr := [8]int64{0, 10, 8192}
	_, _, e := unix.RawSyscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600, uintptr(unsafe.Pointer(&attr[0])), 0, 0)
	return errno(0, 0, e)
}

// bigPipe makes a pipe of 1 MiB (256 pages), counted against the uid's
// fs.pipe-user-pages-soft.
func bigPipe() error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	_, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, 1<<20)
	return err
}

// scmSock is the sending end of the socket pair sendRights fills.
var scmSock = -1

// sendRights sends 253 descriptors (SCM_MAX_FD) over a unix socket and
// never receives them: they stay in flight, counted against the sending
// uid's RLIMIT_NOFILE. A full socket buffer moves on to a new pair.
func sendRights() error {
	if scmSock < 0 {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		scmSock = p[0]
	}
	fds := make([]int, 253)
	for i := range fds {
		fds[i] = scmSock
	}
	err := unix.Sendmsg(scmSock, []byte{'x'}, unix.UnixRights(fds...), nil, 0)
	if err == unix.EAGAIN {
		scmSock = -1
		return sendRights()
	}
	return err
}
