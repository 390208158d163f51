package main

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// sizeRE matches the sizes the API takes: a number with an optional binary
// suffix (K, M, G, T, optionally followed by i, iB or B).
var sizeRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?([KMGTkmgt]([iI]?[bB])?)?$`)

func checkSize(flag, v string) error {
	if !sizeRE.MatchString(v) {
		return invalidf("--%s %q: want a size such as 512M or 1.5G", flag, v)
	}
	return nil
}

func newCreateCmd(a *app) *cobra.Command {
	var (
		req                  client.CreateRequest
		env, labels, volumes []string
		asJSON               bool
		sudo                 bool
		pf                   policyFlags
		ws                   workspaceFlags
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its ID",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			// Only flags the user set are sent: the daemon owns defaults.
			if !f.Changed("template") {
				req.Template = ""
			}
			// The daemon checks the level (and whether it can run it):
			// a client cannot know which runtimes the daemon has.
			if f.Changed("isolation") && req.Isolation == "" {
				return invalidf("--isolation is empty: want %s or %s", client.IsolationRunc, client.IsolationGVisor)
			}
			if f.Changed("cpu") {
				if req.CPU <= 0 {
					return invalidf("--cpu %v: want a positive number of cores", req.CPU)
				}
			} else {
				req.CPU = 0
			}
			if f.Changed("pids") && req.PIDs <= 0 {
				return invalidf("--pids %d: want a positive number of processes and threads", req.PIDs)
			}
			for _, s := range []struct {
				flag string
				v    *string
			}{{"memory", &req.Memory}, {"disk", &req.Disk}} {
				if !f.Changed(s.flag) {
					*s.v = ""
					continue
				}
				if err := checkSize(s.flag, *s.v); err != nil {
					return err
				}
			}
			// Unset, a create from a snapshot takes the snapshot's;
			// --allow-sudo=false turns it off even then.
			if f.Changed("allow-sudo") {
				req.AllowSudo = &sudo
			}
			if f.Changed("timeout") {
				d, err := time.ParseDuration(req.Timeout)
				if err != nil || d <= 0 {
					return invalidf("--timeout %q: want a positive duration such as 10m", req.Timeout)
				}
			} else {
				req.Timeout = ""
			}
			if req.IdlePause != "" {
				if d, err := time.ParseDuration(req.IdlePause); err != nil || d <= 0 {
					return invalidf("--idle-pause %q: want a positive duration such as 15m", req.IdlePause)
				}
			}
			switch req.OnTimeout {
			case "", client.OnTimeoutKill, client.OnTimeoutPause:
			default:
				return invalidf("--on-timeout %q: want kill or pause", req.OnTimeout)
			}
			var err error
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.Volumes, err = parseVolumeFlags(volumes); err != nil {
				return err
			}
			if req.Network, err = pf.build(f, func() ([]byte, error) { return io.ReadAll(a.in) }); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if ws.repo != "" {
				return a.createWorkspace(cmd, c, req, ws, asJSON)
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, sb)
			}
			fmt.Fprintln(a.out, sb.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Template, "template", "base", "template to start from")
	f.StringVar(&req.Isolation, "isolation", "", "isolation level: runc or gvisor (default: the template's, then the daemon's)")
	f.StringVar(&req.Snapshot, "snapshot", "", "start from this snapshot (berth snapshot): its files, and its template, limits, env, labels, network policy and allow-sudo unless set here")
	f.Float64Var(&req.CPU, "cpu", 1, "CPU cores (0.1 … host cores)")
	f.StringVar(&req.Memory, "memory", "512M", "memory limit")
	f.StringVar(&req.Disk, "disk", "2G", "disk size")
	f.Int64Var(&req.PIDs, "pids", 0, "processes and threads the sandbox may hold at once (default: the daemon's; at most one per 256 KiB of memory, under gvisor one per 2 MiB, and a higher default is lowered to that)")
	f.StringVar(&req.Timeout, "timeout", "10m", "lifetime before the sandbox is destroyed (or paused: --on-timeout)")
	f.StringVar(&req.OnTimeout, "on-timeout", "", "what the deadline does: kill (default) or pause")
	f.BoolVar(&req.AutoResume, "auto-resume", false, "resume the sandbox, once paused, on its next request")
	f.BoolVar(&sudo, "allow-sudo", false, "let set-user-ID programs (sudo) raise processes to the sandbox's root, inside its user namespace (off: no_new_privs; with --snapshot, the snapshot's unless set)")
	f.StringVar(&req.IdlePause, "idle-pause", "", "pause the sandbox once it has had no request, no open stream and under 1% CPU this long")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label k=v (repeatable)")
	f.StringArrayVarP(&volumes, "volume", "v", nil, "bind a volume (berth volume): VOLUME:/path, or VOLUME:/path:ro read-only (repeatable)")
	f.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	pf.register(f)
	ws.register(f)
	return cmd
}

func newLsCmd(a *app) *cobra.Command {
	var (
		labels []string
		state  string
		asJSON bool
		all    bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List live sandboxes (--all: stopped and failed ones too)",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lm, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if state == "" && !all {
				state = liveStates
			}
			sbs, err := c.List(cmd.Context(), client.ListOptions{Labels: lm, State: state})
			if err != nil {
				return err
			}
			slices.SortFunc(sbs, func(x, y *client.Sandbox) int { return x.CreatedAt.Compare(y.CreatedAt) })
			if asJSON {
				if sbs == nil {
					sbs = []*client.Sandbox{}
				}
				return printJSON(a.out, sbs)
			}
			return printSandboxes(a.out, sbs, time.Now())
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label k=v (repeatable, all must match)")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in these states (comma-separated)")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "stopped and failed sandboxes too (kept for the daemon's retention)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printSandboxes(w io.Writer, sbs []*client.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tISOLATION\tCPU\tMEMORY\tAGE\tEXPIRES IN\tLABELS")
	for _, sb := range sbs {
		keys := make([]string, 0, len(sb.Labels))
		for k := range sb.Labels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var lbl []string
		for _, k := range keys {
			lbl = append(lbl, k+"="+sb.Labels[k])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Template, sb.Isolation,
			strconv.FormatFloat(sb.CPU, 'f', -1, 64), humanBytes(sb.MemoryBytes),
			shortDuration(now.Sub(sb.CreatedAt)), shortDuration(sb.Deadline.Sub(now)), strings.Join(lbl, ","))
	}
	return tw.Flush()
}

// humanBytes prints n in the API's binary units: 512M, 1.5G.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10)
	}
	v, i := float64(n), -1
	for v >= unit && i < 5 {
		v /= unit
		i++
	}
	return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0") + string("KMGTPE"[i])
}

// shortDuration rounds d for a table: seconds under a minute, else minutes.
func shortDuration(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newInspectCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID",
		Short: "Print a sandbox's details as JSON",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(a.out, sb)
		},
	}
}

func newEventsCmd(a *app) *cobra.Command {
	var follow, asJSON bool
	cmd := &cobra.Command{
		Use:   "events ID",
		Short: "Print a sandbox's lifecycle events",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			print := func(ev client.Event) error {
				if asJSON {
					return json.NewEncoder(a.out).Encode(ev)
				}
				_, err := fmt.Fprintf(a.out, "%s  %-15s %s\n", ev.Time.Local().Format(time.RFC3339), ev.Type, ev.Message)
				return err
			}
			if follow {
				return c.FollowEvents(cmd.Context(), args[0], print)
			}
			evs, err := c.Events(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			for _, ev := range evs {
				if err := print(ev); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing events until the sandbox is destroyed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON event per line")
	return cmd
}

func newTimeoutCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Set a sandbox to be destroyed DURATION from now",
		Args:  exactArgs(2, "a sandbox ID and a duration"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil || d <= 0 {
				return invalidf("duration %q: want a positive duration such as 30m", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.SetTimeout(cmd.Context(), args[0], d)
			if err != nil {
				return err
			}
			if sb.Pause != "" {
				fmt.Fprintf(a.out, "%s is paused; it gets %s once resumed\n", sb.ID, sb.Remaining)
				return nil
			}
			fmt.Fprintf(a.out, "%s expires at %s\n", sb.ID, sb.Deadline.Local().Format(time.RFC3339))
			return nil
		},
	}
}

func newTemplateCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "List, build, remove, prune, export and import templates",
		Args:  exactArgs(0, "a subcommand (ls, build, rm, prune, isolation, warm, export, import)"),
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if ts == nil {
					ts = []client.Template{}
				}
				return printJSON(a.out, ts)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			// A Kubernetes gateway names the nodes that have each.
			onNodes := slices.ContainsFunc(ts, func(t client.Template) bool { return len(t.Nodes) > 0 })
			head := "NAME\tBUILT\tSIZE\tLAYERS\tSHARED\tBUILT AT\tISOLATION\tSOURCE\tWARM"
			if onNodes {
				head += "\tNODES"
			}
			fmt.Fprintln(tw, head)
			for _, t := range ts {
				built := "-"
				if !t.BuiltAt.IsZero() {
					built = t.BuiltAt.Local().Format(time.RFC3339)
				}
				iso := t.Isolation
				if iso == "" {
					iso = "default"
				}
				src := t.Source
				if src == "" {
					src = "-"
				}
				var pools []string
				if t.Warm != nil {
					pools = append(pools, fmt.Sprintf("%d/%d", t.Warm.Ready, t.Warm.Target))
				}
				if t.WarmSudo != nil {
					pools = append(pools, fmt.Sprintf("sudo %d/%d", t.WarmSudo.Ready, t.WarmSudo.Target))
				}
				warm := "-"
				if len(pools) > 0 {
					warm = strings.Join(pools, ", ")
				}
				fmt.Fprintf(tw, "%s\t%v\t%s\t%d\t%d\t%s\t%s\t%s\t%s", t.Name, t.Built, humanBytes(t.SizeBytes), t.Layers, t.SharedLayers, built, iso, src, warm)
				if onNodes {
					fmt.Fprintf(tw, "\t%s", strings.Join(t.Nodes, ","))
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var (
		image                         string
		startCmd, readyCmd, readyFile string
		startFromImage                bool
		readyPort                     int
		readyTimeout                  time.Duration
		dockerfilePath, contextDir    string
		buildArgs                     []string
		noCache                       bool
	)
	build := &cobra.Command{
		Use:   "build NAME [--image REF | --dockerfile FILE [--context DIR] [--build-arg K=V] [--no-cache]] [--start-cmd CMD] [--ready-cmd CMD | --ready-port N | --ready-file PATH]",
		Short: "Build a template, printing its log",
		Long: `Build a template, printing its log on stderr.

Without --image, NAME is a built-in template (base, minimal) or a template
made from an image earlier, which is pulled again from the same reference.
With --image, NAME is made from an OCI/Docker image: its layers are pulled
(through the daemon's registry_mirrors, with credentials from
~/.docker/config.json), stored once and shared with other templates, and its
ENV, WORKDIR and USER become the defaults of sandboxes made from it.

A template may have a start command, which each new sandbox starts in the
background (--start-cmd, a shell command; or --start-from-image, the
image's ENTRYPOINT and CMD), and a ready check: a sandbox is ready only
once it passes (--ready-cmd exits 0, something listens on --ready-port, or
--ready-file exists), and its create fails when it has not passed within
--ready-timeout. A rebuild without these flags keeps the last build's.

With --dockerfile (and/or --context), NAME is built from a Dockerfile:
FROM an image or berth:TEMPLATE; each RUN runs in a build sandbox under
Berth's isolation with the daemon's build_network egress policy; COPY and
ADD read the context (its .dockerignore honoured, nothing outside it);
ENV, ARG (--build-arg), WORKDIR, USER; CMD/ENTRYPOINT become the start
command. Steps are cached (the log says CACHED) unless --no-cache.`,
		Args: exactArgs(1, "a template name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := client.TemplateCreateRequest{Name: args[0], Image: image, StartCmd: startCmd, StartFromImage: startFromImage}
			if readyCmd != "" || readyPort != 0 || readyFile != "" || cmd.Flags().Changed("ready-timeout") {
				req.Ready = &client.ReadyCheck{Cmd: readyCmd, Port: readyPort, File: readyFile, TimeoutSeconds: int(readyTimeout.Round(time.Second) / time.Second)}
			}
			startSet := req.StartCmd != "" || req.StartFromImage || req.Ready != nil
			isDockerfile := dockerfilePath != "" || contextDir != ""
			if startSet && !cmd.Flags().Changed("image") && !isDockerfile {
				return fmt.Errorf("--start-cmd, --start-from-image and --ready-*: only with --image or --dockerfile: %w", errdefs.ErrInvalidArgument)
			}
			if isDockerfile && cmd.Flags().Changed("image") {
				return fmt.Errorf("--image and --dockerfile: choose one: %w", errdefs.ErrInvalidArgument)
			}
			if (len(buildArgs) > 0 || noCache) && !isDockerfile {
				return fmt.Errorf("--build-arg and --no-cache: only with --dockerfile: %w", errdefs.ErrInvalidArgument)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			// The log goes to stderr so stdout carries only the result.
			var t *client.Template
			if isDockerfile {
				if req.StartFromImage {
					return fmt.Errorf("--start-from-image: a Dockerfile's CMD/ENTRYPOINT is its start command already: %w", errdefs.ErrInvalidArgument)
				}
				b := client.DockerfileBuild{Dockerfile: dockerfilePath, ContextDir: contextDir, NoCache: noCache, StartCmd: startCmd, Ready: req.Ready, BuildArgs: map[string]string{}}
				for _, kv := range buildArgs {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return fmt.Errorf("--build-arg %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
					}
					b.BuildArgs[k] = v
				}
				t, err = c.BuildDockerfile(cmd.Context(), args[0], b, a.err)
			} else if cmd.Flags().Changed("image") {
				t, err = c.CreateTemplateFrom(cmd.Context(), req, a.err)
			} else {
				t, err = c.BuildTemplate(cmd.Context(), args[0], a.err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s built (%s)\n", t.Name, humanBytes(t.SizeBytes))
			return nil
		},
	}
	build.Flags().StringVar(&image, "image", "", "make the template from this OCI/Docker image reference")
	build.Flags().StringVar(&startCmd, "start-cmd", "", "shell command each new sandbox starts in the background")
	build.Flags().BoolVar(&startFromImage, "start-from-image", false, "make the image's ENTRYPOINT and CMD the start command")
	build.Flags().StringVar(&readyCmd, "ready-cmd", "", "a sandbox is ready once this shell command exits 0")
	build.Flags().IntVar(&readyPort, "ready-port", 0, "a sandbox is ready once something in it listens on this TCP port")
	build.Flags().StringVar(&readyFile, "ready-file", "", "a sandbox is ready once this file exists")
	build.Flags().DurationVar(&readyTimeout, "ready-timeout", 0, "how long the ready check may take before the create fails (default 60s)")
	build.Flags().StringVar(&dockerfilePath, "dockerfile", "", "make the template from this Dockerfile (default CONTEXT/Dockerfile with --context)")
	build.Flags().StringVar(&contextDir, "context", "", "the Dockerfile build's context directory (default: the Dockerfile's directory)")
	build.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "KEY=VALUE for the Dockerfile's ARG (repeatable)")
	build.Flags().BoolVar(&noCache, "no-cache", false, "run every Dockerfile step again instead of using cached layers")
	build.MarkFlagsMutuallyExclusive("ready-cmd", "ready-port", "ready-file")
	build.MarkFlagsMutuallyExclusive("start-cmd", "start-from-image")
	rm := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"remove"},
		Short:   "Remove a template (refused while a sandbox uses it; layers go with prune)",
		Args:    exactArgs(1, "a template name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.RemoveTemplate(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s removed\n", args[0])
			return nil
		},
	}
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove stored template layers no template uses",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.PruneTemplates(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "removed %d layer(s), freed %s\n", res.RemovedLayers, humanBytes(res.FreedBytes))
			return nil
		},
	}
	isolation := &cobra.Command{
		Use:   "isolation NAME LEVEL",
		Short: "Set the isolation level (runc, gvisor, or default) a template's sandboxes get when they ask for none",
		Args:  exactArgs(2, "a template name and an isolation level"),
		RunE: func(cmd *cobra.Command, args []string) error {
			level := args[1]
			if level == "default" {
				level = ""
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.SetTemplateIsolation(cmd.Context(), args[0], level)
			if err != nil {
				return err
			}
			if t.Isolation == "" {
				fmt.Fprintf(a.out, "%s: the daemon's default isolation\n", t.Name)
				return nil
			}
			fmt.Fprintf(a.out, "%s: isolation %s\n", t.Name, t.Isolation)
			return nil
		},
	}
	var warmSudo bool
	warm := &cobra.Command{
		Use:   "warm [--allow-sudo] NAME N",
		Short: "Keep N ready sandboxes of a template, so a create of it starts at once (0 drops the pool)",
		Long: `Keep N ready sandboxes of a template in a warm pool. A create of the template
that asks for nothing a running sandbox cannot be given (another disk size, a
workspace) claims one: its limits, environment, labels, owner, timeout and
network policy are applied at claim, so it is the sandbox a cold create would
have made. Pooled sandboxes count toward the host's resources but no key's
listings, usage or quotas; the pool refills in the background and is rebuilt
when the template changes. The target lasts until the daemon restarts;
warm_pool in the daemon's config sets it at start.

--allow-sudo sets the template's other pool: sandboxes made with allow_sudo
(no no_new_privs), which only a create with allow_sudo claims (E2B creates
ask for it by default), and which no other create ever gets; warm_pool_sudo
in the daemon's config sets it at start. A template may have both pools.`,
		Args: exactArgs(2, "a template name and a number of sandboxes"),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil {
				return invalidf("N: %q is not a number", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			set, kind := c.SetTemplateWarm, "warm pool"
			if warmSudo {
				set, kind = c.SetTemplateWarmSudo, "sudo warm pool"
			}
			w, err := set(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s: %s target %d (%d ready)\n", args[0], kind, w.Target, w.Ready)
			return nil
		},
	}
	warm.Flags().BoolVar(&warmSudo, "allow-sudo", false, "set the pool of sudo-capable sandboxes (made with allow_sudo), which only creates with allow_sudo claim")
	cmd.AddCommand(ls, build, rm, prune, isolation, warm, newTemplateExportCmd(a), newTemplateImportCmd(a))
	return cmd
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and the daemon's versions",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(a.out, "client: %s\n", buildVersion())
			c, err := a.client()
			if err != nil {
				return err
			}
			h, err := c.Health(cmd.Context())
			if err != nil {
				// The client's version is still useful without a daemon.
				fmt.Fprintf(a.out, "server: unreachable (%v)\n", err)
				return nil
			}
			fmt.Fprintf(a.out, "server: %s\n", h.Version)
			for _, l := range h.Isolation {
				fmt.Fprintf(a.out, "isolation %s: %s\n", l.Name, describeLevel(l))
			}
			return nil
		},
	}
}

// describeLevel is one isolation level for `berth version`: the runtime
// and platform, what a snapshot there keeps, or why the daemon cannot
// offer it.
func describeLevel(l client.IsolationLevel) string {
	if !l.Available {
		return "unavailable (" + l.Reason + ")"
	}
	out := l.Runtime
	if l.Platform != "" {
		out += ", platform " + l.Platform
	}
	if !l.Sudo {
		out += ", allow_sudo has no effect"
	}
	if l.Snapshots != "" {
		out += ", snapshots keep " + l.Snapshots
	}
	if l.Default {
		out += " (default)"
	}
	return out
}
