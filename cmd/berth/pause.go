package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/berth-sandbox/berth/client"
)

// bulkFlags select the sandboxes a command acts on besides the IDs it is
// given: those with every --label, or --all it can see, in the state the
// command moves them from.
type bulkFlags struct {
	labels []string
	all    bool
	// parallel is --parallel, for commands that add it (hasParallel).
	parallel    int
	hasParallel bool
}

func (b *bulkFlags) add(cmd *cobra.Command, verb, which string) {
	cmd.Flags().StringArrayVarP(&b.labels, "label", "l", nil, verb+" the "+which+" sandboxes with label k=v (repeatable, all must match)")
	cmd.Flags().BoolVar(&b.all, "all", false, verb+" every "+which+" sandbox you can see")
}

// addParallel adds --parallel, how many requests run at once.
func (b *bulkFlags) addParallel(cmd *cobra.Command) {
	cmd.Flags().IntVar(&b.parallel, "parallel", 8, "how many sandboxes are acted on at once")
	b.hasParallel = true
}

// ids returns the IDs args name and those the flags select among the
// sandboxes in states (a comma-separated list), each once, in that order;
// all says what --all does, for its error.
func (b *bulkFlags) ids(ctx context.Context, c *client.Client, args []string, states, all string) ([]string, error) {
	lm, err := parseKV("label", b.labels)
	if err != nil {
		return nil, err
	}
	if len(args) == 0 && lm == nil && !b.all {
		return nil, invalidf("want sandbox IDs, --label k=v or --all")
	}
	if b.all && (len(args) > 0 || lm != nil) {
		return nil, invalidf("--all %s: give no IDs or labels with it", all)
	}
	if b.hasParallel && b.parallel < 1 {
		return nil, invalidf("--parallel %d: want 1 or more", b.parallel)
	}
	ids := args
	if lm != nil || b.all {
		sbs, err := c.List(ctx, client.ListOptions{Labels: lm, State: states})
		if err != nil {
			return nil, err
		}
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
	}
	seen := map[string]bool{}
	out := ids[:0:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// each runs do for every id, up to b.parallel at once, and returns the
// sandboxes done, in ids' order, and every failure, as "<verb> ID: …".
// line, when set, prints a line for each sandbox done as it is done.
func (b *bulkFlags) each(ids []string, verb string, do func(id string) (*client.Sandbox, error), line func(*client.Sandbox)) ([]*client.Sandbox, []error) {
	var (
		g    errgroup.Group
		mu   sync.Mutex // line's output
		done = make([]*client.Sandbox, len(ids))
		errs = make([]error, len(ids))
	)
	g.SetLimit(b.parallel)
	for i, id := range ids {
		g.Go(func() error {
			sb, err := do(id)
			if err != nil {
				errs[i] = fmt.Errorf("%s %s: %w", verb, id, err)
				return nil
			}
			done[i] = sb
			if line != nil {
				mu.Lock()
				line(sb)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait() // each failure is in errs
	var (
		sbs    []*client.Sandbox
		failed []error
	)
	for i := range ids {
		if errs[i] != nil {
			failed = append(failed, errs[i])
		} else {
			sbs = append(sbs, done[i])
		}
	}
	return sbs, failed
}

// finish prints sbs as JSON (one object for a single ID asked by name, an
// array otherwise) when asJSON, then reports every failure.
func finish(a *app, sbs []*client.Sandbox, errs []error, asJSON, single bool) error {
	if asJSON {
		var err error
		if single && len(sbs) == 1 {
			err = printJSON(a.out, sbs[0])
		} else if len(sbs) > 0 || len(errs) == 0 {
			err = printJSON(a.out, sbs)
		}
		if err != nil {
			return err
		}
	}
	return reportAll(a, errs)
}

func newPauseCmd(a *app) *cobra.Command {
	var (
		asJSON bool
		bulk   bulkFlags
	)
	cmd := &cobra.Command{
		Use:   "pause [ID…] [--label k=v…] [--all]",
		Short: "Pause sandboxes: they stop using CPU and give their memory back",
		Long: "Pause sandboxes. What each keeps depends on its runtime, and is printed: " +
			"memory (every process and its memory) or filesystem (its files, environment, " +
			"labels, network policy and remaining time; its processes end and resume " +
			"starts its agent again). Its deadline stops until it is resumed. With " +
			"--label or --all, the running sandboxes selected are paused, --parallel " +
			"at a time; every failure is reported and the exit code is non-zero if any.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ids, err := bulk.ids(cmd.Context(), c, args, client.StateReady, "pauses every running sandbox you can see")
			if err != nil {
				return err
			}
			var line func(*client.Sandbox)
			if !asJSON {
				line = func(sb *client.Sandbox) {
					fmt.Fprintf(a.out, "%s paused (%s), %s left\n", sb.ID, sb.Pause, sb.Remaining)
				}
			}
			sbs, errs := bulk.each(ids, "pause", func(id string) (*client.Sandbox, error) {
				return c.Pause(cmd.Context(), id)
			}, line)
			return finish(a, sbs, errs, asJSON, len(args) == 1 && len(ids) == 1)
		},
	}
	bulk.add(cmd, "pause", "running")
	bulk.addParallel(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON (several: an array)")
	return cmd
}

func newResumeCmd(a *app) *cobra.Command {
	var (
		timeout string
		asJSON  bool
		bulk    bulkFlags
	)
	cmd := &cobra.Command{
		Use:   "resume [ID…] [--label k=v…] [--all]",
		Short: "Resume paused sandboxes; returns once their agents answer",
		Long: "Resume paused sandboxes; each is back once its agent answers. With " +
			"--label or --all, the paused sandboxes selected are resumed, --parallel at " +
			"a time; every failure (one past its key's quota, say) is reported and the " +
			"exit code is non-zero if any.",
		Args: cobra.ArbitraryArgs,
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
			ids, err := bulk.ids(cmd.Context(), c, args, client.StatePaused, "resumes every paused sandbox you can see")
			if err != nil {
				return err
			}
			var line func(*client.Sandbox)
			if !asJSON {
				line = func(sb *client.Sandbox) {
					fmt.Fprintf(a.out, "%s resumed, expires at %s\n", sb.ID, sb.Deadline.Local().Format(time.RFC3339))
				}
			}
			sbs, errs := bulk.each(ids, "resume", func(id string) (*client.Sandbox, error) {
				return c.Resume(cmd.Context(), id, d)
			}, line)
			return finish(a, sbs, errs, asJSON, len(args) == 1 && len(ids) == 1)
		},
	}
	bulk.add(cmd, "resume", "paused")
	bulk.addParallel(cmd)
	cmd.Flags().StringVar(&timeout, "timeout", "", "deadline from now (default: the time it had left when paused)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON (several: an array)")
	return cmd
}
