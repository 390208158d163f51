// Package daemon wires Berth's subsystems into one running daemon: it holds
// the one Config struct every flag and config-file key lands in, builds each
// subsystem once and passes them down explicitly, and runs the HTTP server
// until its context ends.
package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/api"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bcompat"
	"github.com/berth-sandbox/berth/internal/egress"
	"github.com/berth-sandbox/berth/internal/hostnet"
	"github.com/berth-sandbox/berth/internal/imagepull"
	"github.com/berth-sandbox/berth/internal/metrics"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/review"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/template"
	"github.com/berth-sandbox/berth/internal/units"
	"github.com/berth-sandbox/berth/internal/usage"
	"github.com/berth-sandbox/berth/internal/volume"
	"github.com/berth-sandbox/berth/internal/worklog"
	"github.com/berth-sandbox/berth/proto/envd"
)

// MaxResumeReady bounds Config.ResumeReady: each ready resume holds a
// waiting sentry and gofer and a loop device.
const MaxResumeReady = 1024

// DefaultListen is the API's default address.
const DefaultListen = "127.0.0.1:2378"

// Config is every setting of the daemon. Zero values take the defaults.
type Config struct {
	Listen   string `json:"listen" yaml:"listen"`
	DataDir  string `json:"data_dir" yaml:"data_dir"`
	CacheDir string `json:"cache_dir" yaml:"cache_dir"`
	// Instance names this daemon's host objects (nftables table, links,
	// netns, cgroups). Derived from DataDir when empty, so two daemons with
	// different data dirs never touch each other's sandboxes.
	Instance string `json:"instance" yaml:"instance"`
	// AgentPath is the berth-agent binary; default: next to this binary.
	AgentPath     string `json:"agent_path" yaml:"agent_path"`
	RuntimeBinary string `json:"runtime" yaml:"runtime"`
	// DefaultIsolation is the level (runc or gvisor) a sandbox gets when
	// neither its request nor its template names one (default runc).
	// GVisorBinary is runsc (default: "runsc" on PATH, so a newer one
	// there wins over Debian's); GVisorPlatform is its platform, ptrace
	// or kvm (default: probed, kvm only where a trial sandbox runs).
	DefaultIsolation string `json:"default_isolation" yaml:"default_isolation"`
	GVisorBinary     string `json:"gvisor_runtime" yaml:"gvisor_runtime"`
	GVisorPlatform   string `json:"gvisor_platform" yaml:"gvisor_platform"`
	Pool             string `json:"pool" yaml:"pool"`
	UIDBase          uint32 `json:"uid_base" yaml:"uid_base"`
	UIDCount         uint32 `json:"uid_count" yaml:"uid_count"`
	Mirror           string `json:"debian_mirror" yaml:"debian_mirror"`
	DefaultTemplate  string `json:"default_template" yaml:"default_template"`
	// VolumeBytes is a new volume's size when its request gives none
	// (default 10 GiB); MaxVolumeBytes bounds what one may ask (default
	// 1 TiB). Volumes are sparse: a volume takes the host disk it holds.
	VolumeBytes    int64 `json:"volume_bytes" yaml:"volume_bytes"`
	MaxVolumeBytes int64 `json:"max_volume_bytes" yaml:"max_volume_bytes"`
	// Egress (internal/egress): the DNS servers the sandboxes'
	// resolvers and the egress proxy ask (default: the host's
	// /etc/resolv.conf); address ranges treated as public although
	// special-purpose (tests declare their TEST-NET here; loopback,
	// link-local and metadata stay forbidden); extra CA certificates (PEM)
	// the proxy trusts for servers behind intercepted TLS.
	DNSUpstream    []string `json:"dns_upstream" yaml:"dns_upstream"`
	PublicTestNets []string `json:"public_test_nets" yaml:"public_test_nets"`
	EgressCAFile   string   `json:"egress_ca_file" yaml:"egress_ca_file"`
	// Image templates (berth template build NAME --image REF): mirrors
	// tried before a registry, by registry host ("docker.io":
	// "http://127.0.0.1:5000"; http:// is plain HTTP), and registries
	// reached over plain HTTP ("host:port"). Loopback registries always
	// are. Credentials come from ~/.docker/config.json.
	RegistryMirrors    map[string]string `json:"registry_mirrors" yaml:"registry_mirrors"`
	InsecureRegistries []string          `json:"insecure_registries" yaml:"insecure_registries"`
	// BuildNetwork is the egress policy of Dockerfile RUN steps; default:
	// only the hosts of registry_mirrors and insecure_registries (none
	// when there are none).
	BuildNetwork *policy.Policy `json:"build_network" yaml:"build_network"`
	// E2BDomain is the preview domain of the E2B-compatible API: a request
	// for Host "<port>-<sandbox>.<E2BDomain>" goes to that sandbox port.
	E2BDomain string `json:"e2b_domain" yaml:"e2b_domain"`
	// E2BDefaultNetwork is what E2B's allow_internet_access: true (the
	// SDK's default on every create) means: "open" (the internet, within
	// the egress ceiling; the default) or "none" (no egress at all).
	E2BDefaultNetwork string `json:"e2b_default_network" yaml:"e2b_default_network"`
	// E2BNoSudo turns off what E2B's templates promise and E2B sandboxes
	// get by default: sudo for their user (allow_sudo, see
	// docs/security.md). Native creates ask for it themselves.
	E2BNoSudo bool `json:"e2b_no_sudo" yaml:"e2b_no_sudo"`
	// PreviewListen are the addresses where preview hosts
	// ("<port>-<sandbox>.<E2BDomain>", what sandbox.getHost(port) names,
	// without the API's port) are served over plain HTTP; default
	// DefaultPreviewListen (port 80 on loopback, best effort); ["none"]
	// turns it off. PreviewTLSListen serves them over TLS with
	// PreviewTLSCert/PreviewTLSKey (PEM files; a wildcard certificate for
	// *.<E2BDomain>), default port 443 on loopback once a certificate is
	// configured.
	PreviewListen    []string `json:"preview_listen" yaml:"preview_listen"`
	PreviewTLSListen []string `json:"preview_tls_listen" yaml:"preview_tls_listen"`
	PreviewTLSCert   string   `json:"preview_tls_cert" yaml:"preview_tls_cert"`
	PreviewTLSKey    string   `json:"preview_tls_key" yaml:"preview_tls_key"`
	// EgressCeiling bounds every sandbox's egress policy (policy.Ceiling):
	// mode open is open within it, and a policy naming anything outside
	// it is refused. Its deny list always holds policy.DefaultCeilingDeny
	// (private, CGNAT, ULA, link-local and metadata addresses); the
	// host's own addresses are refused too.
	EgressCeiling policy.Ceiling `json:"egress_ceiling" yaml:"egress_ceiling"`
	// CommitAuthor, "Name <email>", signs `berth commit` when the request
	// names no author (default "Berth <berth@localhost>").
	CommitAuthor string `json:"commit_author" yaml:"commit_author"`
	// AuditMaxBytes is the size at which a sandbox's audit log file
	// rotates (default 16 MiB; three rotated files are kept, and the
	// earliest records and every denial survive rotation).
	AuditMaxBytes int64 `json:"audit_max_bytes" yaml:"audit_max_bytes"`

	// RequireAuth requires an API key on every route but health (the
	// local socket excepted). A daemon listening beyond loopback refuses
	// to start without it unless InsecureNoAuth says so.
	RequireAuth bool `json:"require_auth" yaml:"require_auth"`
	// Retention is how long stopped and failed sandboxes' records and
	// logs are kept (a duration, "24h" by default).
	Retention      string `json:"retention" yaml:"retention"`
	InsecureNoAuth bool   `json:"insecure_no_auth" yaml:"insecure_no_auth"`
	// WarmPool is how many ready sandboxes to keep per template, so a
	// create of it skips the cold path (`berth template warm` changes
	// it until the daemon restarts). WarmPoolSudo is the same for
	// sudo-capable sandboxes (made with allow_sudo), the only ones a
	// create with allow_sudo (an E2B create, by default) claims, and
	// which no other create does.
	WarmPool     map[string]int `json:"warm_pool" yaml:"warm_pool"`
	WarmPoolSudo map[string]int `json:"warm_pool_sudo" yaml:"warm_pool_sudo"`
	// ResumeReady is how many sandboxes paused with their memory (gVisor)
	// keep their resume made ready, the most recently paused: the runtime
	// sandbox their resume restores into is made after the pause and
	// waits, holding tens of MiB of the host's memory and a loop device
	// each, and the resume is shorter by the time it takes to make (about
	// 0.1 s). 0, the default: none; every paused sandbox holds only its
	// disk and its memory image.
	ResumeReady int `json:"resume_ready" yaml:"resume_ready"`

	// LogFile, when set, is where the daemon logs (instead of stderr),
	// rotated when it reaches LogMaxMB (default 100) with LogMaxFiles
	// rotated files kept (default 5, gzipped); SIGHUP rotates it at once.
	LogFile     string `json:"log_file" yaml:"log_file"`
	LogMaxMB    int    `json:"log_max_mb" yaml:"log_max_mb"`
	LogMaxFiles int    `json:"log_max_files" yaml:"log_max_files"`

	Defaults sandbox.Limits `json:"-" yaml:"-"`
	Max      sandbox.Limits `json:"-" yaml:"-"`

	Version string `json:"-" yaml:"-"`
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DataDir == "" {
		c.DataDir = "/var/lib/berth"
	}
	if abs, err := filepath.Abs(c.DataDir); err == nil {
		c.DataDir = abs
	}
	if c.CacheDir == "" {
		c.CacheDir = "/var/cache/berth"
	}
	if c.Instance == "" {
		c.Instance = DefaultInstance(c.DataDir)
	}
	if c.RuntimeBinary == "" {
		c.RuntimeBinary = "runc"
	}
	if c.DefaultIsolation == "" {
		c.DefaultIsolation = core.IsolationRunc
	}
	if c.Pool == "" {
		c.Pool = "198.18.0.0/15"
	}
	if c.UIDBase == 0 {
		c.UIDBase = 1_000_000
	}
	if c.UIDCount == 0 {
		c.UIDCount = 65536
	}
	if c.Mirror == "" {
		c.Mirror = "http://deb.debian.org/debian"
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "base"
	}
	if c.Defaults == (sandbox.Limits{}) {
		c.Defaults = sandbox.Limits{CPUMillis: 1000, MemoryBytes: 512 << 20, DiskBytes: 2 << 30, PidsLimit: 1024}
	}
	if c.Max == (sandbox.Limits{}) {
		// No sandbox gets more CPU than the host has: a quota of 64
		// cores on a 2-core host is a typo, not a limit.
		c.Max = sandbox.Limits{CPUMillis: hostCPUMillis(), MemoryBytes: 64 << 30, DiskBytes: 512 << 30, PidsLimit: 65536}
	}
	return c
}

// Run runs the daemon until ctx ends, then shuts it down cleanly.
// Sandboxes keep running across a daemon restart and are re-adopted.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	cfg = cfg.WithDefaults()
	if err := checkExposure(cfg); err != nil {
		return err
	}
	ceiling, err := policy.CompileCeiling(cfg.EgressCeiling)
	if err != nil {
		return err
	}
	ceiling.HostAddrs = new(hostnet.HostAddrs).List
	switch cfg.E2BDefaultNetwork {
	case "", "open", "none":
	default:
		return fmt.Errorf("e2b_default_network %q: want open or none: %w", cfg.E2BDefaultNetwork, errdefs.ErrInvalidArgument)
	}
	if cfg.ResumeReady < 0 || cfg.ResumeReady > MaxResumeReady {
		return fmt.Errorf("resume_ready %d: want 0 to %d: %w", cfg.ResumeReady, MaxResumeReady, errdefs.ErrInvalidArgument)
	}
	retention := DefaultRetention
	if cfg.Retention != "" {
		d, err := units.ParseDuration(cfg.Retention)
		if err != nil || d <= 0 {
			return fmt.Errorf("retention %q: want a positive duration such as 24h: %w", cfg.Retention, errdefs.ErrInvalidArgument)
		}
		retention = d
	}
	// 0711: sandboxes' mapped root must traverse to its rootfs (runc
	// mounts it from inside the user namespace); nobody may list it.
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o711); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := checkTraversable(cfg.DataDir); err != nil {
		return err
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	pool, err := netip.ParsePrefix(cfg.Pool)
	if err != nil {
		return fmt.Errorf("pool %q: %w", cfg.Pool, err)
	}
	agentPath, err := installAgent(cfg)
	if err != nil {
		return err
	}

	db, err := store.Open(ctx, filepath.Join(cfg.DataDir, "berth.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	if cfg.BuildNetwork != nil {
		if err := cfg.BuildNetwork.Validate(); err != nil {
			return fmt.Errorf("config build_network: %w", err)
		}
	}
	warmPools, err := cfg.warmPools()
	if err != nil {
		return err
	}
	// `berth registry login` keeps its credentials root-only in the data
	// dir, consulted before ~/.docker/config.json.
	logins := imagepull.NewLogins(filepath.Join(cfg.DataDir, "registry-auth.json"))
	puller, err := imagepull.New(imagepull.Config{Mirrors: cfg.RegistryMirrors, Insecure: cfg.InsecureRegistries, Logins: logins})
	if err != nil {
		return err
	}
	tpl, err := template.New(template.Config{
		DataDir: cfg.DataDir, CacheDir: cfg.CacheDir, Mirror: cfg.Mirror, UIDBase: cfg.UIDBase,
		Puller: puller,
		Logger: log.With("component", "template"),
	})
	if err != nil {
		return err
	}
	// minimal builds in milliseconds: have it ready out of the box.
	if _, err := tpl.Ensure(ctx, "minimal", io.Discard); err != nil {
		return fmt.Errorf("build template minimal: %w", err)
	}
	prom := metrics.New(metrics.Sources{})
	auditLog, err := audit.New(audit.Config{Dir: filepath.Join(cfg.DataDir, "audit"), MaxBytes: cfg.AuditMaxBytes, Logger: log.With("component", "audit"),
		OnAppend: func(r audit.Record) {
			if r.Decision != "" {
				prom.CountEgress(r.Decision, r.Count)
			}
		}})
	if err != nil {
		return err
	}
	// Last, after the egress services and the drop log stop: their final
	// summaries are written.
	defer auditLog.CloseAll()
	// The firewall's own refusals (UDP, ICMP, foreign DNS, all of mode
	// none) reach the audit log through NFLOG.
	drops, err := hostnet.OpenDropLog(hostnet.DropLogConfig{Instance: cfg.Instance, Logger: log.With("component", "droplog")},
		func(d hostnet.Drop) { auditLog.Append(dropRecord(d)) })
	if err != nil {
		return err
	}
	defer drops.Close()
	netw, err := hostnet.New(ctx, hostnet.Config{Instance: cfg.Instance, Pool: pool, LogGroup: drops.Group(), CeilingDeny: ceiling.DenyPrefixes(), Logger: log.With("component", "hostnet")})
	if err != nil {
		return err
	}
	defer func() {
		// Runs after the runtime's Close: with no sandbox left, nothing
		// of this instance stays in the host's firewall. With sandboxes
		// left the table stays, guarding their veths until the next
		// start re-adopts them.
		tctx := context.WithoutCancel(ctx)
		if err := netw.Teardown(tctx); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			log.Warn("hostnet_teardown_failed", "err", err)
		}
		netw.Close(tctx)
	}()
	// Headroom: the soft descriptor limit up to the hard one. What keeps
	// one sandbox from using it up are the egress proxy's per-sandbox
	// limits, sized from it (egress.Limits).
	if n, err := egress.RaiseFDLimit(); err != nil {
		log.Warn("fd_limit_raise_failed", "err", err)
	} else {
		log.Info("fd_limit", "nofile", n, "proxied_connections_max", egress.FDBudget())
	}
	egress, err := newEgress(cfg, netw.ProxyPort(), ceiling, auditLog, log)
	if err != nil {
		return err
	}
	defer egress.Close()
	lv, err := newLevels(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer lv.Close()
	link := agentlink.New()
	meter := usage.New(db, log.With("component", "usage"))
	history := usage.NewHistory(0, 0)
	mctx, mcancel := context.WithCancel(context.WithoutCancel(ctx))
	mdone := make(chan struct{})
	go func() { meter.Run(mctx, 5*time.Second); close(mdone) }()
	// After the Manager closes (deferred later, so run earlier): the last
	// samples are written.
	defer func() { mcancel(); <-mdone }()
	vdisks, err := volume.New(filepath.Join(cfg.DataDir, "volumes"), cfg.UIDBase, log.With("component", "volumes"))
	if err != nil {
		return err
	}
	mgr, err := sandbox.New(sandbox.Config{
		AgentPath:        agentPath,
		DefaultTemplate:  cfg.DefaultTemplate,
		Defaults:         cfg.Defaults,
		Max:              cfg.Max,
		DefaultIsolation: cfg.DefaultIsolation,
		Unavailable:      lv.unavailable,
		RuntimeVersions:  lv.versions,
		CheckpointDir:    filepath.Join(cfg.DataDir, "checkpoints"),
		SnapshotDir:      filepath.Join(cfg.DataDir, "snapshots"),
		WarmPool:         warmPools,
		ResumeReady:      cfg.ResumeReady,
		Ceiling:          ceiling,
		VolumeBytes:      cfg.VolumeBytes,
		MaxVolumeBytes:   cfg.MaxVolumeBytes,
		Logger:           log.With("component", "sandbox"),
	}, sandbox.Deps{Runtimes: lv.runtimes, Network: managerNet{netw}, Templates: tpl, Store: db, Prober: link, Egress: egress, Audit: auditLog, Files: link, Meter: egressMeter{egress}, Usage: usage.Tee{meter, history}, Starter: starter{link}, Volumes: vdisks, Keys: db})
	if err != nil {
		return err
	}
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	defer mgr.Close()

	keys := e2bcompat.NewKeys(db)
	// Both data-plane proxies carry agent traffic through the work log.
	wl, err := worklog.New(worklog.Config{Dir: filepath.Join(cfg.DataDir, "worklog"), AgentPort: envd.Port, Logger: log.With("component", "worklog")})
	if err != nil {
		return err
	}
	defer wl.CloseAll()
	agentTransport := prom.Transport(wl.Transport(link.Transport()))
	rev, err := review.New(review.Config{Agents: mgr, Transport: agentTransport, Author: cfg.CommitAuthor, Logger: log.With("component", "review")})
	if err != nil {
		return err
	}
	ws, err := newWorkspaces(cfg, mgr, link, tpl, log)
	if err != nil {
		return err
	}
	recs := &records{mgr: mgr, store: db, logs: []logRemover{auditLog, wl}, retention: retention, log: log.With("component", "records")}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go recs.run(rctx)
	prom.SetSources(metricSources(mgr, meter, keys))
	imgr := instrumented{Manager: mgr, m: prom}
	docker := dockerBuilder{store: tpl, runner: &buildRunner{mgr: mgr, link: link, stateDir: filepath.Join(cfg.DataDir, "sandboxes"), network: buildNetwork(cfg), records: recs}}
	vols := volumeService{mgr, cfg.UIDBase}
	srv := api.New(api.Config{Manager: imgr, Snapshots: mgr, Volumes: vols, Isolation: lv.wire, Metrics: prom.Handler(), Records: recs, Usage: meter, History: history, Templates: tpl, Registries: puller, Dockerfiles: docker, Transport: agentTransport, Dial: link.Dial, APIKeys: keys, RequireAuth: cfg.RequireAuth, Worklog: wl, Review: rev, Workspaces: ws, Warm: mgr, Version: cfg.Version, Logger: log.With("component", "api")})
	// The root handler routes E2B sandbox traffic and the E2B control plane,
	// and hands /v1 to the native API: one listener serves all three.
	root := e2bcompat.New(e2bcompat.Config{
		Manager: imgr, Store: db, Keys: keys, Transport: agentTransport, Domain: cfg.E2BDomain,
		DefaultNetwork: cfg.E2BDefaultNetwork, NoSudo: cfg.E2BNoSudo,
		Templates: e2bTemplates{docker}, TemplateDir: filepath.Join(cfg.DataDir, "e2b-templates"), Builds: db, BuildContext: ctx,
		History: history, Records: hostRecords(mgr, wl), Native: srv.Handler(), Volumes: vols, Logger: log.With("component", "e2b"),
	})
	bctx, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	go retainHistory(bctx, mgr, history)
	go root.SweepUploads(bctx)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	sock, err := listenSocket(SocketPath(cfg.DataDir))
	if err != nil {
		ln.Close()
		return err
	}
	// /metrics is the native API's (authenticated like it); the rest of
	// the root is the E2B-compatible handler's.
	mux := http.NewServeMux()
	mux.Handle("/metrics", srv.Handler())
	mux.Handle("/", root)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// The socket's connections are the operator's: its mode is the
	// authentication.
	ls := &http.Server{Handler: socketMux(mux), ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return auth.MarkLocal(ctx) }}
	errc := make(chan error, 8)
	domain := cfg.E2BDomain
	if domain == "" {
		domain = e2bcompat.DefaultDomain
	}
	preview, err := startPreview(cfg, strings.ToLower(strings.TrimSuffix(domain, ".")), root, errc, log.With("component", "preview"))
	if err != nil {
		ln.Close()
		sock.Close()
		return err
	}
	go func() { errc <- hs.Serve(ln) }()
	go func() { errc <- ls.Serve(sock) }()
	defer os.Remove(SocketPath(cfg.DataDir))
	log.Info("daemon_ready", "listen", ln.Addr().String(), "socket", SocketPath(cfg.DataDir), "require_auth", cfg.RequireAuth, "data_dir", cfg.DataDir, "instance", cfg.Instance)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("daemon_stopping")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if err := ls.Shutdown(sctx); err != nil {
		ls.Close()
	}
	preview.shutdown(sctx)
	return nil
}

// hostCPUMillis is the CPUs this daemon may run on (its affinity mask,
// which a cpuset cgroup narrows), in millicores.
func hostCPUMillis() int64 { return int64(goruntime.NumCPU()) * 1000 }

// checkTraversable refuses a data dir that a sandbox's mapped root (an
// unprivileged host uid) cannot reach: runc mounts the rootfs from inside
// the user namespace, and a parent without the search bit for others (a
// `mktemp -d` dir is 0700) would fail every create with runc's bare
// "permission denied".
func checkTraversable(dataDir string) error {
	for dir := filepath.Dir(dataDir); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("data dir %s: %w", dataDir, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("data dir %s: its parent %s (mode %04o) is not searchable by other users, so sandboxes (which run as unprivileged host uids) cannot reach their root filesystems; run `chmod o+x %s` or choose a data dir under a searchable path: %w",
				dataDir, dir, fi.Mode().Perm(), dir, errdefs.ErrFailedPrecondition)
		}
		if dir == "/" || dir == "." {
			return nil
		}
	}
}

// installAgent copies the agent binary into the data dir, so the file that
// running sandboxes bind-mount never changes under them when berth is
// upgraded; a new copy is written beside it and renamed into place.
func installAgent(cfg Config) (string, error) {
	src := cfg.AgentPath
	if src == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find berth-agent: %w", err)
		}
		src = filepath.Join(filepath.Dir(exe), "berth-agent")
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("berth-agent binary (set agent_path or put it next to berth): %w", err)
	}
	defer in.Close()
	h := sha256.New()
	if _, err := io.Copy(h, in); err != nil {
		return "", fmt.Errorf("read berth-agent: %w", err)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(cfg.DataDir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "berth-agent-"+sum)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy berth-agent: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	return dst, nil
}

// egressMeter reports the egress services' per-sandbox work to the
// Manager.
type egressMeter struct{ e *egress.Egress }

func (m egressMeter) DaemonUsage(id string) (sandbox.DaemonUsage, bool) {
	u, ok := m.e.Usage(id)
	return sandbox.DaemonUsage(u), ok
}

// newEgress builds the egress services from cfg.
func newEgress(cfg Config, proxyPort uint16, ceiling *policy.CompiledCeiling, al *audit.Log, log *slog.Logger) (*egress.Egress, error) {
	guard := &policy.Guard{HostAddrs: new(hostnet.HostAddrs).List}
	for _, s := range cfg.PublicTestNets {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("public_test_nets %q: %w", s, err)
		}
		guard.Public = append(guard.Public, p.Masked())
	}
	var roots *x509.CertPool
	if cfg.EgressCAFile != "" {
		pem, err := os.ReadFile(cfg.EgressCAFile)
		if err != nil {
			return nil, fmt.Errorf("egress_ca_file: %w", err)
		}
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("egress_ca_file %s: no PEM certificates", cfg.EgressCAFile)
		}
	}
	eg, err := egress.New(egress.Config{
		StateDir:      filepath.Join(cfg.DataDir, "egress"),
		Upstream:      cfg.DNSUpstream,
		Guard:         guard,
		Ceiling:       ceiling,
		Audit:         al,
		UpstreamRoots: roots,
		ProxyPort:     proxyPort,
		Logger:        log.With("component", "egress"),
	})
	if err != nil {
		return nil, err
	}
	return eg, nil
}

// dropRecord is the audit record of a firewall refusal.
func dropRecord(d hostnet.Drop) audit.Record {
	r := audit.Record{Time: d.Time, Sandbox: d.Sandbox, Proto: d.Proto, Port: d.Dst.Port(), Decision: "deny", Rule: "firewall", Count: int64(d.Count)}
	if d.Dst.Addr().IsValid() {
		r.IP = d.Dst.Addr().String()
	}
	switch d.Reason {
	case "dns":
		r.Reason = "DNS to a resolver other than the sandbox's own"
	case "ceiling":
		r.Reason = "refused by the operator's egress ceiling"
	default:
		r.Reason = "refused by the firewall (mode or policy)"
	}
	return r
}

// warmPools is the Manager's pool targets from warm_pool and
// warm_pool_sudo; an error names the key and the template.
func (c Config) warmPools() (map[sandbox.WarmKey]int, error) {
	out := map[sandbox.WarmKey]int{}
	for _, f := range []struct {
		key   string
		sudo  bool
		pools map[string]int
	}{{"warm_pool", false, c.WarmPool}, {"warm_pool_sudo", true, c.WarmPoolSudo}} {
		for _, name := range slices.Sorted(maps.Keys(f.pools)) {
			n := f.pools[name]
			if err := template.ValidName(name); err != nil {
				return nil, fmt.Errorf("config %s: %w", f.key, err)
			}
			if n < 0 || n > sandbox.MaxWarm {
				return nil, fmt.Errorf("config %s: %s: %d is out of range [0, %d]: %w", f.key, name, n, sandbox.MaxWarm, errdefs.ErrInvalidArgument)
			}
			if n > 0 {
				out[sandbox.WarmKey{Template: name, AllowSudo: f.sudo}] = n
			}
		}
	}
	return out, nil
}

// DefaultInstance is the instance name of a daemon on data dir dataDir
// that names none: a short digest of the path, so daemons on different
// data dirs never share host objects.
func DefaultInstance(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return hex.EncodeToString(sum[:])[:6]
}
