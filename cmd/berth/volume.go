package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

func newVolumeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes"},
		Short:   "Manage volumes: named, size-capped filesystems that outlive sandboxes",
		Long: "A volume keeps files across sandboxes: bind it into one with `berth create --volume " +
			"NAME:/path` (`:ro` for read-only); several sandboxes may bind it at once and see each " +
			"other's writes. It is capped at its size (a full volume is ENOSPC inside it, never a full " +
			"host disk) and cannot be removed while a sandbox that binds it exists.",
		Args: exactArgs(0, "a subcommand"),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newVolumeCreateCmd(a), newVolumeLsCmd(a), newVolumeInspectCmd(a), newVolumeRmCmd(a), newVolumeCpCmd(a))
	return cmd
}

func newVolumeCreateCmd(a *app) *cobra.Command {
	var (
		size   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Make a volume and print its ID",
		Args:  exactArgs(1, "a volume name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if size != "" {
				if err := checkSize("size", size); err != nil {
					return err
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, v)
			}
			fmt.Fprintln(a.out, v.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&size, "size", "", "capacity, such as 10G (default: the daemon's volume_bytes, 10 GiB)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the volume as JSON")
	return cmd
}

func newVolumeLsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List volumes",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []client.Volume{}
				}
				return printJSON(a.out, list)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSIZE\tCREATED")
			for _, v := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.ID, v.Name, humanBytes(v.SizeBytes), v.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newVolumeInspectCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect VOLUME",
		Short: "Print a volume (by ID or name) as JSON, with the sandboxes that bind it",
		Args:  exactArgs(1, "a volume ID or name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(a.out, v)
		},
	}
}

func newVolumeRmCmd(a *app) *cobra.Command {
	return newRemoveEachCmd(a, "rm VOLUME...", "Delete volumes and their files (refused while a sandbox that binds one exists)",
		"at least one volume ID or name", (*client.Client).RemoveVolume)
}

// parseVolumeFlags reads --volume NAME:/path[:ro] flags.
func parseVolumeFlags(flags []string) ([]client.VolumeMount, error) {
	out := make([]client.VolumeMount, 0, len(flags))
	for _, f := range flags {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, invalidf("--volume %q: want VOLUME:/path or VOLUME:/path:ro", f)
		}
		m := client.VolumeMount{Volume: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				m.ReadOnly = true
			case "rw":
			default:
				return nil, invalidf("--volume %q: the third part is ro or rw, not %q", f, parts[2])
			}
		}
		out = append(out, m)
	}
	return out, nil
}
