// Package core holds what the sandbox core owns and persists: the Sandbox
// record, its lifecycle Events, and the Store interface they are kept
// through. It is the containerd split of core types and metadata store:
// the Manager (internal/sandbox) speaks only these types, and a backend
// (internal/store, SQLite) implements Store, so the Manager links no
// database and the store links no orchestration. Nothing here imports
// another Berth package.
package core

import (
	"context"
	"time"
)

// Sandbox is one sandbox's persisted record.
type Sandbox struct {
	ID          string
	State       string
	Template    string
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
	PidsLimit   int64
	Env         map[string]string
	Labels      map[string]string
	Token       string
	CreatedAt   time.Time
	Deadline    time.Time
	EndedAt     time.Time
	Reason      string
	// Pause is what a paused sandbox kept (PauseMemory, PauseFilesystem);
	// "" unless it is paused.
	Pause string
	// Remaining is the time its deadline had left when it was paused
	// (its Deadline is zero while it is paused).
	Remaining time.Duration
	// OnTimeout is what its deadline does: OnTimeoutKill ("" reads kill)
	// or OnTimeoutPause.
	OnTimeout string
	// AutoResume says a paused sandbox resumes on its next request.
	AutoResume bool
	// IdlePause, when positive, pauses the sandbox once it has been idle
	// that long: no request, no open stream, under 1 % of a core.
	IdlePause time.Duration
	// Owner is the ID of the API key that created the sandbox ("" for
	// sandboxes made through the native API).
	Owner string
	// Metadata is free-form string metadata (E2B's), unlike Labels not
	// validated as selectors.
	Metadata map[string]string
	// User is the agent's default user ("" = root).
	User string
	// Isolation is the level the sandbox runs at (IsolationRunc or
	// IsolationGVisor); records from before isolation levels read runc.
	Isolation string
	// RuntimeVersion names the runtime build the sandbox was created
	// under ("runc 1.1.5", "runsc 0.0~20221219.0 (ptrace)").
	RuntimeVersion string
	// AllowSudo lets set-user-ID programs (sudo) raise a process to the
	// sandbox's root, inside its user namespace: no_new_privs is off.
	AllowSudo bool
	// Volumes are the volumes bound into the sandbox, in order.
	Volumes []VolumeMount
}

// Isolation levels: each is one runtime backend the daemon may offer.
const (
	// IsolationRunc runs the sandbox under runc: namespaces, cgroups and
	// seccomp on the host kernel.
	IsolationRunc = "runc"
	// IsolationGVisor runs it under gVisor's runsc: a user-space kernel
	// serves its system calls.
	IsolationGVisor = "gvisor"
)

// Isolations lists every isolation level Berth knows, weakest first.
func Isolations() []string { return []string{IsolationRunc, IsolationGVisor} }

// Event is one lifecycle event of a sandbox.
type Event struct {
	Seq       int64
	SandboxID string
	Time      time.Time
	Type      string
	Message   string
}

// Store persists sandboxes and events. GetSandbox of an unknown ID
// returns an error wrapping errdefs.ErrNotFound.
type Store interface {
	PutSandbox(ctx context.Context, s Sandbox) error
	// PutSandboxEvents writes s and appends evs after it, atomically,
	// and returns evs with their sequence numbers.
	PutSandboxEvents(ctx context.Context, s Sandbox, evs ...Event) ([]Event, error)
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// ListSandboxes returns sandboxes whose state is one of states (all
	// if none given), oldest first.
	ListSandboxes(ctx context.Context, states ...string) ([]Sandbox, error)
	// AddEvent appends e and returns it with its sequence number.
	AddEvent(ctx context.Context, e Event) (Event, error)
	// Events returns a sandbox's events with a sequence number above
	// after, oldest first.
	Events(ctx context.Context, sandboxID string, after int64) ([]Event, error)
}

// Usage is what one sandbox has used, metered while it runs and kept after
// it is gone (attributed to Owner, its API key).
type Usage struct {
	SandboxID string
	Owner     string
	// CPU is the CPU time its cgroup accounted.
	CPU time.Duration
	// MemoryByteSeconds integrates memory in use over time.
	MemoryByteSeconds float64
	MemoryPeakBytes   int64
	// DiskBytes is the disk space in use at the last sample.
	DiskBytes int64
	// EgressBytes is what the egress proxy carried (both directions).
	EgressBytes int64
	// Seconds is how long it was metered running.
	Seconds   float64
	StartedAt time.Time
	UpdatedAt time.Time
}
