package sandbox

import (
	"context"
	"net/netip"

	"github.com/berth-sandbox/berth/internal/core"
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

// MemoryCopier is the optional ability to save a running sandbox's
// memory image without stopping it (CheckpointLive) and to start other
// sandboxes from such an image (runtime.Spec.RestoreImage): gVisor on a
// runsc that can (runc.Runtime.CopiesMemory). Snapshots and forks of
// its sandboxes keep their processes and memory.
type MemoryCopier interface {
	CopiesMemory() bool
	CheckpointLive(ctx context.Context, id, dir string) error
}

// StatsReader is the optional ability to report resource usage.
type StatsReader interface {
	Stats(ctx context.Context, id string) (runtime.Stats, error)
}

// CrashReporter is the optional ability to say why a sandbox's init died
// on its own: under gVisor, the sentry's crash report. It is read before
// the sandbox's state is removed; "" when there is none.
type CrashReporter interface {
	CrashReport(id string) string
}

// RootWriter is the optional ability to read and write files of a
// sandbox's root filesystem from the host while it is made, resolved
// inside that root (a symlink never leads out of it) and owned by the
// sandbox's root user. A fresh create writes the egress CA and resolver
// this way from its BeforeStart hook, when nothing but the agent runs in
// the sandbox and nobody has asked the agent anything yet, instead of
// through the agent once it answers.
type RootWriter interface {
	// ReadRootFile reads at most max bytes of the regular file at path
	// (errdefs.ErrNotFound: there is none).
	ReadRootFile(id, path string, max int64) ([]byte, error)
	// WriteRootFile replaces the file at path with data, making missing
	// parent directories.
	WriteRootFile(id, path string, data []byte) error
}

// InitWatcher is the optional ability to report the end of a sandbox's
// init as it happens, and what its agent last logged: a create whose
// agent dies while starting fails then, naming why, instead of at the
// ready timeout.
type InitWatcher interface {
	// InitExited's channel is closed once the init has exited (at once
	// if it is not running); watching ends with ctx.
	InitExited(ctx context.Context, id string) (<-chan struct{}, error)
	AgentLogTail(id string) string
}

// Network is what the Manager needs from the per-sandbox network layer
// (hostnet.Network, which the daemon adapts to this Attachment so the
// Manager links no netlink or nftables).
type Network interface {
	// AttachTo wires the sandbox's network into the namespace at nsPath.
	AttachTo(ctx context.Context, id, nsPath string) (Attachment, error)
	Lookup(ctx context.Context, id string) (Attachment, error)
	Detach(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
}

// Attachment is one sandbox's network as the Network layer found or made
// it: its netns, the host end of its veth, and the two addresses of the
// link (the host's is the sandbox's gateway, resolver and egress proxy).
type Attachment struct {
	ID        string
	NetNSPath string
	HostIface string
	HostIP    netip.Addr
	SandboxIP netip.Addr
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

// Connector is a Prober that can also open a connection to an agent
// ahead of its first request and keep it for that request
// (agentlink.Link): the warm pool connects to each sandbox it fills.
type Connector interface {
	Connect(ctx context.Context, addr string) error
}

// Starter runs a template's start command in a new sandbox and waits for
// its ready check (the daemon's, over the agent). Start returns once the
// check passed (or at once without one); it fails with
// errdefs.ErrDeadlineExceeded naming the check when the check's timeout
// passes, errdefs.ErrFailedPrecondition when the start command ends first.
type Starter interface {
	Start(ctx context.Context, addr, token string, d template.Defaults) error
}
