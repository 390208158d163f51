package types

import "time"

// Volume is a named, size-capped filesystem that outlives sandboxes
// (POST /v1/volumes): sandboxes bind it at a path of their own, several at
// once.
type Volume struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// SizeBytes is its capacity; a full volume is ENOSPC inside it.
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Sandboxes are those that bind it now, and UsedBytes what its files
	// take (get only).
	Sandboxes []string `json:"sandboxes,omitempty"`
	UsedBytes int64    `json:"used_bytes,omitempty"`
}

// VolumeRequest is the body of POST /v1/volumes. Size is a size string
// ("10G", "512M"); empty takes the daemon's default.
type VolumeRequest struct {
	Name string `json:"name"`
	Size string `json:"size,omitempty"`
}

// VolumeList is the answer of GET /v1/volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// VolumeMount binds a volume into a sandbox (CreateRequest.Volumes,
// Sandbox.Volumes). In a request Volume is the volume's ID or name.
type VolumeMount struct {
	Volume string `json:"volume"`
	// Name is the volume's name (answers only).
	Name string `json:"name,omitempty"`
	// Path is where it appears in the sandbox: absolute, not on /proc,
	// /sys or /dev.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeEntry is one file in a volume (GET /v1/volumes/{id}/list, the
// answers of its writes, and E2B's VolumeEntryStat, whose fields these
// are). Owners are the sandboxes' uids and gids.
type VolumeEntry struct {
	Name string `json:"name"`
	// Type is "file", "directory", "symlink" or "unknown".
	Type string `json:"type"`
	// Path is its path in the volume, from its root ("/a/b").
	Path  string    `json:"path"`
	Size  int64     `json:"size"`
	Mode  uint32    `json:"mode"`
	UID   uint32    `json:"uid"`
	GID   uint32    `json:"gid"`
	Atime time.Time `json:"atime"`
	Mtime time.Time `json:"mtime"`
	Ctime time.Time `json:"ctime"`
	// Target is a symlink's target, as written.
	Target string `json:"target,omitempty"`
}

// VolumeListing is the answer of GET /v1/volumes/{id}/list.
type VolumeListing struct {
	Entries []VolumeEntry `json:"entries"`
}
