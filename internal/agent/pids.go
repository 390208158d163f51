package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PidsCgroup holds the processes the agent starts to a number of tasks
// with the pids cgroup of the sandbox's own kernel. Under gVisor the
// host's pids cgroup cannot do it: it counts the sentry's threads and, on
// the ptrace platform, stub threads that pile up without bound while a
// fork bomb churns (subprocesses are pooled and never killed, and each
// gains a stub thread per sentry thread that ever ran it). Measured here:
// with 1,024 sandbox tasks the host count passed 20,000 in 50 s, and a
// sentry that cannot make a stub thread panics. So the sandbox's limit is
// enforced inside, on the sandbox's own tasks, and the processes that
// reach it together are killed (like the OOM killer at the memory limit),
// to stop them before the host-side wall, which stays as the host's
// protection, is reached. At large limits a churning bomb's stubs can
// still reach that wall first (docs/security.md, gVisor).
//
// The hierarchy is mounted by the agent, which needs CAP_SYS_ADMIN for
// it and drops the capability before serving (DropSysAdmin); it is then
// unmounted (detached), so no path in the sandbox leads to it and a
// sandbox process cannot raise its own limit: only the agent's open
// descriptors reach it.
//
// Under runc the runtime makes the workload cgroup on the host instead
// (HostPidsCgroup): the kernel refuses a fork past its limit, as it does
// at the sandbox's own, so nothing is killed there; what the agent gains
// is that its own threads are not in it, and a workload that keeps its
// limit full still leaves the agent room to make one.
type PidsCgroup struct {
	max int64
	// kills: the agent kills the workload at the limit (pidsKiller);
	// false for a host cgroup, whose kernel refuses the forks itself.
	kills bool
	// work is the cgroup the agent's processes run in; root is the
	// hierarchy's root, where the agent itself stays (unlimited).
	workTasks, rootTasks *os.File
	current, procs       *os.File
	// started wakes the killer after a fork (nextPidsCheck).
	started chan struct{}
}

// The sentry's cgroupfs has no notification (no pids.events, no inotify
// on its files), so the killer reads the task count; a read is cheap, but
// each wake-up of the agent is not: a timer firing under gVisor wakes the
// sentry's threads and the platform's stub, about 2 ms of host CPU.
// Reading every 50 ms kept an idle sandbox at 4 % of a core (measured
// with the daemon's runsc, systrap). So the killer reads often only while
// the count moves (a bomb's count never holds still) or stands near the
// limit, backs off while it holds still, and stops while the workload
// cgroup is empty, until the agent starts a process: nothing else can put
// a task there (nextPidsCheck).

// pidsCheckInterval is how often the killer reads the count while it
// moves.
const pidsCheckInterval = 50 * time.Millisecond

// pidsSteadyInterval bounds the back-off while the count holds still:
// a bomb started by a process that was already running is seen moving
// at most this long after it started.
const pidsSteadyInterval = time.Second

// nextPidsCheck says how long the killer waits before it reads the count
// again, having read n (last: the read before, -1 for none) after
// waiting prev: not at all until a start (ok false) while the workload
// cgroup is empty; pidsCheckInterval while the count moves or stands at
// half the limit or more; otherwise twice prev, up to pidsSteadyInterval.
func nextPidsCheck(prev time.Duration, n, last, limit int64) (wait time.Duration, ok bool) {
	switch {
	case n == 0:
		return 0, false
	case n != last || 2*n >= limit:
		return pidsCheckInterval, true
	default:
		return min(max(2*prev, pidsCheckInterval), pidsSteadyInterval), true
	}
}

// drainLimit bounds the wait for killed processes to leave the count.
// Starts wait for the drain (it holds the fork lock), so it is generous:
// on the ptrace platform, next to a CPU hog on both cores, 64 killed
// tasks took more than 10 s to be reaped, and an exec started right after
// the bomb's then failed at the limit.
const drainLimit = time.Minute

// SetupPidsCgroup mounts the pids cgroup hierarchy on a fresh directory
// under dir, makes the workload cgroup with pids.max = max, opens what the
// agent needs and detaches the mount.
func SetupPidsCgroup(dir string, max int64) (*PidsCgroup, error) {
	if max <= 0 {
		return nil, fmt.Errorf("pids cgroup: limit %d: %w", max, errInvalid)
	}
	mnt, err := os.MkdirTemp(dir, ".berth-pids-")
	if err != nil {
		return nil, fmt.Errorf("pids cgroup: %w", err)
	}
	defer os.Remove(mnt)
	if err := unix.Mount("berth-pids", mnt, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "pids"); err != nil {
		return nil, fmt.Errorf("pids cgroup: mount: %w", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH) //nolint:errcheck // nothing to do if it fails; the directory then stays busy
	work := filepath.Join(mnt, "workload")
	if err := os.Mkdir(work, 0o755); err != nil {
		return nil, fmt.Errorf("pids cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte(strconv.FormatInt(max, 10)), 0); err != nil {
		return nil, fmt.Errorf("pids cgroup: pids.max: %w", err)
	}
	c := &PidsCgroup{max: max, kills: true, started: make(chan struct{}, 1)}
	for _, f := range []struct {
		dst  **os.File
		path string
		flag int
	}{
		{&c.workTasks, filepath.Join(work, "tasks"), os.O_WRONLY},
		{&c.rootTasks, filepath.Join(mnt, "tasks"), os.O_WRONLY},
		{&c.current, filepath.Join(work, "pids.current"), os.O_RDONLY},
		{&c.procs, filepath.Join(work, "cgroup.procs"), os.O_RDONLY},
	} {
		if *f.dst, err = os.OpenFile(f.path, f.flag, 0); err != nil {
			c.Close()
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
	}
	return c, nil
}

// HostPidsCgroup is the workload cgroup the runtime made for the sandbox
// on the host (runc, a cgroup v1 pids hierarchy): work and root are its
// and the sandbox cgroup's "tasks" files, which the runtime opened for
// writing (as host root: the kernel checks a migration against the
// credentials the file was opened with, so the agent can move its own
// threads with them and no sandbox process can open them) and handed to
// the agent. The limit is the kernel's (work's pids.max); the agent only
// starts its processes there (fork).
func HostPidsCgroup(work, root *os.File) *PidsCgroup {
	return &PidsCgroup{workTasks: work, rootTasks: root, started: make(chan struct{}, 1)}
}

// Close closes the cgroup's descriptors.
func (c *PidsCgroup) Close() {
	for _, f := range []*os.File{c.workTasks, c.rootTasks, c.current, c.procs} {
		if f != nil {
			f.Close()
		}
	}
}

// Max is the limit.
func (c *PidsCgroup) Max() int64 { return c.max }

// fork runs start, which forks, from a thread that is in the workload
// cgroup for the moment, so the child is born there (cgroup v1 moves
// single threads through "tasks"; the agent's other threads stay in the
// root). A fork past the limit fails with EAGAIN. The caller serializes
// forks.
func (c *PidsCgroup) fork(start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := []byte(strconv.Itoa(unix.Gettid()))
	if _, err := unix.Pwrite(int(c.workTasks.Fd()), tid, 0); err != nil {
		return fmt.Errorf("pids cgroup: enter: %w", err)
	}
	err := start()
	if _, berr := unix.Pwrite(int(c.rootTasks.Fd()), tid, 0); berr != nil {
		// A thread left in the workload cgroup would count against the
		// sandbox and fork its limit away: the agent cannot go on.
		panic(fmt.Sprintf("pids cgroup: leave: %v", berr))
	}
	select {
	case c.started <- struct{}{}:
	default: // a wake-up is pending already
	}
	return err
}

// count is the number of tasks in the workload cgroup.
func (c *PidsCgroup) count() (int64, error) {
	var b [32]byte
	n, err := unix.Pread(int(c.current.Fd()), b[:], 0)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b[:n])), 10, 64)
}

// pids lists the processes in the workload cgroup.
func (c *PidsCgroup) pids() ([]int, error) {
	buf := make([]byte, 0, 8*(c.max+16))
	for {
		chunk := buf[len(buf):cap(buf)]
		if len(chunk) == 0 {
			buf = append(buf, make([]byte, cap(buf))...)[:len(buf)]
			continue
		}
		n, err := unix.Pread(int(c.procs.Fd()), chunk, int64(len(buf)))
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
	}
	var out []int
	for _, f := range bytes.Fields(buf) {
		if pid, err := strconv.Atoi(string(f)); err == nil && pid > 1 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// pidsKiller kills every process the agent started when they reach the
// limit together, and marks the processes of the table it ends so their
// end events say why.
type pidsKiller struct {
	cg    *PidsCgroup
	procs *procTable
	// pid1: the agent is PID 1 of the sandbox (killRound).
	pid1 bool
	stop chan struct{}
	// onCount, when set (tests only), sees every count read.
	onCount func(n int64)
	wg      sync.WaitGroup
}

func startPidsKiller(cg *PidsCgroup, procs *procTable) *pidsKiller {
	k := &pidsKiller{cg: cg, procs: procs, pid1: os.Getpid() == 1, stop: make(chan struct{})}
	k.wg.Add(1)
	go k.run()
	return k
}

func (k *pidsKiller) close() {
	close(k.stop)
	k.wg.Wait()
}

func (k *pidsKiller) run() {
	defer k.wg.Done()
	wait, last := pidsCheckInterval, int64(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-k.cg.started:
		case <-timer.C:
		}
		n, err := k.cg.count()
		if k.onCount != nil {
			k.onCount(n)
		}
		ok := true
		switch {
		case err != nil:
			k.procs.logger.Warn("pids_count_failed", "err", err)
			wait, last = pidsCheckInterval, -1
		case n >= k.cg.max:
			k.killAll(n)
			// Read again soon: what the round left decides the pace.
			wait, last = pidsCheckInterval, -1
		default:
			wait, ok = nextPidsCheck(wait, n, last, k.cg.max)
			last = n
		}
		if ok {
			timer.Reset(wait)
		} else {
			timer.Stop()
		}
	}
}

// killAll kills every process in the workload cgroup, round after round
// until none is left, live or unreaped (killRound). It holds the table's
// fork lock throughout, so a process started meanwhile waits and then
// starts in an empty cgroup, under an RLIMIT_NPROC no zombie of the bomb
// counts against, instead of dying with the bomb.
func (k *pidsKiller) killAll(n int64) {
	k.procs.forkMu.Lock()
	defer k.procs.forkMu.Unlock()
	msg := fmt.Sprintf("the sandbox's processes reached its limit of %d; the agent killed them all", k.cg.max)
	for _, p := range k.procs.list() {
		p.mu.Lock()
		p.pidsKilled = msg
		p.mu.Unlock()
	}
	// Round after round until nothing the agent started is left, live or
	// unreaped. Not at the first count of zero: a task SIGKILLed inside
	// clone may still give birth (gVisor's sentry completes the clone;
	// measured, a bomb at 1,024 grew back to 317 tasks after a count of
	// zero). Unreaped counts too: the sentry's cgroup lets go of a task
	// when it exits but RLIMIT_NPROC counts it until it is reaped, so a
	// start right after the cgroup emptied could still be refused at the
	// rlimit by the bomb's zombies. No event says when either happens, so
	// poll, bounded.
	killed := map[int]bool{} // killRound's, not as PID 1
	rounds := 0
	drained := false
	for deadline := time.Now().Add(drainLimit); ; rounds++ {
		if drained = k.killRound(killed); drained || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	left, _ := k.cg.count()
	k.procs.logger.Warn("pids_limit", "tasks", n, "limit", k.cg.max, "rounds", rounds, "left", left, "drained", drained)
}

// killRound sends SIGKILL to every process of the workload and reports
// whether none is left, live or waiting to be reaped. As PID 1 (as under
// gVisor, the only place the agent holds a pids cgroup) it is one call:
// kill(-1) reaches every process of the sandbox but the agent, which are
// all the agent's, and fails with ESRCH once there is none, zombies
// included (a pid stays taken until its task is reaped). A bomb at 1,024
// tasks took the per-pid way below more than a minute a round, each call
// a trip through the busy sentry. Otherwise (under a debugging init) per
// pid of the cgroup's listing, and none is left when every pid killed is
// gone (reaped: an orphan is reaped by that init, not by the agent) and
// the count reads zero; killed carries the pids signalled and not yet
// seen gone from round to round.
func (k *pidsKiller) killRound(killed map[int]bool) bool {
	if k.pid1 {
		return errors.Is(unix.Kill(-1, unix.SIGKILL), unix.ESRCH)
	}
	pids, err := k.cg.pids()
	if err != nil {
		k.procs.logger.Warn("pids_list_failed", "err", err)
	}
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL) // gone already is fine
		killed[pid] = true
	}
	for pid := range killed {
		// A number reused meanwhile is another task of the workload
		// cgroup, the bomb's: the agent's own starts wait for the lock.
		if errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			delete(killed, pid)
		}
	}
	if len(killed) > 0 {
		return false
	}
	c, err := k.cg.count()
	return err == nil && c == 0
}

// DropSysAdmin takes CAP_SYS_ADMIN out of every thread's bounding,
// effective, permitted and inheritable sets, so neither the agent nor any
// process it starts has it again. Having it is how the agent mounts the
// pids cgroup (SetupPidsCgroup); without it the call does nothing.
func DropSysAdmin() error {
	if ok, err := hasCap(unix.CAP_SYS_ADMIN); err != nil || !ok {
		return err
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); e != 0 {
		return fmt.Errorf("drop CAP_SYS_ADMIN from the bounding set: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	bit := uint32(1) << (unix.CAP_SYS_ADMIN % 32)
	i := unix.CAP_SYS_ADMIN / 32
	data[i].Effective &^= bit
	data[i].Permitted &^= bit
	data[i].Inheritable &^= bit
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	if ok, err := hasCap(unix.CAP_SYS_ADMIN); err != nil || ok {
		return errors.Join(err, errors.New("CAP_SYS_ADMIN still held after the drop"))
	}
	return nil
}

// hasCap reports whether the calling thread has capability c in its
// bounding or permitted set.
func hasCap(c int) (bool, error) {
	r, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
	if err != nil {
		return false, fmt.Errorf("read the bounding set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	return r == 1 || data[c/32].Permitted&(1<<(c%32)) != 0, nil
}

// mountCalls are the mount-table calls the agent denies to itself and to
// every process it starts once its pids cgroup is set up: the sandbox's
// seccomp profile lets them through for the agent's one mount (gVisor
// applies the profile to the agent as to everything else), and this
// filter, inherited by every child and never removable, puts the deny
// back, the same as the profile's "mounts" group.
var mountCalls = []uint32{
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_MOUNT_SETATTR,
}

// Deny installs, on every thread of the agent, one seccomp filter for
// itself and every process it starts (inherited, never removable): with
// mounts, mountCalls fail with EPERM; each call spec names fails with its
// errno. spec is envd.ErrnoCallsEnv's value, "clone3:38,io_setup:38": the
// runtime's seccomp rules whose errno its own seccomp cannot return
// (gVisor's answers EPERM to every one; ENOSYS is what callers fall back
// on). A name this architecture has no such call for is skipped: nothing
// can make the call there. With neither, nothing is installed.
//
// One filter, not one per purpose: gVisor's sentry rebuilds each task's
// seccomp cache by running every filter the task has for every call
// number, for each thread when a filter is installed on all of them, at
// each clone, and for every task at each restore (about 1 ms per filter
// and task on a 2-CPU host, README), so every filter more is paid by each
// process and thread the sandbox starts and by each resume.
//
// The kernel wants no_new_privs or CAP_SYS_ADMIN: the agent has
// no_new_privs unless its sandbox lets set-user-ID programs raise
// (allow_sudo, on a runsc with --allow-suid), and holds the sentry's
// CAP_SYS_ADMIN until DropSysAdmin, which must run after this. Without
// either the error wraps EACCES.
func Deny(mounts bool, spec string) error {
	calls, err := parseDeniedCalls(spec)
	if err != nil {
		return err
	}
	// A call in both lists answers spec's errno, as when the calls'
	// filter was installed after the mounts' (the later filter's answer
	// wins between two errnos): a filter returns on its first match.
	if mounts {
		for _, nr := range mountCalls {
			calls = append(calls, deniedCall{nr: nr, errno: uint32(unix.EPERM)})
		}
	}
	if len(calls) == 0 {
		return nil
	}
	if err := installDenyFilter(calls); err != nil {
		return fmt.Errorf("deny calls (mounts %v, %q): %w", mounts, spec, err)
	}
	return nil
}

// deniedCall is one call a filter fails, and with which errno.
type deniedCall struct {
	nr, errno uint32
}

// parseDeniedCalls reads Deny's spec.
func parseDeniedCalls(spec string) ([]deniedCall, error) {
	var out []deniedCall
	for _, item := range strings.Split(spec, ",") {
		if item == "" {
			continue
		}
		name, num, ok := strings.Cut(item, ":")
		errno, err := strconv.ParseUint(num, 10, 12)
		if !ok || err != nil || errno == 0 {
			return nil, fmt.Errorf("deny calls: %q is not name:errno (errno 1-4095)", item)
		}
		nr, known := syscallNumbers[name]
		if !known {
			continue
		}
		out = append(out, deniedCall{nr: nr, errno: uint32(errno)})
	}
	return out, nil
}

// installDenyFilter installs, on every thread, a seccomp filter that
// fails each of calls with its errno and every call of a foreign
// architecture's ABI with EPERM, and allows the rest.
func installDenyFilter(calls []deniedCall) error {
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return fmt.Errorf("no seccomp arch for %s", runtime.GOARCH)
	}
	const (
		ldAbs  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		offNr  = 0 // struct seccomp_data: nr, arch, ...
		offArc = 4
	)
	prog := []unix.SockFilter{
		{Code: ldAbs, K: offArc},
		{Code: jeqK, K: arch, Jt: 1},
		{Code: retK, K: eperm},
		{Code: ldAbs, K: offNr},
	}
	// Each call: if equal, fall through to its return; else skip it.
	for _, c := range calls {
		prog = append(prog,
			unix.SockFilter{Code: jeqK, K: c.nr, Jf: 1},
			unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ERRNO | c.errno&unix.SECCOMP_RET_DATA})
	}
	prog = append(prog, unix.SockFilter{Code: retK, K: allow})
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	runtime.KeepAlive(prog)
	return nil
}
