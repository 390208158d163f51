package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

func newWorklogCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "worklog ID",
		Short: "Show what was run and written in a sandbox through the API",
		Long: `Show a sandbox's work log: every command started through the API (argv,
cwd, user, exit status, output sizes) and every file written, oldest first.
The daemon keeps it host-side; it outlives the sandbox. --json prints one
entry per line with everything recorded, including the first and last KiB of
each output stream.`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			es, err := c.Worklog(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.out)
				for _, e := range es {
					if err := enc.Encode(e); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tKIND\tUSER\tPID\tEXIT\tDURATION\tOUT/ERR\tWHAT")
			for _, e := range es {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.DateTime), e.Kind, orDash(e.User),
					pidText(e), exitText(e), durText(e), outText(e), whatText(e))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print entries as JSON lines")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func pidText(e client.WorklogEntry) string {
	if e.PID == 0 {
		return "-"
	}
	return strconv.FormatUint(uint64(e.PID), 10)
}

func exitText(e client.WorklogEntry) string {
	switch {
	case e.Kind != "exec" && e.Kind != "attach":
		if e.HTTPStatus == 0 {
			return "-"
		}
		return strconv.Itoa(e.HTTPStatus)
	case e.Done:
		return strconv.Itoa(client.ExitCode(e.ExitCode, e.Exited, e.Status))
	case e.Error != "":
		return "error"
	case e.End.IsZero():
		return "running"
	}
	return "detached"
}

func durText(e client.WorklogEntry) string {
	if e.End.IsZero() {
		return "-"
	}
	return e.End.Sub(e.Time).Round(time.Millisecond).String()
}

func outText(e client.WorklogEntry) string {
	switch e.Kind {
	case "exec", "attach":
		if e.PTY {
			return strconv.FormatInt(e.PTYOut.Bytes, 10) + " (pty)"
		}
		return strconv.FormatInt(e.Stdout.Bytes, 10) + "/" + strconv.FormatInt(e.Stderr.Bytes, 10)
	case "write":
		return strconv.FormatInt(e.Size, 10)
	}
	return "-"
}

func whatText(e client.WorklogEntry) string {
	switch e.Kind {
	case "exec":
		s := strings.Join(append([]string{strconv.Quote(e.Cmd)}, quoteAll(e.Args)...), " ")
		if e.Cwd != "" {
			s += "  (in " + e.Cwd + ")"
		}
		return s
	case "attach":
		return "attach " + pidText(e)
	case "move":
		return e.Path + " -> " + e.Dest
	case "write":
		if len(e.Paths) > 0 {
			return strings.Join(e.Paths, ", ")
		}
	}
	return e.Path
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

func newDiffCmd(a *app) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "diff ID",
		Short: "Print the git diff of a sandbox's checkout against its base commit",
		Long: `Print the binary-safe git diff (apply it with git apply) of the checkout at
--path against the commit it was checked out at: tracked changes, deletions
and new untracked files, committed since or not. The base is the commit in
.git/berth-base, else where HEAD forked from its upstream (or origin's
default branch), else HEAD. Git runs inside the sandbox; the index there is
left as it was.`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Diff(cmd.Context(), args[0], path, a.out)
		},
	}
	cmd.Flags().StringVar(&path, "path", "/workspace", "the checkout in the sandbox")
	return cmd
}

func newExportCmd(a *app) *cobra.Command {
	var path, format string
	cmd := &cobra.Command{
		Use:   "export ID --format patch|bundle > FILE",
		Short: "Export a sandbox's work as a patch series or a git bundle",
		Long: `Write the work in the checkout at --path to stdout.

  patch   the commits since the base (git format-patch), then the uncommitted
          changes as one last patch "Uncommitted changes" by the commit
          author: apply with git am to a clone at the base.
  bundle  the commits since the base, with refs HEAD and the current branch:
          git fetch FILE BRANCH:BRANCH in a clone that has the base. Commit
          first (berth commit); uncommitted changes are not in a bundle.`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != client.ExportPatch && format != client.ExportBundle {
				return invalidf("--format %q: want patch or bundle", format)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Export(cmd.Context(), args[0], path, format, a.out)
		},
	}
	cmd.Flags().StringVar(&path, "path", "/workspace", "the checkout in the sandbox")
	cmd.Flags().StringVar(&format, "format", client.ExportPatch, "patch or bundle")
	return cmd
}

func newCommitCmd(a *app) *cobra.Command {
	var req client.CommitRequest
	cmd := &cobra.Command{
		Use:   "commit ID -m MSG [--branch B] [--author 'Name <mail>']",
		Short: "Commit everything in a sandbox's checkout, inside the sandbox",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(req.Message) == "" {
				return invalidf("-m MSG is required")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Commit(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s %s (%s)\n", res.Commit, orDash(res.Branch), res.Author)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&req.Message, "message", "m", "", "commit message")
	f.StringVar(&req.Branch, "branch", "", "create this branch from HEAD and commit there")
	f.StringVar(&req.Author, "author", "", "author 'Name <email>' (default: the daemon's commit_author)")
	f.StringVar(&req.Path, "path", "/workspace", "the checkout in the sandbox")
	return cmd
}
