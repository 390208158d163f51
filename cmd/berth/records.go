package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// liveStates are the states `berth ls` shows without --all.
const liveStates = client.StateCreating + "," + client.StateReady + "," + client.StatePaused + "," + client.StateStopping

// reportAll prints every error but the last and returns the last (which
// decides the code printed), or nil.
func reportAll(a *app, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	for _, err := range errs[:len(errs)-1] {
		reportError(a.err, err)
	}
	return errs[len(errs)-1]
}

func newKillCmd(a *app) *cobra.Command {
	var bulk bulkFlags
	cmd := &cobra.Command{
		Use:   "kill [ID…] [--label k=v…] [--all]",
		Short: "Destroy sandboxes (an already stopped one is not an error)",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ids, err := bulk.ids(cmd.Context(), c, args, liveStates, "kills every live sandbox you can see")
			if err != nil {
				return err
			}
			// Kill every one asked for, then report failures.
			var errs []error
			for _, id := range ids {
				if err := c.Kill(cmd.Context(), id); err != nil {
					// Killing what has already ended is done: exit 0.
					if errors.Is(err, errdefs.ErrNotFound) {
						if sb, gerr := c.Get(cmd.Context(), id); gerr == nil && (sb.State == client.StateStopped || sb.State == client.StateFailed) {
							fmt.Fprintln(a.out, id)
							continue
						}
					}
					errs = append(errs, fmt.Errorf("kill %s: %w", id, err))
					continue
				}
				fmt.Fprintln(a.out, id)
			}
			return reportAll(a, errs)
		},
	}
	bulk.add(cmd, "kill", "live")
	return cmd
}

func newRmCmd(a *app) *cobra.Command {
	return newRemoveEachCmd(a, "rm ID [ID…]", "Remove stopped or failed sandboxes' records and logs now (the daemon does after its retention)",
		"at least one sandbox ID", (*client.Client).Remove)
}

// newRemoveEachCmd is a command that removes each thing its arguments
// name with remove, printing each one removed and reporting every
// failure (the last as its error).
func newRemoveEachCmd(a *app, use, short, what string, remove func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  minArgs(1, what),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if err := remove(c, cmd.Context(), id); err != nil {
					errs = append(errs, fmt.Errorf("rm %s: %w", id, err))
					continue
				}
				fmt.Fprintln(a.out, id)
			}
			return reportAll(a, errs)
		},
	}
}
