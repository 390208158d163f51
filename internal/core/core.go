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
	// Owner is the ID of the API key that created the sandbox ("" for
	// sandboxes made through the native API).
	Owner string
	// Metadata is free-form string metadata (E2B's), unlike Labels not
	// validated as selectors.
	Metadata map[string]string
	// User is the agent's default user ("" = root).
	User string
}

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
