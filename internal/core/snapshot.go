package core

import (
	"context"
	"time"
)

// What a snapshot holds (Snapshot.Kind).
const (
	// SnapshotFilesystem: the sandbox's writable layer plus its
	// environment, labels, limits, network policy and template. A sandbox
	// made from it starts its agent afresh on those files.
	SnapshotFilesystem = "filesystem"
	// SnapshotMemory: the writable layer and a checkpoint of every
	// process and its memory.
	SnapshotMemory = "memory"
)

// Snapshot is one snapshot's persisted record: what a new sandbox made
// from it gets.
type Snapshot struct {
	ID   string
	Name string
	// Source is the ID of the sandbox it was taken of.
	Source    string
	Kind      string
	Template  string
	Isolation string
	Owner     string
	// Limits of the source sandbox.
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
	PidsLimit   int64
	Env         map[string]string
	Labels      map[string]string
	User        string
	// AllowSudo is the source's (core.Sandbox.AllowSudo); a record
	// written before it was kept reads as false.
	AllowSudo bool
	// Policy is the source's egress policy as JSON (policy.Policy); ""
	// for none.
	Policy string
	// BaseLayers are the read-only layers its own layer sits on, lowest
	// first, as the source had them: the template's, then those of a
	// cached environment or of the snapshots the source was made from.
	BaseLayers []string
	// SizeBytes is what the snapshot's own files take (its layer, and
	// its checkpoint for a memory snapshot).
	SizeBytes int64
	// AgentToken is the access token the source's agent held when a
	// memory snapshot was taken: a sandbox made from the snapshot starts
	// with that agent, memory and all, and the daemon hands it the new
	// sandbox's own token with it. Never shown by the API.
	AgentToken string `json:",omitempty"`
	// Volumes are the source's volumes: a sandbox made from the
	// snapshot that names none binds them, and one from a memory
	// snapshot binds exactly them (its processes had them open).
	Volumes []VolumeMount `json:",omitempty"`
	// Fork marks a snapshot made by a fork: it is removed once no
	// sandbox or snapshot uses it.
	Fork      bool
	CreatedAt time.Time
}

// SnapshotStore persists snapshot records; the SQLite store implements
// it. GetSnapshot and DeleteSnapshot of an unknown ID return an error
// wrapping errdefs.ErrNotFound.
type SnapshotStore interface {
	PutSnapshot(ctx context.Context, s Snapshot) error
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots returns every snapshot, oldest first.
	ListSnapshots(ctx context.Context) ([]Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}
