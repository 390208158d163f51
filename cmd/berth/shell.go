package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-sandbox/berth/client"
)

// loginShell runs the user's login shell from the sandbox's passwd
// database, falling back to /bin/sh. getent is missing from minimal images,
// so /etc/passwd is read directly as a second try.
const loginShell = `u=$(id -un 2>/dev/null)
s=$(getent passwd "$u" 2>/dev/null | cut -d: -f7)
[ -n "$s" ] || s=$(grep "^$u:" /etc/passwd 2>/dev/null | cut -d: -f7)
[ -x "$s" ] || s=/bin/sh
exec "$s" -l`

// isTerminal reports whether r is a terminal.
func isTerminal(r any) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func newShellCmd(a *app) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive shell in a sandbox",
		Long: `Open the user's login shell (falling back to /bin/sh) on a terminal in the
sandbox. The local terminal is put in raw mode, so Ctrl-C and other keys
reach the remote shell; exit the shell to leave. berth exits with the
shell's exit code.

Without a terminal on standard input (echo ls | berth shell ID, or a script
redirected in), there is nobody to type: the login shell runs the input
non-interactively to its end, without a terminal, its output and errors
going to berth's, and berth exits with its code.`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			code, err := runShell(cmd.Context(), a, c.Sandbox(args[0]), user)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user to log in as (default root)")
	return cmd
}

func runShell(ctx context.Context, a *app, sb *client.Sandbox, user string) (int, error) {
	in, _ := a.in.(*os.File)
	tty := in != nil && term.IsTerminal(int(in.Fd()))
	if !tty {
		// Piped input is a script, not keystrokes: a terminal would echo it,
		// prompt between lines and leave end of input to a typed Ctrl-D
		// the shell may not read as such. Run it as ssh does without a
		// terminal.
		return sb.Exec(ctx, client.ExecRequest{
			Cmd: "/bin/sh", Args: []string{"-c", loginShell},
			User: user, Stdin: a.in, Stdout: a.out, Stderr: a.err,
		})
	}
	cols, rows := 80, 24
	if w, h, err := term.GetSize(int(in.Fd())); err == nil {
		cols, rows = w, h
	}
	termName := os.Getenv("TERM")
	if termName == "" {
		termName = "xterm-256color"
	}
	p, err := sb.StartPTY(ctx, client.PTYRequest{
		Cmd: "/bin/sh", Args: []string{"-c", loginShell},
		Env:  map[string]string{"TERM": termName},
		User: user, Cols: uint16(cols), Rows: uint16(rows),
	})
	if err != nil {
		return -1, err
	}
	defer p.Close()

	old, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return -1, err
	}
	defer func() { _ = term.Restore(int(in.Fd()), old) }()

	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				if w, h, err := term.GetSize(int(in.Fd())); err == nil {
					_ = p.Resize(uint16(w), uint16(h))
				}
			}
		}
	}()

	// Not waited for: a read from the terminal cannot be interrupted, and
	// berth exits right after the shell does.
	go func() { _, _ = io.Copy(p, a.in) }()
	if _, err := io.Copy(a.out, p); err != nil && !errors.Is(err, io.EOF) {
		return -1, err
	}
	return p.Wait()
}
