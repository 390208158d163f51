package daemon

import (
	"context"

	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/volume"
)

// volumeService serves the native and E2B volume APIs from the Manager's
// volumes, opening a volume's files (mounted on the host for the request)
// in the canonical uid range.
type volumeService struct {
	*sandbox.Manager
	uidBase uint32
}

func (v volumeService) VolumeFiles(ctx context.Context, id string) (*volume.Files, func(), error) {
	root, release, err := v.MountVolume(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	f, err := volume.OpenFiles(root, v.uidBase)
	if err != nil {
		release()
		return nil, nil, err
	}
	return f, func() { f.Close(); release() }, nil
}
