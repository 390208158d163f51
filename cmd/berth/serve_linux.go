//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/daemon"
)

// newServeCmd runs the daemon. Settings come from defaults, then the
// config file (YAML or JSON), then flags.
func newServeCmd() *cobra.Command {
	var (
		o  serveOptions
		gw gatewayOptions
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the Berth daemon (as root)",
		Long: `Run the Berth daemon on this host with its embedded defaults: SQLite state and
templates in --data-dir, runc for isolation (gVisor's runsc too, where
installed: create --isolation gvisor), the API on --listen.

Settings come from the built-in defaults, then --config (a YAML or JSON file
whose keys are ` + strings.Join(configKeys(), ", ") + `), then flags.
SIGTERM or SIGINT stops the daemon; running sandboxes keep running and are
re-adopted when it starts again.

With --kubernetes it is instead the gateway of a Kubernetes cluster of Berth
nodes (berth node): no runtime, no state of its own, no root. It serves the
native API's sandbox create, list, get, delete and timeout and E2B's
(create, list, get, kill, timeout; E2B's data plane by header or by a Host
under --e2b-domain), each sandbox a pod in --namespace, and proxies each
sandbox's agent data plane to its node over mutual TLS (--node-client-cert,
--node-client-key, --node-ca). Several gateways serve one cluster side by
side; the one elected leader deletes ended sandboxes (--keep-ended) and
acts on lost nodes (--node-lost-after, --on-node-lost). Other routes answer
not_implemented.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gw.on {
				return runGateway(cmd, &o, &gw)
			}
			cfg, log, ctx, done, err := o.setup(cmd, "berth serve")
			if err != nil {
				return err
			}
			defer done()
			return daemon.Run(ctx, cfg, log)
		},
	}
	o.bind(cmd.Flags())
	gw.bind(cmd.Flags())
	return cmd
}

// serveOptions are the daemon's flags, shared by serve and node.
type serveOptions struct {
	cfgFile string
	flags   daemon.Config
	debug   bool
}

// setup reads the settings (defaults, then --config, then flags), opens
// the log and returns a context that SIGTERM or SIGINT ends; done releases
// what it holds.
func (o *serveOptions) setup(cmd *cobra.Command, what string) (cfg daemon.Config, log *slog.Logger, ctx context.Context, done func(), err error) {
	flags := &o.flags
	if o.cfgFile != "" {
		data, err := os.ReadFile(o.cfgFile)
		if err != nil {
			return cfg, nil, nil, nil, fmt.Errorf("--config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil {
			return cfg, nil, nil, nil, fmt.Errorf("--config %s: %w", o.cfgFile, err)
		}
	}
	set := func(name string, dst *string, v string) {
		if cmd.Flags().Changed(name) {
			*dst = v
		}
	}
	set("listen", &cfg.Listen, flags.Listen)
	set("data-dir", &cfg.DataDir, flags.DataDir)
	set("cache-dir", &cfg.CacheDir, flags.CacheDir)
	set("instance", &cfg.Instance, flags.Instance)
	set("agent", &cfg.AgentPath, flags.AgentPath)
	set("runtime", &cfg.RuntimeBinary, flags.RuntimeBinary)
	set("pool", &cfg.Pool, flags.Pool)
	set("default-template", &cfg.DefaultTemplate, flags.DefaultTemplate)
	set("e2b-domain", &cfg.E2BDomain, flags.E2BDomain)
	set("default-isolation", &cfg.DefaultIsolation, flags.DefaultIsolation)
	set("gvisor-runtime", &cfg.GVisorBinary, flags.GVisorBinary)
	set("gvisor-platform", &cfg.GVisorPlatform, flags.GVisorPlatform)
	set("retention", &cfg.Retention, flags.Retention)
	if cmd.Flags().Changed("require-auth") {
		cfg.RequireAuth = flags.RequireAuth
	}
	if cmd.Flags().Changed("insecure-no-auth") {
		cfg.InsecureNoAuth = flags.InsecureNoAuth
	}
	if cmd.Flags().Changed("resume-ready") {
		cfg.ResumeReady = flags.ResumeReady
	}
	if m := os.Getenv("BERTH_DEBIAN_MIRROR"); m != "" && cfg.Mirror == "" {
		cfg.Mirror = m
	}
	cfg.Version = buildVersion()
	if os.Geteuid() != 0 {
		return cfg, nil, nil, nil, fmt.Errorf("%s must run as root (it creates namespaces, mounts and firewall rules): %w", what, errdefs.ErrPermissionDenied)
	}
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	set("log-file", &cfg.LogFile, flags.LogFile)
	if cmd.Flags().Changed("preview-listen") {
		cfg.PreviewListen = flags.PreviewListen
	}
	out, rotate, closeLog, err := logOutput(cfg.LogFile, cfg.LogMaxMB, cfg.LogMaxFiles)
	if err != nil {
		return cfg, nil, nil, nil, err
	}
	log = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	// SIGHUP starts a new log file (for an outside logrotate).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			if err := rotate(); err != nil {
				log.Warn("log_rotate_failed", "err", err)
			}
		}
	}()
	return cfg, log, ctx, func() {
		signal.Stop(hup)
		stop()
		_ = closeLog()
	}, nil
}

func (o *serveOptions) bind(f *pflag.FlagSet) {
	flags := &o.flags
	f.StringVar(&o.cfgFile, "config", "", "config file (YAML or JSON)")
	f.StringVar(&flags.Listen, "listen", daemon.DefaultListen, "API address")
	f.StringVar(&flags.DataDir, "data-dir", "/var/lib/berth", "state, templates and sandboxes")
	f.StringVar(&flags.CacheDir, "cache-dir", "/var/cache/berth", "download cache (debootstrap base)")
	f.StringVar(&flags.Instance, "instance", "", "name of this daemon's host objects (default: derived from --data-dir)")
	f.StringVar(&flags.AgentPath, "agent", "", "berth-agent binary (default: next to berth)")
	f.StringVar(&flags.RuntimeBinary, "runtime", "runc", "OCI runtime binary")
	f.StringVar(&flags.Pool, "pool", "198.18.0.0/15", "address pool for sandbox links")
	f.StringVar(&flags.DefaultTemplate, "default-template", "base", "template used when a create names none")
	f.StringVar(&flags.E2BDomain, "e2b-domain", "berth.localhost", "preview domain of the E2B API: Host <port>-<sandbox>.<domain> reaches that sandbox port")
	f.StringVar(&flags.DefaultIsolation, "default-isolation", "runc", "isolation level (runc or gvisor) of sandboxes whose request and template name none")
	f.StringVar(&flags.GVisorBinary, "gvisor-runtime", "runsc", "gVisor's runsc binary (the gvisor isolation level)")
	f.StringVar(&flags.GVisorPlatform, "gvisor-platform", "", "runsc platform: ptrace, systrap or kvm (default: probed)")
	f.BoolVar(&flags.RequireAuth, "require-auth", false, "require an API key (Authorization: Bearer or X-API-Key) on every route but health; the root-only socket <data-dir>/berth.sock needs none")
	f.BoolVar(&flags.InsecureNoAuth, "insecure-no-auth", false, "serve without keys even on a --listen beyond loopback (anyone who reaches it owns every sandbox)")
	f.StringVar(&flags.Retention, "retention", "24h", "how long stopped and failed sandboxes' records and logs are kept")
	f.IntVar(&flags.ResumeReady, "resume-ready", 0, "how many sandboxes paused with their memory (gVisor), the most recent, keep their resume made ready: tens of MiB each while paused, about 0.1 s off the resume (0: none)")
	f.StringSliceVar(&flags.PreviewListen, "preview-listen", nil, "addresses serving preview hosts PORT-ID.<e2b-domain> over HTTP (default 127.0.0.1:80 and [::1]:80 where free; none: off)")
	f.StringVar(&flags.LogFile, "log-file", "", "log to this file instead of stderr, rotated by size (log_max_mb, log_max_files; SIGHUP rotates)")
	f.BoolVar(&o.debug, "debug", false, "debug logging")
}

// configKeys are the config file's keys, read from daemon.Config's tags so
// the help never misses one.
func configKeys() []string {
	var keys []string
	t := reflect.TypeFor[daemon.Config]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}
