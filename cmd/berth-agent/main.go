// Command berth-agent is the in-sandbox agent: PID 1 of every sandbox,
// serving E2B envd's protocol on port 49983. Build it static
// (CGO_ENABLED=0); it links nothing host-side. Run as
// `berth-agent podlog …` it is instead the logging wrapper a Kubernetes
// node runs each container's command under (podlog.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/agent"
	"github.com/berth-sandbox/berth/proto/envd"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "podlog" {
		os.Exit(podLog(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "podlog-input" {
		os.Exit(podInputCmd(os.Args[2:]))
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", fmt.Sprintf("0.0.0.0:%d", envd.Port), "address to serve on")
	user := flag.String("user", "root", "default user for requests that name none")
	cwd := flag.String("cwd", "", "default working directory of processes (default: the user's home)")
	passwd := flag.String("passwd", "/etc/passwd", "passwd file of the sandbox")
	group := flag.String("group", "/etc/group", "group file of the sandbox")
	version := flag.Bool("version", false, "print the envd version the agent implements and exit")
	ptySignals := flag.Bool("pty-signals", false, "turn a PTY's ^C, ^\\ and ^Z into signals in the agent (for a kernel whose line discipline does not: gVisor's sentry before 2023)")
	pidsMax := flag.Int64("pids-max", 0, "hold the processes the agent starts to N tasks with the pids cgroup of the sandbox's own kernel, mounted by the agent, which drops CAP_SYS_ADMIN afterwards (gVisor, whose host-side cgroup counts the sentry's threads instead)")
	flag.Parse()
	if *version {
		fmt.Println(envd.Version)
		return nil
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := dropTokenFromEnviron(); err != nil {
		return err
	}

	// Not dumpable: a sandbox process running as root (the same uid as the
	// agent) could otherwise read the token from /proc/1/environ, write
	// the agent's memory through /proc/1/mem or steal its descriptors with
	// pidfd_getfd. Non-dumpable, those need CAP_SYS_PTRACE over the
	// agent's mm, which the sandbox does not have. Children become
	// dumpable again when they exec.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	// The token must not leak into any process the agent starts, nor
	// stay readable in /proc/1/environ.
	token, err := takeToken()
	if err != nil {
		return err
	}

	var reaper *agent.Reaper
	if os.Getpid() == 1 {
		reaper = agent.NewReaper()
		defer reaper.Close()
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err == nil {
		// Not PID 1 (e.g. under a debugging init): still adopt orphans of
		// our own processes so none are left as zombies.
		reaper = agent.NewReaper()
		defer reaper.Close()
	}

	var pids *agent.PidsCgroup
	tasks := os.Getenv(envd.PidsTasksFDsEnv)
	if err := os.Unsetenv(envd.PidsTasksFDsEnv); err != nil {
		return err
	}
	switch {
	case *pidsMax > 0:
		// /dev is a tmpfs of the sandbox's own: the mount point never
		// reaches the disk (or a snapshot of it).
		if pids, err = agent.SetupPidsCgroup("/dev", *pidsMax); err != nil {
			return err
		}
	case tasks != "":
		if pids, err = hostPidsCgroup(tasks); err != nil {
			return err
		}
	}
	// One filter for the agent and everything it starts (agent.Deny):
	// with a pids cgroup, the mount calls the runtime let through the
	// sandbox's seccomp profile for the agent's one mount are denied
	// again from here on; and the calls the runtime's seccomp could not
	// fail with their own errno (gVisor: clone3 must say ENOSYS, or glibc
	// starts no thread) fail with it.
	spec := os.Getenv(envd.ErrnoCallsEnv)
	if err := os.Unsetenv(envd.ErrnoCallsEnv); err != nil {
		return err
	}
	switch err := agent.Deny(*pidsMax > 0, spec); {
	case errors.Is(err, unix.EACCES) && *pidsMax <= 0:
		// Neither no_new_privs nor CAP_SYS_ADMIN (a set-user-ID
		// sandbox without a pids limit): the calls keep the
		// runtime's EPERM.
		logger.Warn("deny_calls_unavailable", "calls", spec, "err", err)
	case err != nil:
		return err
	}
	// Whatever granted it, no process of the sandbox keeps CAP_SYS_ADMIN
	// past this point.
	if err := agent.DropSysAdmin(); err != nil {
		return err
	}
	// Threads made now, while the sandbox's pids limit has room. With a
	// workload cgroup (gVisor's, in its own kernel; runc's, on a cgroup v1
	// host) the workload is held in a cgroup the agent is not in, and its
	// bomb leaves the agent's threads room: no reserve there, whose
	// threads cost about 1.2 MiB a sandbox (runc) and every checkpoint of
	// a gVisor sandbox would save and every restore rebuild.
	if pids == nil {
		agent.ReserveThreads(agent.ThreadReserve())
	}

	srv, err := agent.New(agent.Config{
		Listen:      *listen,
		Token:       token,
		DefaultUser: *user,
		DefaultCwd:  *cwd,
		PasswdPath:  *passwd,
		GroupPath:   *group,
		Env:         agent.SandboxEnv(os.Environ()),
		Reaper:      reaper,
		PTYSignals:  *ptySignals,
		Pids:        pids,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	defer srv.Close()

	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	l, err := listenBlocking(*listen)
	if err != nil {
		return err
	}
	logger.Info("agent_listening", "addr", l.Addr().String(), "version", envd.Version, "pid1", os.Getpid() == 1)
	return srv.Serve(ctx, l)
}

// dropTokenFromEnviron re-executes the agent without the token in its
// environment when it has one there, handing the token over through a
// pipe. /proc/1/environ shows the environment block the process was
// started with, whatever the process later unsets, and only the kernel's
// dumpable check keeps other processes of the agent's uid from reading
// it: Linux honours that check, gVisor's sentry (runsc 2022) does not.
// After the exec the block holds no token on either. The pid stays the
// same (PID 1 of the sandbox).
func dropTokenFromEnviron() error {
	token, ok := os.LookupEnv(envd.TokenEnv)
	if !ok {
		return nil
	}
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil { // no O_CLOEXEC: the read end crosses the exec
		return fmt.Errorf("pipe for the token: %w", err)
	}
	// A pipe holds at least a page; a token is a few dozen bytes, so the
	// write completes before anyone reads.
	if _, err := unix.Write(p[1], []byte(token)); err != nil {
		return fmt.Errorf("write the token: %w", err)
	}
	unix.Close(p[1])
	env := []string{envd.TokenFDEnv + "=" + strconv.Itoa(p[0])}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envd.TokenEnv+"=") && !strings.HasPrefix(kv, envd.TokenFDEnv+"=") {
			env = append(env, kv)
		}
	}
	// Exec the binary by its own path, not /proc/self/exe: the process's
	// name (comm, what ps shows for PID 1) comes from the path's last
	// element, and users and tests look for berth-agent there.
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	return fmt.Errorf("re-exec without the token: %w", unix.Exec(self, os.Args, env))
}

// takeToken reads the token the agent passed itself in
// dropTokenFromEnviron, or takes it from the environment where that was
// not needed, and removes both from the environment children inherit.
func takeToken() (string, error) {
	fdStr, ok := os.LookupEnv(envd.TokenFDEnv)
	_ = os.Unsetenv(envd.TokenFDEnv)
	if !ok {
		token := os.Getenv(envd.TokenEnv)
		_ = os.Unsetenv(envd.TokenEnv)
		return token, nil
	}
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return "", fmt.Errorf("%s=%q: %w", envd.TokenFDEnv, fdStr, err)
	}
	f := os.NewFile(uintptr(fd), "token")
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return "", fmt.Errorf("read the token: %w", err)
	}
	return string(b), nil
}

// hostPidsCgroup takes the workload cgroup's descriptors the runtime
// handed over ("WORK,ROOT", envd.PidsTasksFDsEnv). They reach the agent
// without close-on-exec (runc's --preserve-fds): set here, before any
// process starts, so none inherits them.
func hostPidsCgroup(fds string) (*agent.PidsCgroup, error) {
	w, r, ok := strings.Cut(fds, ",")
	work, err1 := strconv.Atoi(w)
	root, err2 := strconv.Atoi(r)
	if !ok || err1 != nil || err2 != nil || work < 3 || root < 3 || work == root {
		return nil, fmt.Errorf("%s=%q: want two descriptors, WORK,ROOT", envd.PidsTasksFDsEnv, fds)
	}
	for _, fd := range []int{work, root} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("%s: descriptor %d: %w", envd.PidsTasksFDsEnv, fd, err)
		}
	}
	return agent.HostPidsCgroup(os.NewFile(uintptr(work), "workload-tasks"), os.NewFile(uintptr(root), "sandbox-tasks")), nil
}
