package client

import "time"

// Sandbox states, as the daemon reports them.
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StatePaused   = "paused"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateFailed   = "failed"
)

// CreateRequest asks for a new sandbox. Every field is optional; the daemon
// fills defaults (template "base", 1 CPU, "512M" memory, "2G" disk, "10m"
// timeout). Sizes are strings such as "512M" or "1.5G"; Timeout is a Go
// duration string such as "90s".
type CreateRequest struct {
	Template string            `json:"template,omitempty"`
	CPU      float64           `json:"cpu,omitempty"`
	Memory   string            `json:"memory,omitempty"`
	Disk     string            `json:"disk,omitempty"`
	Timeout  string            `json:"timeout,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Network is the egress policy; nil means mode none (see network.go).
	Network *NetworkPolicy `json:"network,omitempty"`
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
	// (DNS-over-TCP ones included) and open now, bytes relayed, DNS queries received and dropped over the
	// rate limit. Counted since the sandbox's network services started.
	ProxyConnections int64 `json:"proxy_connections"`
	ProxyRefused     int64 `json:"proxy_refused"`
	ProxyOpen        int64 `json:"proxy_open"`
	ProxyBytesOut    int64 `json:"proxy_bytes_out"`
	ProxyBytesIn     int64 `json:"proxy_bytes_in"`
	DNSQueries       int64 `json:"dns_queries"`
	DNSDropped       int64 `json:"dns_dropped"`
}

// Sandbox is a sandbox as the daemon describes it. A Sandbox returned by a
// Client (or made by Client.Sandbox) is also a handle for the data plane:
// Exec, files, PTYs.
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
	Deadline    time.Time         `json:"deadline"`
	Reason      string            `json:"reason,omitempty"`
	Usage       *Usage            `json:"usage,omitempty"`
	// Network is where a live sandbox sits on the host's network (get and
	// inspect only).
	Network *SandboxNetwork `json:"network,omitempty"`

	c    *Client
	user string
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

// Event is one entry of a sandbox's lifecycle log.
type Event struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandbox_id"`
	Type      string    `json:"type"`
	Message   string    `json:"message,omitempty"`
}

// Template is a root filesystem sandboxes start from.
type Template struct {
	Name        string    `json:"name"`
	Built       bool      `json:"built"`
	BuiltAt     time.Time `json:"built_at"`
	SizeBytes   int64     `json:"size_bytes"`
	Description string    `json:"description,omitempty"`
}

// Health is the daemon's health answer.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}

// ListOptions filters List. Every label must match (AND); an empty State
// matches every state.
type ListOptions struct {
	Labels map[string]string
	State  string
}
