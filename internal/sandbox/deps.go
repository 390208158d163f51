package sandbox

import (
	"context"

	"github.com/berth-sandbox/berth/internal/netpolicy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/template"
)

// Runtime is what the Manager needs from an isolation backend.
type Runtime interface {
	Create(ctx context.Context, spec runtime.Spec) error
	Destroy(ctx context.Context, id string) error
	Inspect(ctx context.Context, id string) (runtime.State, error)
	List(ctx context.Context) ([]string, error)
}

// Checkpointer is the optional ability to save a sandbox's running state
// (processes, memory) to a directory and bring it back, possibly into a
// new network namespace (spec.NetNSPath or spec.BeforeStart, as in
// Create). Checkpoint leaves the sandbox stopped with its filesystem kept;
// Restore wants the same sandbox ID. A backend that has the methods but
// cannot (runc) returns errdefs.ErrNotImplemented.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, dir string) error
	Restore(ctx context.Context, spec runtime.Spec, dir string) error
}

// StatsReader is the optional ability to report resource usage.
type StatsReader interface {
	Stats(ctx context.Context, id string) (runtime.Stats, error)
}

// Network is what the Manager needs from the per-sandbox network layer.
type Network interface {
	// AttachTo wires the sandbox's network into the namespace at nsPath.
	AttachTo(ctx context.Context, id, nsPath string) (netpolicy.Attachment, error)
	Lookup(ctx context.Context, id string) (netpolicy.Attachment, error)
	Detach(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
}

// Templates resolves template names to layers.
type Templates interface {
	Get(ctx context.Context, name string) (template.Template, error)
}

// Store persists sandboxes and events.
type Store interface {
	PutSandbox(ctx context.Context, s store.Sandbox) error
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	ListSandboxes(ctx context.Context, states ...string) ([]store.Sandbox, error)
	AddEvent(ctx context.Context, e store.Event) (store.Event, error)
	Events(ctx context.Context, sandboxID string, after int64) ([]store.Event, error)
}

// Prober checks that a sandbox's agent answers.
type Prober interface {
	// WaitReady returns once the agent at addr answers its health check,
	// or ctx ends.
	WaitReady(ctx context.Context, addr string) error
}
