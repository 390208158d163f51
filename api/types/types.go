// Package types is the wire contract of Berth's native REST API (/v1): the
// JSON bodies the daemon answers and accepts, its event types and states,
// and the sandbox-ID grammar. The daemon (internal/api) encodes these types
// and the Go SDK (client) decodes them, so the two cannot drift apart; the
// OpenAPI document the daemon serves describes the same shapes. It is a
// leaf: it links nothing of Berth but errdefs, so any program may import it.
package types

import (
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// Error is the JSON body of every error answer: a stable code, a message
// and, for bad input, the field at fault.
type Error = errdefs.Error

// Health is the daemon's answer to GET /v1/health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
	// Isolation lists the isolation levels Berth knows and whether this
	// daemon offers each, with the runtime behind it.
	Isolation []IsolationLevel `json:"isolation,omitempty"`
}

// Isolation levels a sandbox may run at (CreateRequest.Isolation).
const (
	// IsolationRunc: runc, namespaces and seccomp on the host kernel.
	IsolationRunc = "runc"
	// IsolationGVisor: gVisor's runsc, a user-space kernel in between.
	IsolationGVisor = "gvisor"
)

// IsolationLevel is one isolation level as the daemon offers it.
type IsolationLevel struct {
	Name string `json:"name"`
	// Available is false when the daemon cannot run it; Reason then says
	// why and what to install.
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// Default marks the level a request that names none gets (unless its
	// template names one).
	Default bool `json:"default"`
	// Runtime is the runtime's build ("runc 1.1.5+ds1", "runsc
	// 0.0~20221219.0"); Platform is gVisor's syscall interception
	// platform (ptrace, systrap, kvm).
	Runtime  string `json:"runtime,omitempty"`
	Platform string `json:"platform,omitempty"`
	// Sudo says allow_sudo takes effect at this level: always under runc;
	// under gVisor only with a runsc that has --allow-suid (Debian's
	// 20221219 has not, and ignores set-user-ID bits).
	Sudo bool `json:"sudo,omitempty"`
	// Snapshots is what a snapshot or fork of a sandbox at this level
	// keeps: SnapshotMemory (its files and every process with its
	// memory: gVisor with a runsc that can restore one sandbox's image
	// into another) or SnapshotFilesystem (its files; processes start
	// afresh).
	Snapshots string `json:"snapshots,omitempty"`
}

// Sandbox states.
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StatePaused   = "paused"
	// StatePausing and StateResuming: a pause or resume is under way.
	StatePausing  = "pausing"
	StateResuming = "resuming"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateFailed   = "failed"
	// StateLost: the node that ran the sandbox stopped answering (a
	// Kubernetes gateway's sandboxes only; a daemon's never are).
	StateLost = "lost"
)

// States lists every sandbox state a daemon reports, in lifecycle order
// (a Kubernetes gateway's sandboxes may also be StateLost).
var States = []string{StateCreating, StateReady, StatePausing, StatePaused, StateResuming, StateStopping, StateStopped, StateFailed}

// What a paused sandbox kept (Sandbox.Pause).
const (
	// PauseMemory: every process and its memory (a checkpoint).
	PauseMemory = "memory"
	// PauseFilesystem: its files, environment, labels, network policy
	// and remaining time; its processes ended and resume starts its
	// agent again.
	PauseFilesystem = "filesystem"
)

// A sandbox's lifetime when its create names no timeout, and the longest
// a create or a timeout change may ask for, unless the operator configures
// others: the daemon's and the Kubernetes gateway's defaults alike.
const (
	DefaultTimeout = 10 * time.Minute
	MaxTimeout     = 24 * time.Hour
)

// What a sandbox's deadline does (CreateRequest.OnTimeout).
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

// What a Kubernetes gateway does with a sandbox whose node is lost
// (CreateRequest.OnNodeLost).
const (
	// OnNodeLostFail reports the sandbox lost; it stays listed until it
	// is deleted.
	OnNodeLostFail = "fail"
	// OnNodeLostRecreate makes it again, with the same ID and a fresh
	// filesystem, on another node.
	OnNodeLostRecreate = "recreate"
)

// CreateRequest asks for a new sandbox (POST /v1/sandboxes). Every field is
// optional; the daemon fills defaults (template "base", 1 CPU, "512M"
// memory, "2G" disk, "10m" timeout). Sizes are strings such as "512M" or
// "1.5G"; Timeout is a duration string such as "90s".
type CreateRequest struct {
	Template string  `json:"template,omitempty"`
	CPU      float64 `json:"cpu,omitempty"`
	Memory   string  `json:"memory,omitempty"`
	Disk     string  `json:"disk,omitempty"`
	// PIDs caps the sandbox's processes and threads; 0 takes the
	// daemon's default.
	PIDs    int64             `json:"pids,omitempty"`
	Timeout string            `json:"timeout,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// OnTimeout is what the deadline does: "kill" (the default) or
	// "pause".
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume resumes the sandbox, once paused, on its next data
	// plane request (through the agent proxy or to one of its ports).
	AutoResume bool `json:"auto_resume,omitempty"`
	// IdlePause (a duration string) pauses the sandbox once it has had
	// no request, no open stream and under 1 % of a core for that long.
	IdlePause string `json:"idle_pause,omitempty"`
	// Network is the egress policy; nil means mode none.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Isolation is the level to run at (IsolationRunc, IsolationGVisor);
	// empty takes the template's default, then the daemon's.
	Isolation string `json:"isolation,omitempty"`
	// AllowSudo lets set-user-ID programs such as sudo raise a process
	// to the sandbox's root, which stays inside the sandbox's user
	// namespace (never host root). Off, every process in the sandbox has
	// no_new_privs. docs/security.md says what it opens. Unset (nil) is
	// off, or the snapshot's when Snapshot is set; false says off even
	// then.
	AllowSudo *bool `json:"allow_sudo,omitempty"`
	// User is the account processes run as when a request into the
	// sandbox names none; empty takes the template's default (E2B's
	// API, and a Kubernetes node for it, set "user").
	User string `json:"user,omitempty"`
	// Snapshot makes the sandbox from a snapshot (its files, and the
	// template, isolation, limits, env, labels, user, network policy and
	// allow_sudo the request leaves unset).
	Snapshot string `json:"snapshot,omitempty"`
	// Volumes are bound into the sandbox, each at a path of its own (at
	// most 16); a sandbox from a snapshot that names none binds the
	// snapshot's.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// OnNodeLost is what a Kubernetes gateway (berth serve --kubernetes)
	// does once the node running the sandbox is lost: OnNodeLostFail or
	// OnNodeLostRecreate; empty takes the gateway's default. A daemon
	// runs its sandboxes itself and refuses the field.
	OnNodeLost string `json:"on_node_lost,omitempty"`
}

// ResumeRequest is the optional body of POST /v1/sandboxes/{id}/resume:
// Timeout (a duration string) sets the deadline from now; without it the
// sandbox gets the time it had left when it was paused.
type ResumeRequest struct {
	Timeout string `json:"timeout,omitempty"`
}

// SetTimeoutRequest moves a sandbox's deadline (POST
// /v1/sandboxes/{id}/timeout) to Timeout (a duration string) from now.
type SetTimeoutRequest struct {
	Timeout string `json:"timeout"`
}

// MetricSample is one reading of a sandbox's usage over time (GET
// /v1/sandboxes/{id}/metrics).
type MetricSample struct {
	Time time.Time `json:"time"`
	// CPUs is the sandbox's CPU limit (the host's CPUs without one);
	// CPUSeconds the CPU time used since the sandbox started; CPUPercent
	// its share of CPUs since the reading before.
	CPUs             float64 `json:"cpus"`
	CPUSeconds       float64 `json:"cpu_seconds"`
	CPUPercent       float64 `json:"cpu_percent"`
	MemoryBytes      int64   `json:"memory_bytes"`
	MemoryLimitBytes int64   `json:"memory_limit_bytes"`
	DiskUsedBytes    int64   `json:"disk_used_bytes"`
	DiskBytes        int64   `json:"disk_bytes"`
}

// Usage is what a sandbox has consumed so far.
type Usage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes"`
	DiskUsedBytes   int64   `json:"disk_used_bytes"`
	PIDs            int64   `json:"pids"`
	OOMKills        int64   `json:"oom_kills"`
	// The daemon's own work for the sandbox (egress proxy and resolver),
	// outside its cgroup: connections accepted, refused over a limit
	// (DNS-over-TCP ones included) and open now, bytes relayed, DNS
	// queries received and dropped over the rate limit. Counted since the
	// sandbox's network services started.
	ProxyConnections int64 `json:"proxy_connections"`
	ProxyRefused     int64 `json:"proxy_refused"`
	ProxyOpen        int64 `json:"proxy_open"`
	ProxyBytesOut    int64 `json:"proxy_bytes_out"`
	ProxyBytesIn     int64 `json:"proxy_bytes_in"`
	DNSQueries       int64 `json:"dns_queries"`
	DNSDropped       int64 `json:"dns_dropped"`
}

// Sandbox is a sandbox as the daemon describes it.
type Sandbox struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Template    string            `json:"template"`
	CPU         float64           `json:"cpu"`
	MemoryBytes int64             `json:"memory_bytes"`
	DiskBytes   int64             `json:"disk_bytes"`
	PIDsLimit   int64             `json:"pids_limit"`
	Env         map[string]string `json:"env"`
	Labels      map[string]string `json:"labels"`
	CreatedAt   time.Time         `json:"created_at"`
	// Deadline is when the daemon destroys the sandbox unless it is
	// extended; absent once it no longer applies.
	Deadline time.Time `json:"deadline,omitzero"`
	// EndedAt is when a stopped or failed sandbox ended.
	EndedAt time.Time `json:"ended_at,omitzero"`
	Reason  string    `json:"reason,omitempty"`
	// Pause says what a paused sandbox kept: "memory" or "filesystem".
	Pause string `json:"pause,omitempty"`
	// Remaining is the time a paused sandbox's deadline had left (a
	// duration string); its clock runs again once it is resumed.
	Remaining string `json:"remaining,omitempty"`
	// OnTimeout, AutoResume and IdlePause are as created.
	OnTimeout  string `json:"on_timeout,omitempty"`
	AutoResume bool   `json:"auto_resume,omitempty"`
	IdlePause  string `json:"idle_pause,omitempty"`
	// AllowSudo is as created.
	AllowSudo bool `json:"allow_sudo,omitempty"`
	// Volumes are the volumes bound into it (Volume is the volume's ID,
	// Name its name).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	Usage   *Usage        `json:"usage,omitempty"`
	// Network is where a live sandbox sits on the host's network (get and
	// inspect only).
	Network *SandboxNetwork `json:"network,omitempty"`
	// Isolation is the level the sandbox runs at; RuntimeVersion the
	// runtime build it was created under (inspect shows both).
	Isolation      string `json:"isolation"`
	RuntimeVersion string `json:"runtime_version,omitempty"`
}

// SandboxNetwork is a sandbox's network as the host sees it.
type SandboxNetwork struct {
	// Address is the sandbox's own address (its eth0).
	Address string `json:"address"`
	// Gateway is the host side of its veth: its route out, resolver and
	// egress proxy.
	Gateway string `json:"gateway"`
	// HostLink is the host-side interface of its veth.
	HostLink string `json:"host_link"`
}

// SandboxList is the answer to GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Event types of a sandbox's lifecycle log.
const (
	EventCreated        = "created"
	EventReady          = "ready"
	EventAdopted        = "adopted"
	EventOOM            = "oom"
	EventTimeoutChanged = "timeout_changed"
	EventDeadline       = "deadline"
	EventDestroyed      = "destroyed"
	EventFailed         = "failed"
	// EventPaused and EventResumed: a pause or resume is done (their
	// message says what the pause kept).
	EventPaused  = "paused"
	EventResumed = "resumed"
	// EventPauseFailed: an idle pause could not be made (its message
	// says why: no disk room for the memory image, say); the sandbox
	// runs on, and is paused once idle again for as long.
	EventPauseFailed = "pause_failed"
	// EventResumeReady: a paused sandbox's resume is made ready (the
	// daemon's resume_ready setting): its runtime sandbox waits for the
	// memory image, and its resume is shorter.
	EventResumeReady = "resume_ready"
	// EventNetworkPolicy is a policy change through the API.
	EventNetworkPolicy = "network_policy"
	// Workspace setup: started, one step done, all done, or skipped by
	// restoring a cached environment.
	EventSetupStarted = "setup_started"
	EventSetupStep    = "setup_step"
	EventSetupDone    = "setup_done"
	EventSetupCached  = "setup_cached"
)

// EventTypes lists every event type the daemon records.
var EventTypes = []string{
	EventCreated, EventReady, EventAdopted, EventOOM, EventTimeoutChanged, EventDeadline, EventDestroyed, EventFailed,
	EventNetworkPolicy, EventSetupStarted, EventSetupStep, EventSetupDone, EventSetupCached,
	EventPaused, EventResumed, EventPauseFailed, EventResumeReady,
}

// Event is one entry of a sandbox's lifecycle log.
type Event struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandbox_id"`
	Type      string    `json:"type"`
	Message   string    `json:"message,omitempty"`
}

// EventList is the answer to GET /v1/sandboxes/{id}/events; with
// follow=true the events come one per line (NDJSON) instead.
type EventList struct {
	Events []Event `json:"events"`
}

// Template is a root filesystem sandboxes start from.
type Template struct {
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Built       bool      `json:"built"`
	BuiltAt     time.Time `json:"built_at,omitzero"`
	// BuildID names this build of it: new at each build, the same on
	// every copy of one build (an export's import).
	BuildID   string `json:"build_id,omitempty"`
	SizeBytes int64  `json:"size_bytes"`
	// Isolation is the level its sandboxes get when their request names
	// none (empty: the daemon's default).
	Isolation string `json:"isolation,omitempty"`
	// Source is "built-in" or "image REF@DIGEST".
	Source string `json:"source,omitempty"`
	// Layers is how many layers the template stacks; SharedLayers how
	// many of them another template uses too (stored once).
	Layers       int `json:"layers"`
	SharedLayers int `json:"shared_layers"`
	// Env (KEY=VALUE), Workdir and User are what sandboxes of the
	// template start with (an image's ENV, WORKDIR, USER); Command is its
	// ENTRYPOINT followed by CMD.
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	User    string   `json:"user,omitempty"`
	Command []string `json:"command,omitempty"`
	// Warm is the template's warm pool, when it has one; WarmSudo its
	// pool of sudo-capable sandboxes (made with allow_sudo), which only
	// creates with allow_sudo claim from.
	Warm     *WarmPool `json:"warm,omitempty"`
	WarmSudo *WarmPool `json:"warm_sudo,omitempty"`
	// StartCmd is the start command (argv) each new sandbox runs in the
	// background; Ready the check that must pass before it is ready.
	StartCmd []string    `json:"start_cmd,omitempty"`
	Ready    *ReadyCheck `json:"ready,omitempty"`
	// Nodes, on a Kubernetes gateway only, are the Ready Berth nodes
	// whose daemon has the template (built or not); Built then says it
	// is built on every one of them.
	Nodes []string `json:"nodes,omitempty"`
}

// ReadyCheck says when a sandbox whose template has a start command is
// ready: exactly one of Cmd (a shell command exits 0), Port (something
// listens on this TCP port) and File (this path exists), within
// TimeoutSeconds (0: 60) or the create fails.
type ReadyCheck struct {
	Cmd            string `json:"cmd,omitempty"`
	Port           int    `json:"port,omitempty"`
	File           string `json:"file,omitempty"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
}

// WarmPool is a template's pool of ready sandboxes: a create of the
// template claims one instead of making it. Target is how many it keeps,
// Ready how many it holds now; AllowSudo says its sandboxes are made with
// allow_sudo, and only a create with allow_sudo claims one (a create
// without it claims only from the template's other pool).
type WarmPool struct {
	Target    int  `json:"target"`
	Ready     int  `json:"ready"`
	AllowSudo bool `json:"allow_sudo,omitempty"`
}

// WarmRequest sets a template's warm pool target (PUT
// /v1/templates/{name}/warm); 0 drops the pool. AllowSudo names the
// template's pool of sudo-capable sandboxes instead of its plain one.
type WarmRequest struct {
	Target    *int `json:"target"`
	AllowSudo bool `json:"allow_sudo,omitempty"`
}

// TemplateCreateRequest is the body of POST /v1/templates: make template
// Name from an OCI/Docker image. The answer streams like a build.
type TemplateCreateRequest struct {
	Name  string `json:"name"`
	Image string `json:"image"`
	// StartCmd is a shell command (sh -c) each new sandbox starts in the
	// background; StartFromImage takes the image's ENTRYPOINT+CMD
	// instead. Ready is the check that must pass before a sandbox is
	// ready. A rebuild that sets none of them keeps the last build's.
	StartCmd       string      `json:"start_cmd,omitempty"`
	StartFromImage bool        `json:"start_from_image,omitempty"`
	Ready          *ReadyCheck `json:"ready,omitempty"`
}

// TemplatePruneResult is the answer to POST /v1/templates/prune.
type TemplatePruneResult struct {
	RemovedLayers int   `json:"removed_layers"`
	FreedBytes    int64 `json:"freed_bytes"`
}

// TemplateIsolationRequest sets a template's default isolation level (PUT
// /v1/templates/{name}/isolation); empty clears it.
type TemplateIsolationRequest struct {
	Isolation string `json:"isolation"`
}

// TemplateList is the answer to GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
	// UnreachableNodes, on a Kubernetes gateway only, are the Ready
	// Berth nodes that did not answer: their templates are missing from
	// the list.
	UnreachableNodes []string `json:"unreachable_nodes,omitempty"`
}

// BuildLine is one line of a template build stream: build output, then
// the built template or the error that ended the build.
type BuildLine struct {
	Log      *string   `json:"log,omitempty"`
	Template *Template `json:"template,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// APIKey is a key of the daemon's E2B-compatible API.
type APIKey struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Mask      string    `json:"mask"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	// Key is the secret ("e2b_…"), present only in the answer to create:
	// the daemon stores a hash and cannot show it again.
	Key string `json:"key,omitempty"`
	// Admin keys see and manage every sandbox and key.
	Admin bool `json:"admin,omitempty"`
	// Quota bounds the key's sandboxes.
	Quota *Quota `json:"quota,omitempty"`
}

// Quota bounds what one API key's sandboxes hold at once: MaxSandboxes
// counts every live one, MaxCPU and MaxMemory the running ones (a paused
// one is not counted; its resume is admitted as a create is). Unset
// fields are unbounded. Sizes are like "4G", durations like "1h".
type Quota struct {
	MaxSandboxes int64   `json:"max_sandboxes,omitempty"`
	MaxCPU       float64 `json:"max_cpu,omitempty"`
	MaxMemory    string  `json:"max_memory,omitempty"`
	MaxTimeout   string  `json:"max_timeout,omitempty"`
	// MaxVolumeSize bounds the sizes of the key's volumes together.
	MaxVolumeSize string `json:"max_volume_size,omitempty"`
}

// CreateAPIKeyRequest names a new API key.
type CreateAPIKeyRequest struct {
	Name  string `json:"name"`
	Admin bool   `json:"admin,omitempty"`
	Quota *Quota `json:"quota,omitempty"`
}

// UpdateAPIKeyRequest changes a key's quota: the fields it carries replace
// the current ones, the others stay; 0 (or "0") removes a bound.
type UpdateAPIKeyRequest struct {
	MaxSandboxes  *int64   `json:"max_sandboxes,omitempty"`
	MaxCPU        *float64 `json:"max_cpu,omitempty"`
	MaxMemory     *string  `json:"max_memory,omitempty"`
	MaxTimeout    *string  `json:"max_timeout,omitempty"`
	MaxVolumeSize *string  `json:"max_volume_size,omitempty"`
}

// APIKeyList is the answer to GET /v1/apikeys.
type APIKeyList struct {
	APIKeys []APIKey `json:"api_keys"`
}

// UsageRecord is what one sandbox, or all sandboxes of one API key, used:
// metered while running and kept after the sandboxes are gone.
type UsageRecord struct {
	// Key is the API key's name and KeyID its ID ("" for sandboxes of
	// the operator, made without a key).
	Key   string `json:"key"`
	KeyID string `json:"key_id"`
	// Sandbox is set when usage is listed by sandbox; Sandboxes counts
	// them when listed by key.
	Sandbox   string `json:"sandbox,omitempty"`
	Sandboxes int    `json:"sandboxes,omitempty"`
	// CPUSeconds is the CPU time the sandboxes' cgroups accounted.
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryGiBSeconds is memory in use integrated over time.
	MemoryGiBSeconds float64 `json:"memory_gib_seconds"`
	// MemoryPeakBytes is the highest any one sandbox reached.
	MemoryPeakBytes int64 `json:"memory_peak_bytes"`
	// DiskBytes is disk in use at the last sample.
	DiskBytes int64 `json:"disk_bytes"`
	// EgressBytes is what the egress proxy carried, both directions.
	EgressBytes    int64     `json:"egress_bytes"`
	SandboxSeconds float64   `json:"sandbox_seconds"`
	StartedAt      time.Time `json:"started_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// UsageList is the answer to GET /v1/usage.
type UsageList struct {
	Usage []UsageRecord `json:"usage"`
}

// RegistryLoginRequest is the body of PUT /v1/registries/{host}: the
// credentials the daemon pulls from that registry with. The daemon checks
// them against the registry before it stores them.
type RegistryLoginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// RegistryLogin is one registry the daemon has credentials for.
type RegistryLogin struct {
	Registry string `json:"registry"`
	Username string `json:"username"`
}

// RegistryList is the answer to GET /v1/registries.
type RegistryList struct {
	Registries []RegistryLogin `json:"registries"`
}
