package e2e

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/berth-sandbox/berth/client"
)

// TestShellPTY drives `berth shell` from a real pseudo-terminal, as a
// person at a terminal would: typing, resizing and Ctrl-C.
func TestShellPTY(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		sb := d.Create(t, client.CreateRequest{Isolation: iso})
		cmd := exec.Command(bin.Berth, "shell", sb.ID)
		cmd.Env = append(os.Environ(), "BERTH_URL="+d.URL, "TERM=xterm")
		tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 100})
		if err != nil {
			t.Fatal(err)
		}
		defer tty.Close()
		var screen syncBuffer
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := tty.Read(buf)
				screen.Write(buf[:n])
				if err != nil {
					return
				}
			}
		}()
		expect := func(what string) {
			t.Helper()
			waitFor(t, 15*time.Second, what+" on the terminal (screen: "+screen.String()+")", func() bool {
				return strings.Contains(screen.String(), what)
			})
		}
		tty.Write([]byte("echo hel''lo-from-pty\r"))
		expect("hello-from-pty")
		tty.Write([]byte("stty size\r"))
		expect("30 100")
		// Resize the outer terminal: SIGWINCH reaches berth, which resizes the
		// sandbox's PTY.
		pty.Setsize(tty, &pty.Winsize{Rows: 40, Cols: 120})
		cmd.Process.Signal(syscall.SIGWINCH)
		waitFor(t, 15*time.Second, "resize to 40 120", func() bool {
			tty.Write([]byte("stty size\r"))
			time.Sleep(100 * time.Millisecond)
			return strings.Contains(screen.String(), "40 120")
		})
		// Ctrl-C interrupts the foreground command, not the shell. (Under
		// gVisor the agent makes the signal: internal/agent/ptysig.go.)
		// The command prints once it is the foreground process (its own
		// process group, default SIGINT), so the Ctrl-C cannot race its
		// start.
		tty.Write([]byte("sh -c 'echo sl\"\"eeping; exec sleep 100'\r"))
		expect("sleeping\r\n")
		tty.Write([]byte{3})
		tty.Write([]byte("echo after-ctrl''c\r"))
		expect("after-ctrlc")
		tty.Write([]byte("exit 3\r"))
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Errorf("berth shell ended with %v, want exit 3", err)
			}
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("berth shell did not end after exit (screen: %s)", screen.String())
		}
	})
}
