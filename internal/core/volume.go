package core

import (
	"context"
	"time"
)

// Volume is one volume's persisted record: a named, size-capped
// filesystem that outlives the sandboxes it is mounted in.
type Volume struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Owner is the ID of the API key that created it ("" for the
	// operator's); a key sees only its own.
	Owner     string    `json:"owner,omitempty"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Token authorizes requests for the volume's files alone (E2B's
	// volume content API); shown only to its owner.
	Token string `json:"token,omitempty"`
}

// VolumeMount is a volume bound into a sandbox (Sandbox.Volumes).
type VolumeMount struct {
	// Volume is the volume's ID; Name its name when the sandbox was made.
	Volume string `json:"volume"`
	Name   string `json:"name"`
	// Path is where it appears in the sandbox.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeStore persists volume records; the SQLite store implements it.
// GetVolume and DeleteVolume of an unknown ID, and VolumeByName of an
// unknown name, return an error wrapping errdefs.ErrNotFound; PutVolume of
// a new volume whose name its owner already has returns one wrapping
// errdefs.ErrAlreadyExists.
type VolumeStore interface {
	PutVolume(ctx context.Context, v Volume) error
	GetVolume(ctx context.Context, id string) (Volume, error)
	VolumeByName(ctx context.Context, owner, name string) (Volume, error)
	// ListVolumes returns every volume, oldest first.
	ListVolumes(ctx context.Context) ([]Volume, error)
	DeleteVolume(ctx context.Context, id string) error
}
