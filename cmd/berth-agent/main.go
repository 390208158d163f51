// Command berth-agent is the in-sandbox agent: PID 1 of every sandbox,
// serving E2B envd's protocol on port 49983. Build it static
// (CGO_ENABLED=0); it links nothing host-side.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/agent"
	"github.com/berth-sandbox/berth/proto/envd"
)

func main() {
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
	flag.Parse()
	if *version {
		fmt.Println(envd.Version)
		return nil
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	// Not dumpable: a sandbox process running as root (the same uid as the
	// agent) could otherwise read the token from /proc/1/environ, write
	// the agent's memory through /proc/1/mem or steal its descriptors with
	// pidfd_getfd. Non-dumpable, those need CAP_SYS_PTRACE over the
	// agent's mm, which the sandbox does not have. Children become
	// dumpable again when they exec.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	// The token must not leak into any process the agent starts.
	token := os.Getenv(agent.TokenEnv)
	_ = os.Unsetenv(agent.TokenEnv)

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

	srv, err := agent.New(agent.Config{
		Listen:      *listen,
		Token:       token,
		DefaultUser: *user,
		DefaultCwd:  *cwd,
		PasswdPath:  *passwd,
		GroupPath:   *group,
		Env:         agent.SandboxEnv(os.Environ()),
		Reaper:      reaper,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	defer srv.Close()

	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	logger.Info("agent_listening", "addr", l.Addr().String(), "version", envd.Version, "pid1", os.Getpid() == 1)
	return srv.Serve(ctx, l)
}
