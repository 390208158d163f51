package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// streams are the standard streams commands use, swappable in tests.
type streams struct {
	in  io.Reader
	out io.Writer
	err io.Writer
}

// app is what every client command shares: the streams and the daemon URL
// (from --url, else BERTH_URL, else the default).
type app struct {
	streams
	url    string
	apiKey string
}

// client builds the SDK client once flags are parsed: the daemon at --url,
// else BERTH_URL, else the root-only local socket of a daemon on this host
// when it can be reached, else the default TCP address; the key from
// --api-key, else BERTH_API_KEY.
func (a *app) client() (*client.Client, error) {
	key := a.apiKey
	if key == "" {
		key = os.Getenv("BERTH_API_KEY")
	}
	var opts []client.Option
	if key != "" {
		opts = append(opts, client.WithAPIKey(key))
	}
	u := a.url
	if u == "" {
		u = os.Getenv("BERTH_URL")
	}
	if u == "" {
		u = client.DefaultURL
		if socketReachable(client.DefaultSocket) {
			u = "unix://" + client.DefaultSocket
		}
	}
	return client.New(u, opts...)
}

// socketReachable reports whether a daemon answers on the unix socket path
// (it exists and this user may connect: root, on the daemon's host).
func socketReachable(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// exitCodeError ends berth with a command's own exit code, silently.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// invalidf is a local validation error, reported with code invalid_argument.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// run executes berth with args and returns the process exit code.
func run(ctx context.Context, args []string, s streams) int {
	root := newRootCmd(&app{streams: s})
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return reportError(s.err, err)
}

// reportError prints err as "berth: <message> (<code>)" and returns the exit
// code: 0 without error, the command's own for exit codes, else 1.
func reportError(w io.Writer, err error) int {
	if err == nil {
		return 0
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	msg := err.Error()
	// The class's text is already implied by the code in parentheses.
	if class := errdefs.FromCode(client.ErrorCode(err)); class != nil {
		msg = strings.TrimSuffix(msg, ": "+class.Error())
	}
	var we *errdefs.Error
	if errors.As(err, &we) && we.Field != "" && !strings.Contains(msg, we.Field) {
		msg += " (field " + we.Field + ")"
	}
	fmt.Fprintf(w, "berth: %s (%s)\n", msg, client.ErrorCode(err))
	return 1
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:           "berth",
		Short:         "Run and drive sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Bare "berth" prints help rather than failing.
		Args: cobra.NoArgs,
	}
	root.SetIn(a.in)
	root.SetOut(a.out)
	root.SetErr(a.err)
	root.PersistentFlags().StringVar(&a.url, "url", "", "daemon URL, http(s)://HOST:PORT or unix:///PATH (default $BERTH_URL, else the local socket "+client.DefaultSocket+" when reachable, else "+client.DefaultURL+")")
	root.PersistentFlags().StringVar(&a.apiKey, "api-key", "", "API key to authenticate with (default $BERTH_API_KEY)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	})
	root.AddCommand(
		newServeCmd(),
		newNodeCmd(),
		newCreateCmd(a),
		newExecCmd(a),
		newAttachCmd(a),
		newPsCmd(a),
		newSignalCmd(a),
		newShellCmd(a),
		newCpCmd(a),
		newLsCmd(a),
		newInspectCmd(a),
		newEventsCmd(a),
		newNetCmd(a),
		newKillCmd(a),
		newRmCmd(a),
		newUsageCmd(a),
		newMetricsCmd(a),
		newTimeoutCmd(a),
		newForwardCmd(a),
		newPauseCmd(a),
		newResumeCmd(a),
		newSnapshotCmd(a),
		newVolumeCmd(a),
		newForkCmd(a),
		newTemplateCmd(a),
		newRegistryCmd(a),
		newAPIKeyCmd(a),
		newEnvCmd(a),
		newSecretCmd(a),
		newWorklogCmd(a),
		newDiffCmd(a),
		newExportCmd(a),
		newCommitCmd(a),
		newVersionCmd(a),
	)
	return root
}

// exactArgs is cobra.ExactArgs with an invalid_argument error naming the
// expected arguments.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return invalidf("want %s, got %d argument(s)", names, len(args))
		}
		return nil
	}
}

// minArgs is cobra.MinimumNArgs with an invalid_argument error.
func minArgs(n int, names string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) < n {
			return invalidf("want %s", names)
		}
		return nil
	}
}

// parseKV parses repeated K=V flag values into a map; flag names the flag
// in errors.
func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, invalidf("--%s %q: want KEY=VALUE", flag, v)
		}
		m[k] = val
	}
	return m, nil
}
