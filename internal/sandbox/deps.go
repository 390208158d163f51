package sandbox

import (
	"context"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/netpolicy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/template"
)

// Runtime is what the Manager needs from an isolation backend.
type Runtime interface {
	Create(ctx context.Context, spec runtime.Spec) error
	Destroy(ctx context.Context, id string) error
	Inspect(ctx context.Context, id string) (runtime.State, error)
	List(ctx context.Context) ([]string, error)
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

// Store persists sandboxes and events: the core's interface, which
// internal/store implements (the Manager links no database).
type Store = core.Store

// Prober checks that a sandbox's agent answers.
type Prober interface {
	// WaitReady returns once the agent at addr answers its health check,
	// or ctx ends.
	WaitReady(ctx context.Context, addr string) error
}
