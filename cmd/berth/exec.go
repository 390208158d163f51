package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

// splitExecArgs splits "ID [--] CMD ARGS…" given cobra's position of "--"
// (-1 when absent). With "--", exactly the ID must precede it; without,
// the first argument is the ID and the rest the command (which then cannot
// have flags of its own: they would be read as berth's).
func splitExecArgs(args []string, dash int) (id string, argv []string, err error) {
	if dash >= 0 {
		if dash != 1 {
			return "", nil, invalidf("want exactly one sandbox ID before --, got %d argument(s)", dash)
		}
		argv = args[dash:]
	} else {
		if len(args) == 0 {
			return "", nil, invalidf("want a sandbox ID and a command")
		}
		argv = args[1:]
	}
	if len(argv) == 0 || argv[0] == "" {
		return "", nil, invalidf("want a command after the sandbox ID")
	}
	return args[0], argv, nil
}

func newExecCmd(a *app) *cobra.Command {
	var (
		req         client.ExecRequest
		env         []string
		background  bool
		interactive bool
	)
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARG…]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox, streaming its stdout and stderr live, and exit
with its exit code (128+n when signal n ended it, 124 when --timeout passed).

The command lives as long as berth waits for it: when berth is interrupted
(Ctrl-C, SIGTERM) or loses its connection, the command's process group in
the sandbox is killed. --background commands run on by themselves.

Standard input is forwarded when it is not a terminal (a pipe or a file), or
always with -i. From a terminal without -i the command gets an empty stdin,
so a stray "cat" does not wait for typing that is never meant for it.`,
		Args: minArgs(1, "a sandbox ID and a command"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv, err := splitExecArgs(args, cmd.ArgsLenAtDash())
			if err != nil {
				return err
			}
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if background && interactive {
				return invalidf("--background and -i exclude each other")
			}
			req.Cmd, req.Args = argv[0], argv[1:]
			c, err := a.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(id)
			if background {
				pid, err := sb.Start(cmd.Context(), req)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.out, pid)
				return nil
			}
			if interactive || !isTerminal(a.in) {
				req.Stdin = a.in
			}
			req.Stdout, req.Stderr = a.out, a.err
			code, err := sb.Exec(cmd.Context(), req)
			if err != nil && cmd.Context().Err() != nil {
				// SIGTERM (main's context) ended the wait, and with it
				// the command; end as a process killed by it would.
				return exitCodeError{128 + int(syscall.SIGTERM)}
			}
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&req.Cwd, "cwd", "w", "", "working directory")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringVarP(&req.User, "user", "u", "", "user to run as (default root)")
	f.BoolVarP(&background, "background", "d", false, "start in the background and print the pid")
	f.BoolVarP(&interactive, "interactive", "i", false, "forward stdin even from a terminal")
	f.StringVar(&req.Tag, "tag", "", "tag the process for later selection")
	f.DurationVar(&req.Timeout, "timeout", 0, "kill the command after this long (e.g. 30s, 5m) and exit 124")
	return cmd
}

func newAttachCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "attach ID PID",
		Short: "Follow a running process's output and exit with its code",
		Args:  exactArgs(2, "a sandbox ID and a pid"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			code, err := c.Sandbox(args[0]).Attach(cmd.Context(), pid, a.out, a.err)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
}

func parsePID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 {
		return 0, invalidf("pid %q: want a positive number", s)
	}
	return uint32(n), nil
}

func newPsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps ID",
		Short: "List the processes started in a sandbox",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ps, err := c.Sandbox(args[0]).Processes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if ps == nil {
					ps = []client.ProcessInfo{}
				}
				enc := json.NewEncoder(a.out)
				enc.SetIndent("", "  ")
				return enc.Encode(ps)
			}
			return printProcesses(a.out, ps)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printProcesses(w io.Writer, ps []client.ProcessInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tTAG\tCOMMAND")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", p.PID, p.Tag, strings.Join(append([]string{p.Cmd}, p.Args...), " "))
	}
	return tw.Flush()
}

func newSignalCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "signal ID PID [TERM|KILL|INT|HUP]",
		Short: "Send a signal (default TERM) to a process in a sandbox",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 && len(args) != 3 {
				return invalidf("want a sandbox ID, a pid and optionally a signal")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			sig := 15
			if len(args) == 3 {
				n, ok := client.ParseSignal(args[2])
				if !ok {
					return invalidf("signal %q: want TERM, KILL, INT, HUP or a number", args[2])
				}
				sig = n
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Sandbox(args[0]).Signal(cmd.Context(), pid, sig)
		},
	}
}
