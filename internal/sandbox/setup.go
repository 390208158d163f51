package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/policy"
)

// SetupFunc customises a sandbox while it is being created: it runs once
// the agent answers and before the sandbox turns ready, while the create
// holds the sandbox's op lock, under a budget of the sandbox's whole
// timeout that a kill cancels. An error fails the create, which tears the
// sandbox down and records the error as its reason. Task workspaces
// (internal/workspace) clone and set up a repository this way.
type SetupFunc func(ctx context.Context, h *SetupHandle) error

// SetupHandle is what a SetupFunc may do with the sandbox being made. It is
// valid only during the call.
type SetupHandle struct {
	m *Manager
	e *entry
}

// ID is the sandbox's ID.
func (h *SetupHandle) ID() string { return h.e.rec.ID }

// Template is the name of the template the sandbox was made from.
func (h *SetupHandle) Template() string { return h.e.rec.Template }

// Agent is the address and access token of the sandbox's agent.
func (h *SetupHandle) Agent() (addr, token string) {
	return agentAddr(h.e.att), h.e.rec.Token
}

// Deadline is when the sandbox's lifetime ends (as requested; the timer
// starts once it is ready).
func (h *SetupHandle) Deadline() time.Time { return h.e.rec.Deadline }

// Event records a lifecycle event of the sandbox.
func (h *SetupHandle) Event(ctx context.Context, typ, msg string) {
	h.m.event(ctx, h.e.rec.ID, typ, msg)
}

// SetPolicy switches the sandbox's egress policy (a setup phase's policy
// to the agent phase's, say).
func (h *SetupHandle) SetPolicy(ctx context.Context, p policy.Policy) error {
	if err := h.m.checkPolicy(p); err != nil {
		return err
	}
	return h.m.applyPolicy(ctx, h.e.rec.ID, p.Normalize())
}

// pauser is the runtime's optional ability to freeze a sandbox.
type pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// CanPause reports whether the runtime can freeze the sandbox.
func (h *SetupHandle) CanPause() bool {
	_, ok := h.m.runtimeOf(h.e.rec).(pauser)
	return ok
}

// Pause freezes the sandbox's processes (to copy its writable layer
// consistently); Resume thaws them. The sandbox stays creating throughout.
func (h *SetupHandle) Pause(ctx context.Context) error {
	p, ok := h.m.runtimeOf(h.e.rec).(pauser)
	if !ok {
		return fmt.Errorf("sandbox %s: the runtime cannot pause: %w", h.e.rec.ID, errdefs.ErrFailedPrecondition)
	}
	return p.Pause(ctx, h.e.rec.ID)
}

// Resume thaws what Pause froze.
func (h *SetupHandle) Resume(ctx context.Context) error {
	p, ok := h.m.runtimeOf(h.e.rec).(pauser)
	if !ok {
		return fmt.Errorf("sandbox %s: the runtime cannot pause: %w", h.e.rec.ID, errdefs.ErrFailedPrecondition)
	}
	return p.Resume(ctx, h.e.rec.ID)
}

// DefaultTemplate is the template a request that names none gets.
func (m *Manager) DefaultTemplate() string { return m.cfg.DefaultTemplate }
