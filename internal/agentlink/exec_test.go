package agentlink

import (
	"bytes"
	"errors"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agent"
)

const testToken = "t0ken"

// startAgent runs the real agent on a loopback server, with a passwd whose
// "root" and "tester" (uid 1234) have homes under a temp dir, and returns
// its address.
func startAgent(t *testing.T) (addr, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent switches users: needs root")
	}
	dir = t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"root", "tester"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(passwd, "root:x:0:0:root:"+dir+"/root:/bin/sh\ntester:x:1234:1234::"+dir+"/tester:/bin/sh\n")
	write(group, "root:x:0:\ntester:x:1234:\n")
	srv, err := agent.New(agent.Config{Token: testToken, PasswdPath: passwd, GroupPath: group,
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	return ts.Listener.Addr().String(), dir
}

func TestRunOutputsAndExit(t *testing.T) {
	addr, dir := startAgent(t)
	l := New()
	var stdout, stderr bytes.Buffer
	res, err := l.Run(t.Context(), addr, testToken, Command{
		Argv:   []string{"/bin/sh", "-c", `echo out; echo err >&2; echo "$FOO"; pwd; id -u; exit 3`},
		Env:    map[string]string{"FOO": "bar"},
		Cwd:    dir,
		Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Exited || res.ExitCode != 3 {
		t.Errorf("result = %+v, want exited with code 3", res)
	}
	if want := "out\nbar\n" + dir + "\n0\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if stderr.String() != "err\n" {
		t.Errorf("stderr = %q, want %q", stderr.String(), "err\n")
	}

	// One writer takes both streams; the user is switched.
	var both bytes.Buffer
	res, err = l.Run(t.Context(), addr, testToken, Command{
		Argv: []string{"/bin/sh", "-c", "id -u; id -u >&2"}, User: "tester", Stdout: &both, Stderr: &both,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run as tester: %+v, %v", res, err)
	}
	if both.String() != "1234\n1234\n" {
		t.Errorf("output as tester = %q, want uid 1234 twice", both.String())
	}
}

var errFull = errors.New("full")

// failingWriter refuses every write, as a caller's bound does once reached.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errFull }

// A writer's failure ends the run at once and the agent kills the command:
// the host never keeps draining a sandbox that will not stop talking.
func TestRunWriterFailureKillsCommand(t *testing.T) {
	addr, dir := startAgent(t)
	pidFile := filepath.Join(dir, "pid")
	_, err := Run(t.Context(), New().transport, addr, testToken, Command{
		Argv:   []string{"/bin/sh", "-c", `echo $$ > "$1"; echo x; exec sleep 1000`, "sh", pidFile},
		Stdout: failingWriter{},
	})
	if !errors.Is(err, errFull) {
		t.Fatalf("err = %v, want the writer's error", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the process's exit through a pidfd (no polling); a pid
	// already gone has no pidfd.
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("process %d still runs a minute after its client went away", pid)
		}
		return
	}
}

func TestRunErrors(t *testing.T) {
	addr, _ := startAgent(t)
	l := New()
	if _, err := l.Run(t.Context(), addr, testToken, Command{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("empty argv: err = %v, want invalid argument", err)
	}
	// A command its timeout ends returns, and not as a normal exit.
	res, err := l.Run(t.Context(), addr, testToken, Command{Argv: []string{"sleep", "1000"}, Timeout: 50 * time.Millisecond})
	if err == nil && res.Exited {
		t.Errorf("a command past its timeout reported %+v", res)
	}
	// No agent: unavailable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	if _, err := l.Run(t.Context(), gone, testToken, Command{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("no agent: err = %v, want unavailable", err)
	}
	// A wrong token is refused, and the refusal is the agent's to make.
	if _, err := l.Run(t.Context(), addr, "wrong", Command{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("wrong token: err = %v, want unavailable", err)
	}
}
