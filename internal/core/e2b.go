package core

import "time"

// The E2B-compatible layer's records: its API keys and what only it knows
// about a sandbox. They live here with the core's so internal/e2bcompat,
// like the Manager, links no database.

// APIKey is one API key. Only a hash of the secret is stored; the secret is
// shown once, when the key is created.
type APIKey struct {
	ID   string
	Name string
	// Hash is the hex sha256 of the full secret: the keys are 128 bits of
	// randomness, so a fast hash is enough (no dictionary to guess from).
	Hash string
	// Mask is a recognisable, non-secret fragment ("e2b_…1a2b") for listings.
	Mask      string
	CreatedAt time.Time
	RevokedAt time.Time
	// Admin keys see and manage every sandbox and key; others only their
	// own sandboxes.
	Admin bool
	// Quota bounds what the key's sandboxes may hold at once.
	Quota Quota
}

// Quota bounds a key's live sandboxes; zero fields are unbounded.
type Quota struct {
	MaxSandboxes   int64
	MaxCPUMillis   int64
	MaxMemoryBytes int64
	// MaxTimeout bounds each sandbox's lifetime.
	MaxTimeout time.Duration
	// MaxVolumeBytes bounds the sizes of the key's volumes together.
	MaxVolumeBytes int64
}

// E2BSandbox holds what only the E2B-compatible API knows about a sandbox.
type E2BSandbox struct {
	ID string
	// TrafficToken, when set, is required on preview-host traffic
	// (E2B's allowPublicTraffic: false).
	TrafficToken string
	// Network is the E2B network config as JSON, echoed by getInfo.
	Network string
}
