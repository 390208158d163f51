package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

func newSnapshotCmd(a *app) *cobra.Command {
	var (
		name   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "snapshot ID",
		Short: "Snapshot a running sandbox and print the snapshot's ID",
		Long: "Snapshot a running sandbox: its files (writable layer) plus its template, isolation, " +
			"limits, env, labels, user and network policy; under gVisor, where runsc can (`berth version` " +
			"says per level), also every process with its memory (kind memory). The sandbox keeps " +
			"running (its processes are frozen only while its memory and files are saved). Start a " +
			"sandbox from it with `berth create --snapshot SNAPSHOT` (from a memory snapshot, it carries " +
			"on the snapshot's processes under its own ID, token, address and hostname); list, remove, " +
			"export and import with the subcommands.",
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.Snapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, s)
			}
			fmt.Fprintln(a.out, s.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name to show in listings")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	cmd.AddCommand(newSnapshotLsCmd(a), newSnapshotRmCmd(a), newSnapshotExportCmd(a), newSnapshotImportCmd(a))
	return cmd
}

func newSnapshotLsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, list)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			// A Kubernetes gateway names the nodes that hold each.
			onNodes := slices.ContainsFunc(list, func(s client.Snapshot) bool { return len(s.Nodes) > 0 })
			head := "ID\tNAME\tSOURCE\tKIND\tTEMPLATE\tSIZE\tCREATED"
			if onNodes {
				head += "\tNODES"
			}
			fmt.Fprintln(tw, head)
			for _, s := range list {
				name := s.Name
				if name == "" {
					name = "-"
				}
				line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", s.ID, name, s.Source, s.Kind, s.Template,
					humanBytes(s.SizeBytes), s.CreatedAt.Local().Format(time.DateTime))
				if onNodes {
					line += "\t" + strings.Join(s.Nodes, ",")
				}
				fmt.Fprintln(tw, line)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newSnapshotRmCmd(a *app) *cobra.Command {
	return newRemoveEachCmd(a, "rm SNAPSHOT...", "Remove snapshots (refused while a sandbox or another snapshot sits on one)",
		"at least one snapshot ID", (*client.Client).RemoveSnapshot)
}

func newSnapshotExportCmd(a *app) *cobra.Command {
	return newArchiveExportCmd(a, "export SNAPSHOT -o FILE", "Write a snapshot as a portable archive (import it on another daemon)", "",
		"a snapshot ID", func(ctx context.Context, c *client.Client, id string, w io.Writer) error {
			return c.ExportSnapshot(ctx, id, w)
		})
}

func newSnapshotImportCmd(a *app) *cobra.Command {
	var (
		asJSON bool
		labels []string
		node   string
		id     string
	)
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Import a snapshot archive and print the new snapshot's ID",
		Long: "Import an archive written by `berth snapshot export` (on this or another daemon). " +
			"Every layer's size and SHA-256 and every path in it are checked before the snapshot " +
			"is recorded; the template it names must exist on this daemon.",
		Args: exactArgs(1, "an archive file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			c, err := a.client()
			if err != nil {
				return err
			}
			lm, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			s, err := c.ImportSnapshotWith(cmd.Context(), f, client.ImportOptions{Labels: lm, Node: node, ID: id})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, s)
			}
			fmt.Fprintln(a.out, s.ID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label k=v set on the snapshot over the archive's (repeatable)")
	cmd.Flags().StringVar(&node, "node", "", "on a Kubernetes gateway: the Berth node to import to (default: the Ready node holding the fewest snapshots)")
	cmd.Flags().StringVar(&id, "id", "", "on a daemon: import under this snapshot ID (default: a new one; one the daemon has is refused)")
	return cmd
}

func newForkCmd(a *app) *cobra.Command {
	var (
		n      int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Make live copies of a running sandbox and print their IDs",
		Long: "Fork a running sandbox into N copies made from a snapshot of it. The parent keeps " +
			"running; each copy has its own ID, token, files (writes in one are invisible to the " +
			"others), network address and deadline (the time the parent had left). Under gVisor, " +
			"where snapshots keep memory, every copy carries on the parent's running processes " +
			"with their memory; elsewhere copies start their processes afresh. The fork's " +
			"snapshot goes with its last copy.",
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return invalidf("-n %d: want at least 1", n)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, res)
			}
			for _, sb := range res.Sandboxes {
				fmt.Fprintln(a.out, sb.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "number of copies (1-"+strconv.Itoa(16)+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the copies and their snapshot as JSON")
	return cmd
}
