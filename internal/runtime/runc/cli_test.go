package runc

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"
)

// fakeCLI writes a runsc stand-in that reports its pid (and, with child,
// its child's) through named pipes next to it, then blocks. The pipes
// make every wait an event: a reader's open returns when the writer
// comes. With started it also reports its pid on "<bin>.started", for a
// second reader (TestCLIDaemonHelper).
func fakeCLI(t *testing.T, dir string, child, started bool) string {
	t.Helper()
	bin := filepath.Join(dir, "fake-runsc")
	body := "#!/bin/sh\n"
	fifos := []string{bin + ".pid"}
	if child {
		body += "sleep 1000 &\necho $! > \"$0.child\"\n"
		fifos = append(fifos, bin+".child")
	}
	body += "echo $$ > \"$0.pid\"\n"
	if started {
		body += "echo $$ > \"$0.started\"\n"
		fifos = append(fifos, bin+".started")
	}
	body += "exec sleep 1000\n"
	for _, f := range fifos {
		if err := unix.Mkfifo(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(bin, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// waitPid reads a pid from the named pipe at path, waiting (up to a
// generous bound) for its writer, and opens a pidfd on it.
func waitPid(t *testing.T, path string) int {
	t.Helper()
	type read struct {
		b   []byte
		err error
	}
	got := make(chan read, 1)
	go func() {
		b, err := os.ReadFile(path)
		got <- read{b, err}
	}()
	var r read
	select {
	case r = <-got:
	case <-time.After(time.Minute):
		t.Fatalf("nothing written to %s within a minute", path)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(r.b)))
	if err != nil {
		t.Fatalf("%s holds %q", path, r.b)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	})
	return fd
}

// awaitExit waits, up to a generous bound, for the process behind pidfd
// to exit: the kernel makes a pidfd readable then.
func awaitExit(t *testing.T, fd int, what string) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("poll pidfd: %v", err)
		}
		if n == 0 {
			t.Fatalf("%s still alive", what)
		}
		return
	}
}

// TestCLIDiesWithDaemon: a runtime CLI the daemon started gets SIGKILL
// when the daemon dies, so none is left holding a sandbox's flock, and
// not before, when other threads of the daemon end. The "daemon" is this
// test binary run again (TestCLIDaemonHelper).
func TestCLIDiesWithDaemon(t *testing.T) {
	dir := t.TempDir()
	bin := fakeCLI(t, dir, false, true)
	if err := unix.Mkfifo(bin+".churned", 0o600); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command(os.Args[0], "-test.run=^TestCLIDaemonHelper$", "-test.count=1")
	daemon.Env = append(os.Environ(), "BERTH_TEST_CLI_DAEMON="+bin)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })
	cli := waitPid(t, bin+".pid")
	churned := waitPid(t, bin+".churned") // the daemon's own pid, once its threads have churned
	unix.Close(churned)
	fds := []unix.PollFd{{Fd: int32(cli), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 0); err != nil || n != 0 {
		t.Fatalf("the CLI died with threads of its daemon (poll = %d, %v)", n, err)
	}
	if err := daemon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = daemon.Wait() // killed: the error says so
	awaitExit(t, cli, "the CLI of a killed daemon")
}

// TestCLIDaemonHelper is the daemon of TestCLIDiesWithDaemon: it runs the
// fake CLI, which never returns, and meanwhile ends OS threads (goroutines
// that exit locked to one), which must leave the CLI alone.
func TestCLIDaemonHelper(t *testing.T) {
	bin := os.Getenv("BERTH_TEST_CLI_DAEMON")
	if bin == "" {
		t.Skip("helper process of TestCLIDiesWithDaemon")
	}
	r := &Runtime{cfg: Config{Binary: bin, RuncRoot: filepath.Dir(bin)}, log: slog.New(slog.DiscardHandler)}
	go func() {
		_, err := r.runcOutput(context.Background(), "state", "sb1")
		t.Errorf("fake CLI returned: %v", err)
		os.Exit(1)
	}()
	// The CLI runs (its parent-death signal armed) once it says so.
	if _, err := os.ReadFile(bin + ".started"); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		done := make(chan struct{})
		go func() {
			goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
			close(done)
		}()
		<-done
	}
	// A named pipe: the write waits for the test to read it.
	if err := os.WriteFile(bin+".churned", []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	select {}
}

// TestCLICancelKillsGroup: cancelling a CLI call kills the CLI and the
// children it has not detached (its process group), and returns.
func TestCLICancelKillsGroup(t *testing.T) {
	dir := t.TempDir()
	bin := fakeCLI(t, dir, true, false)
	r := &Runtime{cfg: Config{Binary: bin, RuncRoot: dir}, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := r.runcOutput(ctx, "state", "sb1")
		errc <- err
	}()
	child := waitPid(t, bin+".child")
	cli := waitPid(t, bin+".pid")
	cancel()
	if err := <-errc; err == nil {
		t.Errorf("runcOutput of a cancelled CLI = nil, want an error")
	}
	awaitExit(t, cli, "the cancelled CLI")
	awaitExit(t, child, "the cancelled CLI's child")
}

// TestInflightWait: removeState's wait returns at once with no call in
// flight, when the last call for the sandbox ends, and at its limit when
// one never does; other sandboxes' calls do not hold it.
func TestInflightWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f inflight
		if !f.wait("a", time.Minute) {
			t.Fatal("wait with no call in flight timed out")
		}
		f.begin("a")
		f.begin("a")
		f.begin("b")
		done := make(chan bool)
		go func() { done <- f.wait("a", time.Hour) }()
		synctest.Wait()
		f.end("a")
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("wait returned with a call still in flight")
		default:
		}
		f.end("a")
		if !<-done {
			t.Fatal("wait timed out after the last call ended")
		}
		if f.wait("b", time.Minute) {
			t.Fatal("wait returned true with b's call never ending")
		}
	})
}

// TestPauseFreezeAgain: a freeze runc gave up on ("unable to freeze", as
// on a host whose cores are all busy) is tried again, up to
// freezeAttempts times in all; another failure is not.
func TestPauseFreezeAgain(t *testing.T) {
	cases := []struct {
		name      string
		fails     int    // pauses that fail before one succeeds
		msg       string // what a failing pause says
		wantErr   bool
		wantCalls int
	}{
		{"frozen at the third try", 2, "unable to freeze", false, 3},
		{"never frozen", 100, "unable to freeze", true, freezeAttempts},
		{"another failure", 100, "container not running", true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			id := "sb1"
			if err := os.Mkdir(filepath.Join(dir, id), 0o700); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(dir, "fake-runc")
			calls := filepath.Join(dir, "calls")
			script := "#!/bin/sh\n" +
				"case \"$3\" in\n" +
				"state) echo '{\"id\":\"sb1\",\"pid\":1,\"status\":\"running\"}' ;;\n" +
				"pause) echo x >> " + calls + "\n" +
				"  if [ $(wc -l < " + calls + ") -le " + strconv.Itoa(c.fails) + " ]; then echo 'level=error msg=\"" + c.msg + "\"' >&2; exit 1; fi ;;\n" +
				"esac\n"
			if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			r := &Runtime{cfg: Config{Binary: bin, RuncRoot: dir}, log: slog.New(slog.DiscardHandler)}
			err := r.Pause(t.Context(), id)
			if (err != nil) != c.wantErr {
				t.Errorf("Pause = %v, want error %v", err, c.wantErr)
			}
			b, _ := os.ReadFile(calls)
			if n := strings.Count(string(b), "x"); n != c.wantCalls {
				t.Errorf("runc pause ran %d times, want %d", n, c.wantCalls)
			}
		})
	}
}
