package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/units"
)

func newUsageCmd(a *app) *cobra.Command {
	var by, since, output string
	cmd := &cobra.Command{
		Use:   "usage [--by key|sandbox] [--since T] [-o json]",
		Short: "Print metered usage per API key or per sandbox",
		Long: `Print what sandboxes used, per API key (--by key, the default) or per
sandbox: CPU-seconds (the cgroups' own accounting), memory GiB-seconds,
peak memory, disk in use, egress bytes and sandbox-seconds. Usage is
metered while sandboxes run and kept after they are gone. --since takes
an RFC 3339 time or a duration back from now (24h).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if by != "key" && by != "sandbox" {
				return invalidf("--by %q: want key or sandbox", by)
			}
			if output != "" && output != "json" && output != "table" {
				return invalidf("-o %q: want json or table", output)
			}
			opts := client.UsageOptions{By: by}
			if since != "" {
				if t, err := time.Parse(time.RFC3339, since); err == nil {
					opts.Since = t
				} else if d, err := units.ParseDuration(since); err == nil {
					opts.Since = time.Now().Add(-d)
				} else {
					return invalidf("--since %q: want an RFC 3339 time or a duration such as 24h", since)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			us, err := c.Usage(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if output == "json" {
				if us == nil {
					us = []client.UsageRecord{}
				}
				return printJSON(a.out, map[string]any{"usage": us})
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			first := "KEY"
			if by == "sandbox" {
				first = "SANDBOX\tKEY"
			}
			fmt.Fprintln(tw, first+"\tCPU-S\tMEM-GIB-S\tMEM-PEAK\tDISK\tEGRESS\tSANDBOX-S")
			for _, u := range us {
				name := u.Key
				if name == "" {
					name = "-"
				}
				if by == "sandbox" {
					name = u.Sandbox + "\t" + name
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, fmtF(u.CPUSeconds), fmtF(u.MemoryGiBSeconds),
					humanBytes(u.MemoryPeakBytes), humanBytes(u.DiskBytes), humanBytes(u.EgressBytes), fmtF(u.SandboxSeconds))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&by, "by", "key", "key or sandbox")
	cmd.Flags().StringVar(&since, "since", "", "only sandboxes metered since T (RFC 3339, or a duration back from now)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func fmtF(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
