package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/proto/envd"
)

// Bounds of CreateRequest.Metadata. Metadata is free-form (E2B's SDKs allow
// any string keys), so it is bounded by size rather than by syntax.
const (
	maxMetadataEntries = 64
	maxMetadataKey     = 256
	maxMetadataValue   = 4096
)

// validateOwned checks the fields a request carries for multi-tenant front
// ends: Owner (an API key ID, set by the API layer, never by a client),
// Metadata and User (the agent's default user).
func validateOwned(req *CreateRequest) error {
	if len(req.Metadata) > maxMetadataEntries {
		return &FieldError{Field: "metadata", Err: fmt.Errorf("metadata: %d entries, at most %d: %w", len(req.Metadata), maxMetadataEntries, errdefs.ErrInvalidArgument)}
	}
	for k, v := range req.Metadata {
		if k == "" || len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return &FieldError{Field: "metadata", Err: fmt.Errorf("metadata: invalid entry %q (keys 1-%d bytes, values at most %d bytes): %w", k, maxMetadataKey, maxMetadataValue, errdefs.ErrInvalidArgument)}
		}
	}
	if req.User != "" && !types.ValidUserName(req.User) {
		return &FieldError{Field: "user", Err: fmt.Errorf("user: invalid user name %q: %w", req.User, errdefs.ErrInvalidArgument)}
	}
	return nil
}

// agentArgs are the agent's arguments for a sandbox: its listen address and,
// when the sandbox has one, the default user for requests that name none.
func agentArgs(rec core.Sandbox) []string {
	args := []string{"--listen", "0.0.0.0:" + strconv.Itoa(envd.Port)}
	if rec.User != "" {
		args = append(args, "--user", rec.User)
	}
	if rec.Isolation == core.IsolationGVisor {
		// This sentry's PTYs do not turn ^C, ^\ and ^Z into signals
		// (gVisor before 2023-02): the agent does (internal/agent/ptysig.go).
		args = append(args, "--pty-signals")
	}
	if agentPids(rec) {
		args = append(args, "--pids-max", strconv.FormatInt(rec.PidsLimit, 10))
	}
	return args
}

// agentPids reports whether a sandbox's agent holds its processes to the
// pids limit itself (runtime.Spec.AgentPids): under gVisor, whose host
// cgroup counts the sentry's threads and ptrace stubs, not the sandbox's
// tasks.
func agentPids(rec core.Sandbox) bool {
	return rec.Isolation == core.IsolationGVisor && rec.PidsLimit > 0
}

// workloadPids reports whether a sandbox's processes get a cgroup of their
// own below the sandbox's, so its agent keeps room for its threads when
// they fill their limit (runtime.Spec.WorkloadPids): under runc; gVisor's
// agent holds its processes itself (agentPids).
func workloadPids(rec core.Sandbox) bool {
	return rec.Isolation != core.IsolationGVisor && rec.PidsLimit > 0
}

// OwnedListOptions filter ListOwned.
type OwnedListOptions struct {
	// Owner must match exactly; "" selects sandboxes without an owner.
	Owner string
	// AnyOwner lists every owner's sandboxes (an admin's view).
	AnyOwner bool
	// Metadata entries must all be present with equal values.
	Metadata map[string]string
	// States, when set, restrict the states.
	States []string
}

// ListOwned returns the sandboxes of one owner matching opts, oldest first.
func (m *Manager) ListOwned(ctx context.Context, opts OwnedListOptions) ([]Sandbox, error) {
	all, err := m.List(ctx, ListOptions{States: opts.States})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(s Sandbox) bool {
		if !opts.AnyOwner && s.Owner != opts.Owner {
			return true
		}
		for k, v := range opts.Metadata {
			if got, ok := s.Metadata[k]; !ok || got != v {
				return true
			}
		}
		return false
	}), nil
}
