package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// goneLimit bounds the wait for a killed process to disappear. The commands
// under test sleep for 300 s, so a process that was not killed fails.
const goneLimit = 30 * time.Second

// holdScript starts a child in the same process group and prints both pids.
const holdScript = "sleep 300 & echo $$ $!; wait"

// TestCommandsDieWithTheirClient: a foreground command's process group is
// killed when its client goes away: the Go SDK's ctx deadline or cancel, the
// CLI interrupted, terminated or killed. Background commands run on.
func TestCommandsDieWithTheirClient(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})

	t.Run("sdk-deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		var out syncBuffer
		_, err := sb.Exec(ctx, client.ExecRequest{Cmd: "sh", Args: []string{"-c", holdScript}, Stdout: &out})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Exec past its deadline = %v, want context.DeadlineExceeded", err)
		}
		assertGone(t, sb, pidsOf(t, out.String())...)
	})

	t.Run("sdk-cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		errc := make(chan error, 1)
		go func() {
			_, err := sb.Exec(ctx, client.ExecRequest{Cmd: "sh", Args: []string{"-c", holdScript}, Stdout: w})
			w.Close()
			errc <- err
		}()
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			t.Fatalf("first line: %v", err)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Exec = %v, want context.Canceled", err)
		}
		assertGone(t, sb, pidsOf(t, line)...)
	})

	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		code int
	}{
		{"cli-interrupt", syscall.SIGINT, -1}, // Ctrl-C: berth dies of it
		{"cli-terminate", syscall.SIGTERM, 128 + 15},
		{"cli-killed", syscall.SIGKILL, -1}, // the connection just drops
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin.Berth, "exec", sb.ID, "--", "sh", "-c", holdScript)
			cmd.Env = append(os.Environ(), "BERTH_URL="+d.URL)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("first line: %v", err)
			}
			pids := pidsOf(t, line)
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Errorf("berth exec after %v ended with %v, want exit code %d", tc.sig, err, tc.code)
			}
			assertGone(t, sb, pids...)
		})
	}

	t.Run("background-runs-on", func(t *testing.T) {
		out, errOut, code := d.CLI(t, nil, "exec", sb.ID, "--background", "--", "sleep", "300")
		if code != 0 {
			t.Fatalf("exec --background: %d %s", code, errOut)
		}
		pid := atoi(strings.TrimSpace(out))
		// Its start stream is closed; a second command's round trip later
		// it still runs, and ends only when signalled.
		if o, _, code := Run(t, sb, "kill -0 "+strconv.Itoa(pid)+" && echo alive"); code != 0 || o != "alive\n" {
			t.Fatalf("background pid %d after berth exited: %q %d, want alive", pid, o, code)
		}
		ctx, cancel := context.WithTimeout(t.Context(), goneLimit)
		defer cancel()
		attached := make(chan int, 1)
		go func() {
			c, _ := sb.Attach(ctx, uint32(pid), nil, nil)
			attached <- c
		}()
		if err := sb.Signal(ctx, uint32(pid), 15); err != nil {
			t.Fatal(err)
		}
		if c := <-attached; c != 128+15 && c != -1 {
			t.Errorf("background process ended with %d, want 143 (SIGTERM)", c)
		}
		assertGone(t, sb, pid)
	})
}

// TestExecTimeout: --timeout (and ExecRequest.Timeout, timeout_ms on the
// wire) kills the process group at the limit and exits 124, as coreutils'
// timeout does; a command that ends in time keeps its own code.
func TestExecTimeout(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})

	out, errOut, code := d.CLI(t, nil, "exec", sb.ID, "--timeout", "1s", "--", "sh", "-c", holdScript)
	if code != 124 {
		t.Errorf("exec --timeout 1s of a 300 s command = %d (%q), want 124", code, errOut)
	}
	assertGone(t, sb, pidsOf(t, out)...)

	if _, _, code := d.CLI(t, nil, "exec", sb.ID, "--timeout", "1m", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("exec --timeout 1m of exit 3 = %d, want 3", code)
	}
	if _, errOut, code := d.CLI(t, nil, "exec", sb.ID, "--timeout", "-5s", "--", "true"); code != 1 || !strings.Contains(errOut, "timeout") || !strings.Contains(errOut, "invalid_argument") {
		t.Errorf("exec --timeout -5s = %d %q, want an invalid_argument error naming timeout", code, errOut)
	}

	var o bytes.Buffer
	c, err := sb.Exec(t.Context(), client.ExecRequest{Cmd: "sh", Args: []string{"-c", holdScript}, Stdout: &o, Timeout: 500 * time.Millisecond})
	if err != nil || c != 124 {
		t.Errorf("Exec with Timeout 500ms = %d, %v; want 124", c, err)
	}
	assertGone(t, sb, pidsOf(t, o.String())...)

	// A background command's limit holds after its client left.
	out, errOut, code = d.CLI(t, nil, "exec", sb.ID, "--background", "--timeout", "1s", "--", "sleep", "300")
	if code != 0 {
		t.Fatalf("exec --background --timeout: %d %s", code, errOut)
	}
	assertGone(t, sb, atoi(strings.TrimSpace(out)))
}

// TestShellPipedStdin: without a terminal, berth shell runs its input to
// the end and exits with the shell's code, at once (it used to hang until
// the sandbox's deadline, then fail with a protocol error).
func TestShellPipedStdin(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})
	for _, tc := range []struct {
		name, in, out, errOut string
		code                  int
	}{
		{"script", "echo hi-$((1+2))\necho oops >&2\nexit 3\n", "hi-3\n", "oops\n", 3},
		{"last-status", "ls -d /tmp\nfalse\n", "/tmp\n", "", 1},
		{"empty", "", "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin.Berth, "shell", sb.ID)
			cmd.Env = append(os.Environ(), "BERTH_URL="+d.URL)
			cmd.Stdin = strings.NewReader(tc.in)
			var o, e bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &e
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("berth shell with piped stdin did not end: %v (stdout %q, stderr %q)", ctx.Err(), o.String(), e.String())
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if o.String() != tc.out || e.String() != tc.errOut || code != tc.code {
				t.Errorf("berth shell <<< %q = (%q, %q, %d), want (%q, %q, %d)", tc.in, o.String(), e.String(), code, tc.out, tc.errOut, tc.code)
			}
		})
	}
}

// pidsOf parses the pids a holdScript printed.
func pidsOf(t *testing.T, s string) []int {
	t.Helper()
	f := strings.Fields(s)
	if len(f) == 0 {
		t.Fatalf("no pids in %q", s)
	}
	var pids []int
	for _, p := range f {
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("pid %q in %q", p, s)
		}
		pids = append(pids, n)
	}
	return pids
}

// assertGone waits until none of pids exists in the sandbox any more, as
// its kernel reports (the agent, PID 1 there, reaps every orphan).
func assertGone(t *testing.T, sb *client.Sandbox, pids ...int) {
	t.Helper()
	var list []string
	for _, p := range pids {
		list = append(list, strconv.Itoa(p))
	}
	script := "for p in " + strings.Join(list, " ") + "; do kill -0 $p 2>/dev/null && exit 1; done; exit 0"
	waitFor(t, goneLimit, "pids "+strings.Join(list, " ")+" to be gone from the sandbox", func() bool {
		_, _, code := Run(t, sb, script)
		return code == 0
	})
}
