package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// Disk room for memory images.
//
// A memory pause writes the sandbox's memory to Config.CheckpointDir, and
// runsc ends the sandbox when that save fails: a pause that ran out of
// disk half way would lose every process of the work site. So a memory
// image is begun only where it fits. Its size is estimated from the
// sandbox's memory as its runtime counts it (under gVisor the sentry's
// own count, which bounds the image's pages), plus a margin for the
// kernel state and for growth since the count, and set against the
// directory's free space less what images being written now have
// claimed. One that does not fit is refused before anything is touched,
// with errNoImageRoom (resource_exhausted): an explicit or idle pause and
// a snapshot or fork leave the sandbox running; a pause at the deadline
// keeps the disk instead (a filesystem pause), which beats its
// alternative there, the sandbox's destruction.

// errNoImageRoom says a memory image would not fit on its disk.
var errNoImageRoom = errors.New("no disk room for the memory image")

// imageState is what memory images being written have claimed.
type imageState struct {
	mu      sync.Mutex
	claimed int64
}

// imageSlack is added to a memory image's estimate: its kernel state
// file (hundreds of KiB), and what the sandbox may have grown since its
// runtime last counted (the sentry's count is kept for a few seconds).
const imageSlack = 64 << 20

// memorySaver is a Checkpointer's optional way to say whether its
// Checkpoint saves memory at all (runc.Runtime: under gVisor); one that
// cannot is asked for no room.
type memorySaver interface{ SavesMemory() bool }

// savesMemory reports whether rt's checkpoints hold memory images.
func savesMemory(rt Runtime) bool {
	ms, ok := rt.(memorySaver)
	return !ok || ms.SavesMemory()
}

// diskFree is the space an unprivileged writer may still use in dir's
// file system (Config.DiskFree's default).
func diskFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// claimImageRoom claims room in dir for a memory image of sandbox e, or
// says why there is none (errNoImageRoom). release gives the claim back
// once the image is written or given up. Without a count of the
// sandbox's memory there is no estimate, and no claim.
func (m *Manager) claimImageRoom(ctx context.Context, e *entry, dir string) (release func(), err error) {
	sr, ok := m.runtimeOf(e.rec).(StatsReader)
	if !ok {
		return func() {}, nil
	}
	st, err := sr.Stats(ctx, e.id)
	if err != nil || st.MemoryBytes <= 0 {
		m.log.Debug("image_room_unknown", "sandbox_id", e.id, "err", err)
		return func() {}, nil
	}
	need := st.MemoryBytes + st.MemoryBytes/8 + imageSlack
	free, err := m.cfg.DiskFree(dir)
	if err != nil {
		return nil, err
	}
	m.images.mu.Lock()
	defer m.images.mu.Unlock()
	if avail := free - m.images.claimed; need > avail {
		return nil, fmt.Errorf("its memory image needs about %d MiB and %s has %d MiB free (%d MiB more are claimed by images being written); free disk space there or destroy paused sandboxes: %w: %w",
			need>>20, dir, free>>20, m.images.claimed>>20, errNoImageRoom, errdefs.ErrResourceExhausted)
	}
	m.images.claimed += need
	return func() {
		m.images.mu.Lock()
		m.images.claimed -= need
		m.images.mu.Unlock()
	}, nil
}
