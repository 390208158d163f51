package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Every sandbox's user namespace is made by the daemon, owned by the
// sandbox's own root uid on the host, and runc joins it; runc would make
// one owned by host root.
//
// Why the owner matters: the kernel counts several pools per user and per
// user namespace (ucounts: inotify instances and watches, fanotify groups
// and marks, queued signals and POSIX timers, POSIX message queue bytes,
// locked shm, namespaces). A charge made inside a user namespace is also
// charged, level by level, to the namespace's owner in the parent
// namespace, against the parent's limit. With runc's namespace that owner
// is host root: every sandbox's inotify instances counted against host
// root's 128, so one sandbox could make inotify_init1, sigqueue,
// timer_create and mq_open fail for host root and for every other sandbox.
// A limit set inside the sandbox's namespace does not help: it applies per
// uid, and sandbox root can switch to any of its 65536 uids.
//
// Owned by the sandbox's root uid, the namespace's charges land on that
// host uid instead, bounded there by the host's per-user limits
// (fs.inotify.max_user_instances, …) and, for the rlimit-like pools, by
// the creator's rlimits, which the kernel records in the namespace. Host
// root's own pools are out of reach, and a sandbox whose host uids are its
// own shares these pools with no other sandbox.
//
// The owner has every capability over the namespace from the host side,
// like the uid that owns the sandbox's files already effectively does;
// only a process running as that uid in the host's own user namespace can
// use it, and Berth runs none besides the short-lived holder below.

// userNS is a user namespace held open by a process until runc has joined
// it.
type userNS struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	path  string // /proc/<pid>/ns/user of the holder
}

// newUserNS makes a user namespace owned by the host uid and gid that
// container id 0 maps to, with the given mappings. The holder is
// unshare(1) running cat(1) as that uid: unshare(CLONE_NEWUSER) needs a
// single-threaded caller, and the namespace's owner is the caller's
// effective uid, which a Go child only takes after its clone. cat echoes
// one byte back once it runs, which proves the unshare is done, and exits
// when the daemon closes its stdin (or dies).
func newUserNS(ctx context.Context, uids, gids []specs.LinuxIDMapping) (*userNS, error) {
	owner, ok := hostID(uids)
	if !ok {
		return nil, errors.New("user namespace: no uid mapping for container root")
	}
	group, ok := hostID(gids)
	if !ok {
		return nil, errors.New("user namespace: no gid mapping for container root")
	}
	return holdUserNS(ctx, &syscall.Credential{Uid: owner, Gid: group, Groups: []uint32{}}, uids, gids)
}

// holdUserNS makes a user namespace with the given mappings, held by
// unshare(1) running cat(1) (see newUserNS) as cred, or as the daemon's
// own uid when cred is nil. Both are started the way Go starts any
// program (vfork and exec): the daemon's address space is never copied.
func holdUserNS(ctx context.Context, cred *syscall.Credential, uids, gids []specs.LinuxIDMapping) (*userNS, error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	cmd := exec.Command(unshare, "--user", "--", cat)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = "/"
	cmd.Env = []string{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace: start holder: %w", err)
	}
	ns := &userNS{cmd: cmd, stdin: stdin, path: fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid)}
	fail := func(err error) (*userNS, error) {
		ns.close()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			err = fmt.Errorf("%w: %s", err, s)
		}
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	if err := awaitEcho(ctx, stdin, stdout); err != nil {
		return fail(fmt.Errorf("holder: %w", err))
	}
	own, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return fail(err)
	}
	if got, err := os.Readlink(ns.path); err != nil || got == own {
		return fail(fmt.Errorf("holder is not in a new user namespace (%s, %v)", got, err))
	}
	// The daemon writes the maps: as host root it may map the whole
	// range, which the unprivileged holder could not.
	for _, m := range []struct {
		file string
		ids  []specs.LinuxIDMapping
	}{{"uid_map", uids}, {"gid_map", gids}} {
		p := fmt.Sprintf("/proc/%d/%s", cmd.Process.Pid, m.file)
		if err := os.WriteFile(p, []byte(idMapText(m.ids)), 0); err != nil {
			return fail(fmt.Errorf("write %s: %w", m.file, err))
		}
	}
	return ns, nil
}

// idMappings maps the sandbox's ids from 0 onto its host range from uid
// (its uids and its gids alike).
func (r *Runtime) idMappings(uid uint32) []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: uid, Size: r.cfg.UIDCount}}
}

// pendingUserNS is a sandbox's user namespace being made (newUserNS)
// while its create does other work.
type pendingUserNS struct {
	done  chan struct{}
	ns    *userNS
	err   error
	taken bool
}

// startUserNS starts making a user namespace with the mappings m (for
// uids and gids).
func startUserNS(ctx context.Context, m []specs.LinuxIDMapping) *pendingUserNS {
	p := &pendingUserNS{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.ns, p.err = newUserNS(ctx, m, m)
	}()
	return p
}

// take waits for the namespace; the caller then owns it (close).
func (p *pendingUserNS) take() (*userNS, error) {
	<-p.done
	p.taken = true
	return p.ns, p.err
}

// release waits for the namespace and closes it unless it was taken: a
// create that failed before it needed it leaves no holder behind.
func (p *pendingUserNS) release() {
	<-p.done
	if !p.taken && p.ns != nil {
		p.ns.close()
	}
}

// close ends the holder. The namespace lives on as long as a sandbox
// process is in it.
func (ns *userNS) close() {
	ns.stdin.Close()
	_ = ns.cmd.Process.Kill()
	_ = ns.cmd.Wait()
}

// hostID is the host id that container id 0 maps to.
func hostID(m []specs.LinuxIDMapping) (uint32, bool) {
	for _, e := range m {
		if e.ContainerID == 0 && e.Size > 0 {
			return e.HostID, true
		}
	}
	return 0, false
}

// idMapText renders mappings in /proc/<pid>/uid_map's format.
func idMapText(m []specs.LinuxIDMapping) string {
	var b strings.Builder
	for _, e := range m {
		fmt.Fprintf(&b, "%d %d %d\n", e.ContainerID, e.HostID, e.Size)
	}
	return b.String()
}

// inheritNetNS drops a joined network namespace from the spec: runc joins
// the user namespace first, after which it may no longer enter a network
// namespace the host made (the host's user namespace owns it). runc is
// started inside that network namespace instead (startInNetNS), and a
// container without a network namespace of its own stays in runc's.
// It returns the namespace's path, or "" when runc makes a new one.
func inheritNetNS(sp *specs.Spec) string {
	var path string
	kept := sp.Linux.Namespaces[:0]
	for _, n := range sp.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace && n.Path != "" {
			path = n.Path
			continue
		}
		kept = append(kept, n)
	}
	sp.Linux.Namespaces = kept
	return path
}

// startInNetNS starts cmd inside the network namespace at path: the child
// is forked from a locked thread that joined it. The thread goes back to
// the pool only if it could return to its own namespace.
func startInNetNS(path string, cmd *exec.Cmd) error {
	if path == "" {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		back, err := inNetNS(path, cmd.Start)
		if back {
			goruntime.UnlockOSThread()
		} // else the thread stays locked and ends with the goroutine
		errc <- err
	}()
	return <-errc
}

// inNetNS runs fn on the calling goroutine's thread, which must be locked
// to it, with the thread in the network namespace at path, then moves the
// thread back. back is false when it could not: the thread must then stay
// locked until its goroutine ends, which ends the thread too.
func inNetNS(path string, fn func() error) (back bool, err error) {
	target, err := os.Open(path)
	if err != nil {
		return true, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return true, err
	}
	defer orig.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return true, fmt.Errorf("join netns %s: %w", path, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return false, errors.Join(fnErr, fmt.Errorf("restore netns: %w", err))
	}
	return true, fnErr
}

// joinUserNS makes the spec's user namespace the one at path instead of a
// new one; the spec keeps its mappings, which runc uses to know the
// sandbox's root uid.
func joinUserNS(sp *specs.Spec, path string) {
	for i, n := range sp.Linux.Namespaces {
		if n.Type == specs.UserNamespace {
			sp.Linux.Namespaces[i].Path = path
		}
	}
}

// runIn runs cmd started inside the network namespace at path (see
// startInNetNS), with the sandbox's rlimits, and waits for it.
func runIn(path string, rl []specs.POSIXRlimit, cmd *exec.Cmd) error {
	if err := withRlimits(cmd, rl); err != nil {
		return err
	}
	return runPinned(cmd, path)
}

// takeRlimits moves the rlimits out of the spec: runc would set them on
// the container's init with prlimit(2) from the host, which on a process
// in a user namespace the host's root does not own needs CAP_SYS_RESOURCE,
// and a daemon may run without it. Set on runc itself instead
// (withRlimits), they are inherited by the init and the agent, which is
// where runc's prlimit would have put them.
func takeRlimits(sp *specs.Spec) []specs.POSIXRlimit {
	rl := sp.Process.Rlimits
	sp.Process.Rlimits = nil
	return rl
}

// prlimitFlags maps rlimit names to prlimit(1)'s options.
var prlimitFlags = map[string]string{
	"RLIMIT_NOFILE":     "--nofile",
	"RLIMIT_NPROC":      "--nproc",
	"RLIMIT_CORE":       "--core",
	"RLIMIT_SIGPENDING": "--sigpending",
	"RLIMIT_MSGQUEUE":   "--msgqueue",
	"RLIMIT_RTPRIO":     "--rtprio",
	"RLIMIT_NICE":       "--nice",
	"RLIMIT_MEMLOCK":    "--memlock",
}

// withRlimits makes cmd run under prlimit(1) with rl.
func withRlimits(cmd *exec.Cmd, rl []specs.POSIXRlimit) error {
	if len(rl) == 0 {
		return nil
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		return fmt.Errorf("rlimits: %w", err)
	}
	args := []string{prlimit}
	for _, l := range rl {
		flag, ok := prlimitFlags[l.Type]
		if !ok {
			return fmt.Errorf("rlimits: no prlimit option for %s", l.Type)
		}
		args = append(args, fmt.Sprintf("%s=%d:%d", flag, l.Soft, l.Hard))
	}
	cmd.Args = append(append(args, "--", cmd.Path), cmd.Args[1:]...)
	cmd.Path = prlimit
	return nil
}

// holderStartTimeout bounds how long a namespace holder (cat) may take to
// answer its first byte.
const holderStartTimeout = 30 * time.Second

// awaitEcho writes a byte to a holder process (cat) and waits for it to
// come back: once it does, the holder runs in its final namespaces.
func awaitEcho(ctx context.Context, stdin io.Writer, stdout io.Reader) error {
	echoed := make(chan error, 1)
	go func() {
		if _, err := stdin.Write([]byte{'\n'}); err != nil {
			echoed <- err
			return
		}
		var b [1]byte
		_, err := io.ReadFull(stdout, b[:])
		echoed <- err
	}()
	timeout := time.NewTimer(holderStartTimeout)
	defer timeout.Stop()
	select {
	case err := <-echoed:
		if err != nil {
			return fmt.Errorf("did not start: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout.C:
		return fmt.Errorf("did not start within %s", holderStartTimeout)
	}
}
