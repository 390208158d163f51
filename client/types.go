package client

import "github.com/berth-sandbox/berth/api/types"

// The wire types are the daemon's own (package api/types); these aliases
// keep the SDK's names.

// Sandbox states, as the daemon reports them.
const (
	StateCreating = types.StateCreating
	StateReady    = types.StateReady
	StatePaused   = types.StatePaused
	StatePausing  = types.StatePausing
	StateResuming = types.StateResuming
	StateStopping = types.StateStopping
	StateStopped  = types.StateStopped
	StateFailed   = types.StateFailed
	StateLost     = types.StateLost
)

// What a Kubernetes gateway does with a sandbox whose node is lost
// (CreateRequest.OnNodeLost).
const (
	OnNodeLostFail     = types.OnNodeLostFail
	OnNodeLostRecreate = types.OnNodeLostRecreate
)

// CreateRequest asks for a new sandbox. Every field is optional; the daemon
// fills defaults (template "base", 1 CPU, "512M" memory, "2G" disk, "10m"
// timeout). Sizes are strings such as "512M" or "1.5G"; Timeout is a Go
// duration string such as "90s".
type CreateRequest = types.CreateRequest

// Usage is what a sandbox has consumed so far.
type Usage = types.Usage

// Sandbox is a sandbox as the daemon describes it (types.Sandbox). A
// Sandbox returned by a Client (or made by Client.Sandbox) is also a handle
// for the data plane: Exec, files, PTYs.
type Sandbox struct {
	types.Sandbox

	c    *Client
	user string
}

// SandboxNetwork is a sandbox's network as the host sees it.
type SandboxNetwork = types.SandboxNetwork

// Event types.
const (
	EventCreated        = types.EventCreated
	EventReady          = types.EventReady
	EventAdopted        = types.EventAdopted
	EventOOM            = types.EventOOM
	EventTimeoutChanged = types.EventTimeoutChanged
	EventDeadline       = types.EventDeadline
	EventDestroyed      = types.EventDestroyed
	EventFailed         = types.EventFailed
	EventNetworkPolicy  = types.EventNetworkPolicy
	EventSetupStarted   = types.EventSetupStarted
	EventSetupStep      = types.EventSetupStep
	EventSetupDone      = types.EventSetupDone
	EventSetupCached    = types.EventSetupCached
	EventPaused         = types.EventPaused
	EventResumed        = types.EventResumed
	EventPauseFailed    = types.EventPauseFailed
	EventResumeReady    = types.EventResumeReady
)

// What a paused sandbox kept (Sandbox.Pause), and what a deadline does
// (CreateRequest.OnTimeout).
const (
	PauseMemory     = types.PauseMemory
	PauseFilesystem = types.PauseFilesystem
	OnTimeoutKill   = types.OnTimeoutKill
	OnTimeoutPause  = types.OnTimeoutPause
)

// Event is one entry of a sandbox's lifecycle log.
type Event = types.Event

// Template is a root filesystem sandboxes start from.
type Template = types.Template

// TemplateCreateRequest makes a template from an image (CreateTemplateFrom).
type TemplateCreateRequest = types.TemplateCreateRequest

// ReadyCheck says when a sandbox of a template with a start command is ready.
type ReadyCheck = types.ReadyCheck

// TemplatePruneResult says what a template prune removed.
type TemplatePruneResult = types.TemplatePruneResult

// WarmPool is a template's pool of ready sandboxes.
type WarmPool = types.WarmPool

// Health is the daemon's health answer.
type Health = types.Health

// IsolationLevel is one isolation level as the daemon offers it.
type IsolationLevel = types.IsolationLevel

// Isolation levels (CreateRequest.Isolation).
const (
	IsolationRunc   = types.IsolationRunc
	IsolationGVisor = types.IsolationGVisor
)

// ListOptions filters List. Every label must match (AND); an empty State
// matches every state.
type ListOptions struct {
	Labels map[string]string
	State  string
}
