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
			var err error
			if opts.Since, err = parseWhen("--since", since); err != nil {
				return err
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

// parseWhen reads a time flag: an RFC 3339 time or a duration back from
// now; "" is the zero time.
func parseWhen(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := units.ParseDuration(v); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, invalidf("%s %q: want an RFC 3339 time or a duration back from now such as 10m", flag, v)
}

func newMetricsCmd(a *app) *cobra.Command {
	var since, until, output string
	cmd := &cobra.Command{
		Use:   "metrics ID [--since T] [--until T] [-o json]",
		Short: "Print a sandbox's usage over time",
		Long: `Print a sandbox's usage readings, oldest first: its CPU limit (the host's
CPUs without one) and its share of it since the reading before, CPU-seconds so far, memory and disk in use and
their limits. The daemon takes one every 5 s while the sandbox runs and
keeps its whole life at a resolution that coarsens with age (at most 720
readings, in memory: a daemon restart starts anew). --since and --until
take an RFC 3339 time or a duration back from now (10m); without --until
the last reading is taken now.`,
		Args: exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" && output != "table" {
				return invalidf("-o %q: want json or table", output)
			}
			var opts client.MetricsOptions
			var err error
			if opts.Since, err = parseWhen("--since", since); err != nil {
				return err
			}
			if opts.Until, err = parseWhen("--until", until); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ms, err := c.Metrics(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			if output == "json" {
				if ms == nil {
					ms = []client.MetricSample{}
				}
				return printJSON(a.out, ms)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tCPUS\tCPU%\tCPU-S\tMEM\tMEM-LIMIT\tDISK\tDISK-SIZE")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Time.Local().Format(time.DateTime), strconv.FormatFloat(m.CPUs, 'f', -1, 64), strconv.FormatFloat(m.CPUPercent, 'f', 1, 64),
					fmtF(m.CPUSeconds), humanBytes(m.MemoryBytes), humanBytes(m.MemoryLimitBytes), humanBytes(m.DiskUsedBytes), humanBytes(m.DiskBytes))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "readings from T on (RFC 3339, or a duration back from now)")
	cmd.Flags().StringVar(&until, "until", "", "readings up to T (RFC 3339, or a duration back from now)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func fmtF(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
