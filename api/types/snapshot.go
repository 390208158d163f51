package types

import "time"

// What a snapshot holds (Snapshot.Kind).
const (
	// SnapshotFilesystem: the sandbox's files (its writable layer) plus
	// its template, isolation, limits, env, labels, user, network policy
	// and allow_sudo; a sandbox made from it starts its processes afresh.
	SnapshotFilesystem = "filesystem"
	// SnapshotMemory: the files and every process with its memory; a
	// sandbox made from it carries on where its source was, with an
	// identity of its own (ID, token, address, hostname).
	SnapshotMemory = "memory"
)

// Snapshot is a snapshot of a sandbox (GET /v1/snapshots/{id}).
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Source is the sandbox it was taken of.
	Source    string            `json:"source"`
	Kind      string            `json:"kind"`
	Template  string            `json:"template"`
	Isolation string            `json:"isolation,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// AllowSudo is the source's: a sandbox made from the snapshot gets it
	// unless its create says otherwise.
	AllowSudo bool `json:"allow_sudo,omitempty"`
	// SizeBytes is what the snapshot's own files take on disk (it shares
	// its template's layers).
	SizeBytes int64 `json:"size_bytes"`
	// Fork marks a snapshot a fork made; it goes with its last copy.
	Fork bool `json:"fork,omitempty"`
	// Nodes, on a Kubernetes gateway, are the Berth nodes that hold it,
	// the one it was taken on first (its copies' after: the gateway's
	// --snapshot-copies).
	Nodes     []string  `json:"nodes,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotList is the answer of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// SnapshotRequest is the optional body of POST
// /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// ForkRequest is the optional body of POST /v1/sandboxes/{id}/fork: Count
// copies (default 1).
type ForkRequest struct {
	Count int `json:"count,omitempty"`
}

// ForkResult is the answer of a fork: the copies, and the snapshot they
// were made from.
type ForkResult struct {
	Snapshot  Snapshot  `json:"snapshot"`
	Sandboxes []Sandbox `json:"sandboxes"`
}
