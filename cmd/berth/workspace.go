package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// workspaceFlags are create's repository flags.
type workspaceFlags struct {
	repo, ref, envFile string
	noCache            bool
}

func (w *workspaceFlags) register(f *pflag.FlagSet) {
	f.StringVar(&w.repo, "repo", "", "clone this repository (file://, http://, https://) into /workspace and run its setup")
	f.StringVar(&w.ref, "ref", "", "branch, tag or commit to check out (default HEAD)")
	f.StringVar(&w.envFile, "env-file", "", "environment file to use instead of the repository's .berth/environment.yaml")
	f.BoolVar(&w.noCache, "no-cache", false, "neither use nor fill the environment cache")
}

// createWorkspace runs a workspace create, streaming setup output to
// stderr, and prints the sandbox ID.
func (a *app) createWorkspace(cmd *cobra.Command, c *client.Client, req client.CreateRequest, w workspaceFlags, asJSON bool) error {
	if req.Network != nil {
		return invalidf("--repo: network flags do not apply; the environment file's network.setup and network.agent do")
	}
	wr := client.WorkspaceRequest{CreateRequest: req, Repo: w.repo, Ref: w.ref, NoCache: w.noCache}
	if w.envFile != "" {
		b, err := os.ReadFile(w.envFile)
		if err != nil {
			return invalidf("--env-file: %v", err)
		}
		s := string(b)
		wr.Environment = &s
	}
	sb, err := c.CreateWorkspace(cmd.Context(), wr, func(p client.WorkspaceProgress) {
		if p.Type == "log" {
			_, _ = io.WriteString(a.err, p.Message)
			return
		}
		fmt.Fprintf(a.err, "==> %s: %s\n", p.Type, p.Message)
	})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(a.out, sb)
	}
	fmt.Fprintln(a.out, sb.ID)
	return nil
}

func newEnvCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "env", Short: "Check environment files and manage cached environments"}
	check := &cobra.Command{
		Use:   "check PATH",
		Short: "Validate an environment file (- for stdin) without running it",
		Args:  exactArgs(1, "the environment file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var b []byte
			var err error
			if args[0] == "-" {
				b, err = io.ReadAll(a.in)
			} else {
				b, err = os.ReadFile(args[0])
			}
			if err != nil {
				return invalidf("%v", err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.CheckEnvironment(cmd.Context(), b)
			if err != nil {
				return err
			}
			// A file whose secrets this daemon lacks cannot run here: it
			// is not "valid", and the fix is the user's.
			if len(res.MissingSecrets) > 0 {
				return fmt.Errorf("%s: secrets not set on this daemon: %s (berth secret set NAME): %w", args[0], strings.Join(res.MissingSecrets, ", "), errdefs.ErrFailedPrecondition)
			}
			fmt.Fprintf(a.out, "%s: valid: template %q, %d setup step(s), network setup %s / agent %s\n", args[0], res.Template, len(res.Steps), res.SetupNetwork, res.AgentNetwork)
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List cached environments",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			envs, err := c.Environments(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tTEMPLATE\tREPO\tCOMMIT\tSIZE\tLAST USED")
			for _, e := range envs {
				commit := e.Commit
				if len(commit) > 12 {
					commit = commit[:12]
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dMiB\t%s\n", e.Key, e.Template, e.Repo, commit, e.SizeBytes>>20, e.LastUsed)
			}
			return tw.Flush()
		},
	}
	prune := &cobra.Command{
		Use:   "prune [KEY]",
		Short: "Remove cached environments no sandbox uses",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			key := ""
			if len(args) == 1 {
				key = args[0]
			}
			removed, err := c.PruneEnvironments(cmd.Context(), key)
			for _, k := range removed {
				fmt.Fprintln(a.out, k)
			}
			return err
		},
	}
	cmd.AddCommand(check, ls, prune)
	return cmd
}

func newSecretCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "secret", Short: "Manage secrets for workspace setup (values are never shown)"}
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Store a secret read from stdin",
		Args:  exactArgs(1, "the secret name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := io.ReadAll(io.LimitReader(a.in, 64<<10+1))
			if err != nil {
				return err
			}
			// A trailing newline from echo or a terminal is not part of it.
			v = []byte(strings.TrimSuffix(strings.TrimSuffix(string(v), "\n"), "\r"))
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.SetSecret(cmd.Context(), args[0], v)
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List secret names",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBYTES\tUPDATED")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%d\t%s\n", s.Name, s.SizeBytes, s.UpdatedAt)
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a secret",
		Args:  exactArgs(1, "the secret name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.RemoveSecret(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(set, ls, rm)
	return cmd
}
