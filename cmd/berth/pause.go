package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newPauseCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a sandbox: it stops using CPU and gives its memory back",
		Long: "Pause a sandbox. What it keeps depends on its runtime, and is printed: " +
			"memory (every process and its memory) or filesystem (its files, environment, " +
			"labels, network policy and remaining time; its processes end and resume " +
			"starts its agent again). Its deadline stops until it is resumed.",
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Pause(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, sb)
			}
			fmt.Fprintf(a.out, "%s paused (%s), %s left\n", sb.ID, sb.Pause, sb.Remaining)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newResumeCmd(a *app) *cobra.Command {
	var (
		timeout string
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Resume a paused sandbox; returns once its agent answers",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var d time.Duration
			if timeout != "" {
				var err error
				if d, err = time.ParseDuration(timeout); err != nil || d <= 0 {
					return invalidf("--timeout %q: want a positive duration such as 30m", timeout)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Resume(cmd.Context(), args[0], d)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, sb)
			}
			fmt.Fprintf(a.out, "%s resumed, expires at %s\n", sb.ID, sb.Deadline.Local().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&timeout, "timeout", "", "deadline from now (default: the time it had left when paused)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}
