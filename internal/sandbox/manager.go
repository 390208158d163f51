// Package sandbox owns the sandbox lifecycle: the Manager is the only
// orchestrator. It validates requests, drives the runtime, network and
// template layers (which never call each other), keeps the state machine
// (creating → ready → stopping → stopped, failed from any step with a
// reason), deadlines, lifecycle events and usage, and reconciles what it
// finds on the host when the daemon starts.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/proto/envd"
)

// Event types.
const (
	EventCreated        = "created"
	EventReady          = "ready"
	EventAdopted        = "adopted"
	EventOOM            = "oom"
	EventTimeoutChanged = "timeout_changed"
	EventDeadline       = "deadline"
	EventDestroyed      = "destroyed"
	EventFailed         = "failed"
)

// Limits are a sandbox's resource limits.
type Limits struct {
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
	PidsLimit   int64
}

// Config holds the Manager's settings.
type Config struct {
	// AgentPath is the host path of the berth-agent binary.
	AgentPath string
	// DefaultTemplate is used when a request names none.
	DefaultTemplate string
	// Defaults fill limits a request leaves at zero.
	Defaults Limits
	// Max bounds what a request may ask for.
	Max Limits
	// DefaultTimeout and MaxTimeout bound a sandbox's lifetime.
	DefaultTimeout, MaxTimeout time.Duration
	// ReadyTimeout bounds how long create waits for the agent. The
	// default is generous: on a host running flat out (50 creates at
	// once next to a CPU hog) an agent has been seen to take over 30 s to
	// answer, and such a create should end slow, not failed.
	ReadyTimeout time.Duration
	// CheckpointDir holds the checkpoints of sandboxes paused with their
	// memory (pause.go); without it a pause keeps files only.
	CheckpointDir string
	// BootID is the host's current boot ID (default: the kernel's),
	// recorded in each checkpoint so one whose background flush a host
	// restart cut short is refused (pausesync.go).
	BootID func() (string, error)
	// DiskFree reports the space still free in a directory's file system
	// (default: statfs), against which a memory image's room is claimed
	// (room.go).
	DiskFree func(dir string) (int64, error)
	// CheckpointFlushDelay is how long after a memory pause its
	// checkpoint's flush begins (default 2 s; pausesync.go).
	CheckpointFlushDelay time.Duration
	// SnapshotDir holds snapshots' files (snapshot.go); without it, or
	// without a store that keeps snapshot records, there are none.
	SnapshotDir string
	// MonitorInterval is how often usage and liveness are sampled.
	MonitorInterval time.Duration
	// DefaultIsolation is the level a sandbox gets when neither its
	// request nor its template names one (default runc).
	DefaultIsolation string
	// Unavailable says, per level Berth knows but this daemon cannot
	// offer, why and what to install; a create asking for it is refused
	// with this reason.
	Unavailable map[string]string
	// RuntimeVersions names, per level, the runtime build its sandboxes
	// run under; each sandbox records it at create (inspect shows it).
	RuntimeVersions map[string]string
	// WarmPool is how many ready sandboxes to keep per template, and
	// per template whether sudo-capable (pool.go); SetWarm changes it at
	// run time.
	WarmPool map[WarmKey]int
	// Ceiling is the operator's egress ceiling: a policy naming anything
	// outside it is refused when set (nil: no ceiling beyond the guard).
	Ceiling *policy.CompiledCeiling
	// ResumeReady is how many paused sandboxes at most have their resume
	// made ready, the most recently paused (resumeready.go); 0: none.
	ResumeReady int
	// VolumeBytes is a new volume's size when its request gives none;
	// MaxVolumeBytes bounds what one may ask (volumes.go; defaults
	// DefaultVolumeBytes and MaxVolumeBytes).
	VolumeBytes, MaxVolumeBytes int64
	Logger                      *slog.Logger
}

// Deps are the subsystems the Manager drives.
type Deps struct {
	// Runtime is the runc level's runtime; Runtimes holds every level's
	// (isolation.go), and a "runc" entry there wins over Runtime.
	Runtime   Runtime
	Runtimes  map[string]Runtime
	Network   Network
	Templates Templates
	Store     Store
	Prober    Prober
	// Egress and Audit, when set, run and record egress policy (policy.go);
	// with Egress, Files installs its settings in each sandbox.
	Egress Egress
	Audit  AuditLog
	Files  AgentFiles
	// Meter, when set, reports the daemon's own work for each sandbox.
	Meter DaemonMeter
	// Starter, when set, runs templates' start commands and ready
	// checks; without it a template that has them cannot be used.
	Starter Starter
	// Usage, when set, is given every monitor sample of a running
	// sandbox and a last one at its teardown, to meter what it used.
	Usage UsageSink
	// Volumes, when set (with a store that keeps volume records), keeps
	// volumes' disks (volumes.go).
	Volumes VolumeDisks
	// Keys, when set, gives a sandbox owner's quota when it resumes
	// (quota.go); without it a resume is not bounded.
	Keys KeyQuotas
}

// DaemonUsage is work the daemon does for a sandbox outside its cgroup
// (the egress proxy and resolver), counted so it is attributed.
type DaemonUsage struct {
	ProxyConns   int64
	ProxyRefused int64
	ProxyOpen    int64
	BytesOut     int64
	BytesIn      int64
	DNSQueries   int64
	DNSDropped   int64
}

// UsageSample is one sample of a running sandbox, for metering.
type UsageSample struct {
	ID    string
	Owner string
	Time  time.Time
	Stats runtime.Stats
	// EgressBytes is what the egress proxy carried for it in this
	// daemon's run (both directions).
	EgressBytes int64
	// Final is the sample taken as the sandbox is torn down.
	Final bool
}

// UsageSink receives usage samples.
type UsageSink interface {
	Observe(s UsageSample)
}

// DaemonMeter reports a running sandbox's DaemonUsage.
type DaemonMeter interface {
	DaemonUsage(id string) (DaemonUsage, bool)
}

// Manager orchestrates sandboxes on one host.
type Manager struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	// life is the daemon-lifetime context: deadlines and monitors hang off
	// it, never off a request.
	life   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	live map[string]*entry
	// waking is the paused sandboxes whose resume the quota admitted,
	// counted as running until their state says so (quota.go).
	waking  map[string]struct{}
	closing bool

	// rts is the runtime of each isolation level the daemon offers.
	rts map[string]Runtime

	// flushes is each paused sandbox's pending checkpoint flush
	// (pausesync.go), which a removal of its checkpoint ends first.
	flushMu sync.Mutex
	flushes map[string]*flush

	hub *hub

	snaps snapState
	vols  volumeState
	// images is the room claimed by memory images being written (room.go).
	images imageState
	// ready is the paused sandboxes whose resume is made ready
	// (resumeready.go).
	ready readyState
	// pool is the warm pools (pool.go).
	pool *pool
	// bootID is Config.BootID, asked once: a boot's ID does not change
	// under a running daemon (pausesync.go).
	bootID func() (string, error)
}

// New builds a Manager. Call Start to reconcile and begin monitoring.
func New(cfg Config, deps Deps) (*Manager, error) {
	if cfg.AgentPath == "" {
		return nil, fmt.Errorf("sandbox manager: agent path: %w", errdefs.ErrInvalidArgument)
	}
	rts := runtimes(deps)
	if len(rts) == 0 || deps.Network == nil || deps.Templates == nil || deps.Store == nil || deps.Prober == nil {
		return nil, fmt.Errorf("sandbox manager: missing dependency: %w", errdefs.ErrInvalidArgument)
	}
	if deps.Egress != nil && deps.Files == nil {
		return nil, fmt.Errorf("sandbox manager: egress needs agent files: %w", errdefs.ErrInvalidArgument)
	}
	for name, n := range cfg.WarmPool {
		if n < 0 || n > MaxWarm {
			return nil, fmt.Errorf("sandbox manager: warm_pool %s (allow_sudo %v): %d is out of range [0, %d]: %w", name.Template, name.AllowSudo, n, MaxWarm, errdefs.ErrInvalidArgument)
		}
	}
	if cfg.BootID == nil {
		cfg.BootID = runtime.HostBootID
	}
	if cfg.DiskFree == nil {
		cfg.DiskFree = diskFree
	}
	if cfg.CheckpointFlushDelay <= 0 {
		cfg.CheckpointFlushDelay = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxVolumeBytes == 0 {
		cfg.MaxVolumeBytes = MaxVolumeBytes
	}
	if cfg.VolumeBytes == 0 {
		cfg.VolumeBytes = min(DefaultVolumeBytes, cfg.MaxVolumeBytes)
	}
	if cfg.VolumeBytes < MinVolumeBytes || cfg.VolumeBytes > cfg.MaxVolumeBytes {
		return nil, fmt.Errorf("sandbox manager: volume size %d is out of range [%d, %d]: %w", cfg.VolumeBytes, MinVolumeBytes, cfg.MaxVolumeBytes, errdefs.ErrInvalidArgument)
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "base"
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = types.DefaultTimeout
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = types.MaxTimeout
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	if cfg.MonitorInterval == 0 {
		cfg.MonitorInterval = time.Second
	}
	if cfg.DefaultIsolation == "" {
		cfg.DefaultIsolation = core.IsolationRunc
	}
	life, cancel := context.WithCancel(context.Background())
	return &Manager{
		cfg:    cfg,
		deps:   deps,
		log:    cfg.Logger,
		life:   life,
		cancel: cancel,
		live:   map[string]*entry{},
		waking: map[string]struct{}{},
		ready:  readyState{ids: map[string]uint64{}},
		rts:    rts,
		hub:    newHub(),
		pool:   newPool(cfg.WarmPool),
		bootID: sync.OnceValues(cfg.BootID),
	}, nil
}

// Start reconciles host state with the store and starts the monitor.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.reconcile(ctx); err != nil {
		return err
	}
	m.reconcileSnapshots(ctx)
	m.sweepVolumeDisks(ctx)
	if !m.track() {
		return errors.New("sandbox manager is closed")
	}
	go func() {
		defer m.wg.Done()
		m.monitor()
	}()
	if !m.track() {
		return errors.New("sandbox manager is closed")
	}
	go func() {
		defer m.wg.Done()
		m.refill()
	}()
	return nil
}

// Close stops timers and monitors. Sandboxes keep running: a restarted
// daemon re-adopts them. Warm pools are destroyed.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closing = true
	m.cancel()
	for _, e := range m.live {
		e.stopTimer()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.drainPools()
	m.hub.closeAll()
}

// CreateRequest asks for a new sandbox. Zero limits take the defaults.
type CreateRequest struct {
	Template string
	Limits   Limits
	Timeout  time.Duration
	Env      map[string]string
	Labels   map[string]string
	// Owner, Metadata and User: see owner.go.
	Owner    string
	Metadata map[string]string
	User     string
	// OnTimeout is what the deadline does: core.OnTimeoutKill ("") or
	// core.OnTimeoutPause. AutoResume resumes a paused sandbox on its
	// next request (pause.go).
	OnTimeout  string
	AutoResume bool
	// IdlePause, when positive, pauses the sandbox once it has been idle
	// that long (pause.go, idle.go).
	IdlePause time.Duration
	// Network is the egress policy (nil: mode none); see policy.go.
	Network *policy.Policy
	// Workdir, when set, is where processes that name no working directory
	// start (over the template's WORKDIR and the user's home): a
	// workspace's checkout. Only the daemon's own callers set it.
	Workdir string
	// Isolation is the level to run at (core.IsolationRunc or
	// core.IsolationGVisor); "" takes the template's default, then the
	// daemon's.
	Isolation string
	// Quota bounds the live sandboxes of Owner (quota.go); zero: none.
	Quota core.Quota
	// AllowSudo lets set-user-ID programs raise privileges inside the
	// sandbox's user namespace (runtime.Spec.AllowSetuid). nil is off, or
	// the snapshot's when Snapshot is set (fromSnapshot fills it).
	AllowSudo *bool

	// Volumes are bound into the sandbox (volumes.go); a sandbox from a
	// snapshot that names none binds the snapshot's.
	Volumes []VolumeRequest

	// Snapshot, when set, makes the sandbox from that snapshot
	// (snapshot.go): its layers, and whatever the request leaves unset.
	Snapshot string

	// Layers, when set, replace the template's layers (a cached workspace
	// environment on top of them). Only the daemon's own layers set them,
	// never a client's request.
	Layers []string
	// Setup, when set, runs once the agent answers and before the sandbox
	// turns ready (setup.go).
	Setup SetupFunc
}

// sudo is the request's allow_sudo, nil taken as off.
func (r CreateRequest) sudo() bool { return r.AllowSudo != nil && *r.AllowSudo }

// setupTimeout is how long a create may spend in its setup hook: up to the
// sandbox's whole lifetime (setup bounds itself by the deadline too).
func (r CreateRequest) setupTimeout() time.Duration {
	if r.Setup == nil {
		return 0
	}
	return r.Timeout
}

// Sandbox is the Manager's view of one sandbox.
type Sandbox struct {
	core.Sandbox
	Usage *runtime.Stats
	// Daemon is the daemon's work for the sandbox (while it runs).
	Daemon *DaemonUsage
	// Network is where a live sandbox sits on the host's network, for
	// operators (nil when it has no attachment or is busy).
	Network *NetworkInfo
}

// NetworkInfo is a sandbox's network as the host sees it.
type NetworkInfo struct {
	// Address is the sandbox's own address (its eth0).
	Address netip.Addr
	// Gateway is the host side of its veth: its route out, resolver and
	// egress proxy.
	Gateway netip.Addr
	// HostLink is the host-side interface of its veth (for tcpdump, nft).
	HostLink string
}

// newID returns a new ID for a sandbox or a snapshot (the same grammar).
func newID() string { return types.NewSandboxID() }

func newToken() string {
	var b [24]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (m *Manager) validate(req *CreateRequest) error {
	if req.Template == "" {
		req.Template = m.cfg.DefaultTemplate
	}
	fill := func(v *int64, def int64) {
		if *v == 0 {
			*v = def
		}
	}
	fill(&req.Limits.CPUMillis, m.cfg.Defaults.CPUMillis)
	fill(&req.Limits.MemoryBytes, m.cfg.Defaults.MemoryBytes)
	fill(&req.Limits.DiskBytes, m.cfg.Defaults.DiskBytes)
	fill(&req.Limits.PidsLimit, m.cfg.Defaults.PidsLimit)
	if req.Timeout == 0 {
		req.Timeout = m.cfg.DefaultTimeout
	}
	checks := []struct {
		field     string
		v, lo, hi int64
	}{
		{"cpu", req.Limits.CPUMillis, MinLimits.CPUMillis, m.cfg.Max.CPUMillis},
		{"memory", req.Limits.MemoryBytes, MinLimits.MemoryBytes, m.cfg.Max.MemoryBytes},
		{"disk", req.Limits.DiskBytes, MinLimits.DiskBytes, m.cfg.Max.DiskBytes},
		{"pids", req.Limits.PidsLimit, MinLimits.PidsLimit, m.cfg.Max.PidsLimit},
		{"timeout", int64(req.Timeout), int64(time.Second), int64(m.cfg.MaxTimeout)},
	}
	for _, c := range checks {
		if c.v < c.lo || (c.hi > 0 && c.v > c.hi) {
			return &FieldError{Field: c.field, Err: fmt.Errorf("%s %s is out of range: want %s to %s: %w",
				c.field, fmtLimit(c.field, c.v), fmtLimit(c.field, c.lo), fmtLimit(c.field, c.hi), errdefs.ErrInvalidArgument)}
		}
	}
	if req.IdlePause != 0 && (req.IdlePause < time.Second || req.IdlePause > m.cfg.MaxTimeout) {
		return &FieldError{Field: "idle_pause", Err: fmt.Errorf("idle_pause %s is out of range [1s, %s]: %w", req.IdlePause, m.cfg.MaxTimeout, errdefs.ErrInvalidArgument)}
	}
	switch req.OnTimeout {
	case "", core.OnTimeoutKill, core.OnTimeoutPause:
	default:
		return &FieldError{Field: "on_timeout", Err: fmt.Errorf("on_timeout %q: want %s or %s: %w", req.OnTimeout, core.OnTimeoutKill, core.OnTimeoutPause, errdefs.ErrInvalidArgument)}
	}
	for k := range req.Env {
		if !validEnvKey(k) {
			return &FieldError{Field: "env", Err: fmt.Errorf("env: invalid variable name %q: %w", k, errdefs.ErrInvalidArgument)}
		}
		if k == envd.TokenEnv || k == envd.TokenFDEnv {
			return &FieldError{Field: "env", Err: fmt.Errorf("env: variable %q is reserved: the agent's token travels in it: %w", k, errdefs.ErrInvalidArgument)}
		}
	}
	for k, v := range req.Labels {
		if !validLabel(k) || len(v) > 256 {
			return &FieldError{Field: "labels", Err: fmt.Errorf("labels: invalid label %q (keys are [a-zA-Z0-9._/-]{1,63}, values at most 256 bytes): %w", k, errdefs.ErrInvalidArgument)}
		}
	}
	return validateOwned(req)
}

// MinLimits are the smallest limits a sandbox may ask for: below them it
// cannot start its agent (memory, pids), hold a filesystem (disk), or get
// a useful share of a core (cpu, 0.1). Zero in a request means "the
// default", so the API refuses an explicit 0 itself.
var MinLimits = Limits{CPUMillis: 100, MemoryBytes: 16 << 20, DiskBytes: 64 << 20, PidsLimit: 16}

// fmtBytes renders a size in the largest binary unit that holds it exactly
// ("16MiB", "1KiB", "1000B"), so a tiny value is not shown as 0MiB.
func fmtBytes(v int64) string {
	if v == 0 {
		return "unbounded"
	}
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v%u.m == 0 {
			return strconv.FormatInt(v/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(v, 10) + "B"
}

func fmtLimit(field string, v int64) string {
	switch field {
	case "cpu":
		return strconv.FormatFloat(float64(v)/1000, 'f', -1, 64)
	case "memory", "disk":
		return fmtBytes(v)
	case "timeout":
		if v == 0 {
			return "unbounded"
		}
		return time.Duration(v).String()
	}
	if v == 0 {
		return "unbounded"
	}
	return strconv.FormatInt(v, 10)
}

func validEnvKey(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i, c := range k {
		ok := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}

func validLabel(k string) bool {
	if k == "" || len(k) > 63 {
		return false
	}
	for _, c := range k {
		ok := c == '.' || c == '_' || c == '/' || c == '-' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// FieldError is an invalid-argument error that names the bad request field.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// agentEnv is the environment of the agent, which becomes the base
// environment of every process it starts; its token comes apart
// (agentSecret).
func agentEnv(rec core.Sandbox) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"BERTH_SANDBOX=true",
		"BERTH_SANDBOX_ID=" + rec.ID,
		"BERTH_TEMPLATE=" + rec.Template,
	}
	for k, v := range rec.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// agentSecret is the agent's token, handed over where no other process of
// the sandbox can read it back.
func agentSecret(rec core.Sandbox) runtime.Secret {
	return runtime.Secret{Name: envd.TokenEnv, Value: rec.Token, FDName: envd.TokenFDEnv}
}

func agentAddr(att Attachment) string {
	return netip.AddrPortFrom(att.SandboxIP, envd.Port).String()
}

// teardown removes everything a sandbox has on the host. It is idempotent
// and runs with its own time budget.
func (m *Manager) teardown(ctx context.Context, e *entry) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	e.stopTimer()
	m.meterFinal(ctx, e)
	m.dropReady(e.id)
	var errs []error
	if err := m.runtimeOf(e.rec).Destroy(ctx, e.id); err != nil {
		errs = append(errs, fmt.Errorf("runtime: %w", err))
	}
	if err := m.deps.Network.Detach(ctx, e.id); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	if err := m.removeEgress(e.id); err != nil {
		errs = append(errs, fmt.Errorf("egress: %w", err))
	}
	if err := m.removeCheckpoint(e.id); err != nil {
		errs = append(errs, fmt.Errorf("checkpoint: %w", err))
	}
	return errors.Join(errs...)
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
}

func (m *Manager) lookup(id string) (*entry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.live[id]
	return e, ok
}

// Destroy ends a sandbox for the given reason.
func (m *Manager) Destroy(ctx context.Context, id, reason string) error {
	e, ok := m.lookup(id)
	if !ok {
		if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
			return err
		}
		return fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrNotFound)
	}
	return m.destroy(ctx, e, reason)
}

// destroy ends a live sandbox. It waits for an operation in progress only
// as long as ctx allows, and aborts a create in progress rather than wait
// it out (a workspace setup can take minutes): the create fails and tears
// down, and the destroy finds the sandbox ended.
func (m *Manager) destroy(ctx context.Context, e *entry, reason string) error {
	return m.destroyIf(ctx, e, reason, nil)
}

// destroyIf is destroy when still holds once the op lock is taken (nil:
// always): what a caller saw before may have changed meanwhile (a pause
// stops the runtime the monitor found stopped).
func (m *Manager) destroyIf(ctx context.Context, e *entry, reason string, still func() bool) error {
	if !e.tryLock() {
		if e.cur.Load().state == StateCreating && e.abort != nil {
			m.log.Info("abort_create", "sandbox_id", e.id)
			e.abort()
		}
		if err := e.lock(ctx); err != nil {
			return err
		}
	}
	defer e.unlock()
	if still != nil && !e.closed && !still() {
		return nil
	}
	if e.closed || e.state() == StateFailed {
		if e.state() == StateFailed {
			return nil // it ended while being made (or was aborted by us)
		}
		return fmt.Errorf("sandbox %s is not running: %w", e.id, errdefs.ErrNotFound)
	}
	ctx = context.WithoutCancel(ctx)
	if err := e.moveTo(StateStopping); err != nil {
		return err
	}
	// On record while it stops, and what its requests end with.
	e.rec.Reason = reason
	e.publish()
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		return err
	}
	terr := m.teardown(ctx, e)
	e.closed = true
	e.rec.EndedAt = time.Now().UTC()
	e.rec.Reason = reason
	to, typ, msg := StateStopped, EventDestroyed, reason
	if terr != nil {
		to = StateFailed
		e.rec.Reason = fmt.Sprintf("%s; teardown: %v", reason, terr)
		typ, msg = EventFailed, e.rec.Reason
	}
	if err := e.moveTo(to); err != nil {
		return err
	}
	e.publish()
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		m.log.Error("persist_destroyed_state", "sandbox_id", e.id, "err", err)
	}
	m.event(ctx, e.id, typ, msg)
	m.forget(e.id)
	m.log.Info("sandbox_destroyed", "sandbox_id", e.id, "reason", reason)
	m.gcForkSnapshots(ctx)
	return terr
}

// arm (re)starts the deadline timer of a live sandbox; the caller holds
// its op lock (or has not published it yet).
func (m *Manager) arm(e *entry) {
	// Every (re)start of its clock is activity: create, resume, adopt, a
	// new timeout.
	e.act.touch()
	e.tmu.Lock()
	defer e.tmu.Unlock()
	if e.timer != nil {
		e.timer.Stop()
	}
	id := e.id
	e.timer = time.AfterFunc(time.Until(e.rec.Deadline), func() {
		if !m.track() {
			return
		}
		defer m.wg.Done()
		if e.cur.Load().rec.OnTimeout == core.OnTimeoutPause && m.pauseAtDeadline(e) {
			return
		}
		m.event(m.life, id, EventDeadline, "deadline reached")
		err := m.destroy(m.life, e, "deadline reached")
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) && m.life.Err() == nil {
			m.log.Error("destroy_at_deadline", "sandbox_id", id, "err", err)
		}
	})
}

// track registers a background operation with the Manager's wait group,
// unless the Manager is closing. The caller must call m.wg.Done when true.
func (m *Manager) track() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return false
	}
	m.wg.Add(1)
	return true
}

// Get returns a sandbox, with usage when it is live. It never waits for a
// lifecycle operation: a live sandbox's status is its last published one.
func (m *Manager) Get(ctx context.Context, id string) (Sandbox, error) {
	e, ok := m.lookup(id)
	if !ok {
		return m.storeSandbox(ctx, id)
	}
	st := e.cur.Load()
	s := Sandbox{Sandbox: st.rec, Network: st.network()}
	if sr, ok := m.runtimeOf(st.rec).(StatsReader); ok && st.state == StateReady {
		if u, err := sr.Stats(ctx, id); err == nil {
			s.Usage = &u
		}
	}
	if m.deps.Meter != nil {
		if u, ok := m.deps.Meter.DaemonUsage(id); ok {
			s.Daemon = &u
		}
	}
	return s, nil
}

func (m *Manager) storeSandbox(ctx context.Context, id string) (Sandbox, error) {
	rec, err := m.deps.Store.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	return Sandbox{Sandbox: rec}, nil
}

// ListOptions filter List.
type ListOptions struct {
	States []string
	Labels map[string]string
}

// List returns sandboxes matching opts, oldest first.
func (m *Manager) List(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	recs, err := m.deps.Store.ListSandboxes(ctx, opts.States...)
	if err != nil {
		return nil, err
	}
	out := make([]Sandbox, 0, len(recs))
next:
	for _, r := range recs {
		for k, v := range opts.Labels {
			if got, ok := r.Labels[k]; !ok || got != v {
				continue next
			}
		}
		if e, ok := m.lookup(r.ID); ok {
			r = e.cur.Load().rec
		}
		out = append(out, Sandbox{Sandbox: r})
	}
	return out, nil
}

// SetTimeout moves a live sandbox's deadline to now+d.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) (Sandbox, error) {
	if d < time.Second || d > m.cfg.MaxTimeout {
		return Sandbox{}, &FieldError{Field: "timeout", Err: fmt.Errorf("timeout %s is out of range [1s, %s]: %w", d, m.cfg.MaxTimeout, errdefs.ErrInvalidArgument)}
	}
	e, ok := m.lookup(id)
	if !ok {
		if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
			return Sandbox{}, err
		}
		return Sandbox{}, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err := e.lock(ctx); err != nil {
		return Sandbox{}, err
	}
	defer e.unlock()
	if !e.closed && e.state() == StatePaused {
		// The clock is stopped: d is what it will have when resumed.
		e.rec.Remaining = d
		if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
			return Sandbox{}, err
		}
		e.publish()
		m.event(ctx, id, EventTimeoutChanged, "remaining "+d.String()+" once resumed")
		return Sandbox{Sandbox: e.rec}, nil
	}
	if e.closed || e.state() != StateReady {
		return Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, e.rec.State, errdefs.ErrFailedPrecondition)
	}
	e.rec.Deadline = time.Now().UTC().Add(d)
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		return Sandbox{}, err
	}
	e.publish()
	m.arm(e)
	m.event(ctx, id, EventTimeoutChanged, "deadline "+e.rec.Deadline.Format(time.RFC3339))
	return Sandbox{Sandbox: e.rec}, nil
}

// Agent returns the address and access token of a ready sandbox's agent.
// It reads the published status, so the data-plane proxy never waits for
// a lifecycle operation.
func (m *Manager) Agent(ctx context.Context, id string) (addr, token string, err error) {
	st, err := m.readyStatus(ctx, id)
	if err != nil {
		return "", "", err
	}
	return agentAddr(st.att), st.rec.Token, nil
}

// readyStatus is the published status of a ready sandbox, resuming a
// paused one that resumes on demand, or why it is not ready.
func (m *Manager) readyStatus(ctx context.Context, id string) (*status, error) {
	e, ok := m.lookup(id)
	if !ok {
		rec, err := m.deps.Store.GetSandbox(ctx, id)
		if err != nil {
			return nil, err
		}
		why := ""
		if rec.Reason != "" {
			why = ": " + rec.Reason
		}
		return nil, fmt.Errorf("sandbox %s is not running (%s%s): %w", id, rec.State, why, errdefs.ErrFailedPrecondition)
	}
	e.act.trackRequest(ctx)
	st := e.cur.Load()
	if paused := st.state == StatePaused || st.state == StatePausing || st.state == StateResuming; paused && st.rec.AutoResume && !st.closed {
		// A request to a paused sandbox that resumes on demand waits
		// for it (pausing or resuming ones too, once that is done).
		if _, err := m.Resume(ctx, id, 0); err != nil {
			return nil, err
		}
		st = e.cur.Load()
	}
	if st.state != StateReady || st.run == nil {
		return nil, st.endCause(id)
	}
	return st, nil
}
