package runc

import (
	"fmt"
	"path/filepath"

	"github.com/berth-sandbox/berth/errdefs"
)

// What a snapshot needs from the runtime (internal/sandbox/snapshot.go):
// where a sandbox's writable layer is on the host, while its disk is
// mounted, and the layers it sits on.

// UpperDir is the host path of sandbox id's writable layer (the overlay's
// upper dir on its disk image). It exists only while the sandbox's disk
// is mounted: running, or frozen by Pause.
func (r *Runtime) UpperDir(id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if !r.rootfsMounted(id) {
		return "", fmt.Errorf("sandbox %s: its disk is not mounted: %w", id, errdefs.ErrFailedPrecondition)
	}
	return filepath.Join(r.diskDir(id), "upper"), nil
}

// Layers returns the read-only layers sandbox id was created on, lowest
// first.
func (r *Runtime) Layers(id string) ([]string, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	return r.readLayers(id)
}
