package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A memory pause returns once the sandbox's checkpoint is complete and its
// CPU, memory and network are released. What a host restart needs besides
// (the image, the checkpoint's rename and the sandbox's writable layer on
// the disk itself rather than in the page cache or the disk's own cache)
// follows in the background, syncCheckpointAsync: the flushes it takes
// (130-740 ms on this project's VM for 256 MiB to 1 GiB) were most of
// what a pause spent besides runsc. A daemon restart needs none of it (the
// page cache outlives the daemon); a checkpoint whose flush had not ended
// when the host went down is refused (untrustedCheckpoint) rather than
// restored from what may be partial data.
//
// The flush waits a moment (Config.CheckpointFlushDelay) first: a resume
// soon after the pause then reads the image with the disk to itself (run
// at once, the flush held the disk while the restore read from it: 250 ms
// more per resume of 256 MiB on this project's VM), and the flush of a
// checkpoint already resumed from is skipped.

// Files a Manager keeps in a checkpoint directory besides the runtime's.
const (
	// bootIDFile holds the host's boot ID when the checkpoint was made.
	// It is written before the directory is renamed into place, so on a
	// file system that journals metadata in order (ext4, XFS) a
	// committed rename implies it exists; its bytes may still be lost
	// to a crash, which then reads as another boot.
	bootIDFile = ".berth-boot-id"
	// syncedFile says everything the checkpoint needs is on the disk.
	syncedFile = ".berth-synced"
)

// DiskSyncer is the runtime's optional ability to put a stopped sandbox's
// writable layer on the disk (runtime/runc: fsync of its disk image).
type DiskSyncer interface {
	SyncDisk(ctx context.Context, id string) error
}

// stampBoot records the current boot in checkpoint directory dir.
func (m *Manager) stampBoot(dir string) error {
	id, err := m.bootID()
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, bootIDFile), []byte(id+"\n"), 0o600)
}

// untrustedCheckpoint says why sandbox id's checkpoint must not be
// restored ("" when it may be): it was made in an earlier boot of the host
// and its flush never completed.
func (m *Manager) untrustedCheckpoint(id string) string {
	if m.checkpointSynced(id) {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(m.checkpointDir(id), bootIDFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Made by a daemon from before the background flush, which
		// synced the checkpoint before the pause returned.
		return ""
	case err != nil:
		return "paused sandbox's checkpoint cannot be checked: " + err.Error()
	}
	now, err := m.bootID()
	if err != nil {
		return "paused sandbox's checkpoint cannot be checked: boot id: " + err.Error()
	}
	if made := strings.TrimSpace(string(b)); made != now {
		return fmt.Sprintf("the host restarted before the paused sandbox's checkpoint reached the disk (made in boot %q, now %q): not restored from what may be partial data", made, now)
	}
	return ""
}

// checkpointSynced reports whether sandbox id's checkpoint was flushed.
func (m *Manager) checkpointSynced(id string) bool {
	_, err := os.Lstat(filepath.Join(m.checkpointDir(id), syncedFile))
	return err == nil
}

// syncCheckpointAsync flushes the checkpoint of sandbox id, paused with its
// memory, and its writable layer in rt, then marks the checkpoint synced.
// The directory is opened before this returns and marked through that
// descriptor, so a later checkpoint at the same path (after a resume and
// another pause) is never marked by this flush; one removed meanwhile (a
// resume or destroy) ends it with nothing marked.
//
// A removal of the checkpoint (a resume's, a destroy's) ends the flush
// first (takeFlush): the mark, made through the descriptor, would
// otherwise land in a directory being removed, renamed as a resumed
// sandbox's spent checkpoint is, and the removal fail on it ("directory
// not empty", seen in TestPauseResumeMany: a resume 1.9 s after the
// pause, and the flush's delay ran out during the removal).
func (m *Manager) syncCheckpointAsync(rt Runtime, id string) {
	dir, err := os.Open(m.checkpointDir(id))
	if err != nil {
		m.log.Warn("checkpoint_sync", "sandbox_id", id, "err", err)
		return
	}
	if !m.track() {
		_ = dir.Close()
		return
	}
	f := m.startFlush(id)
	go func() {
		defer m.wg.Done()
		defer m.flushDone(id, f)
		defer dir.Close()
		wait := time.NewTimer(m.cfg.CheckpointFlushDelay)
		defer wait.Stop()
		select {
		case <-m.life.Done():
			return // the next daemon start flushes it (adoptPause)
		case <-f.stop:
			return // its checkpoint is being removed
		case <-wait.C:
		}
		start := time.Now()
		if err := m.syncCheckpoint(rt, id, dir); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				// Resumed or destroyed meanwhile: nothing to keep.
				m.log.Debug("checkpoint_sync", "sandbox_id", id, "err", err)
				return
			}
			m.log.Warn("checkpoint_sync", "sandbox_id", id, "err", err)
			return
		}
		m.log.Debug("checkpoint_synced", "sandbox_id", id, "elapsed", time.Since(start))
	}()
}

// syncCheckpoint is syncCheckpointAsync's work: every file of the image
// (runsc writes them side by side, no subdirectories),
// the directory, its rename, the writable layer, then the mark.
func (m *Manager) syncCheckpoint(rt Runtime, id string, dir *os.File) error {
	dfd := int(dir.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return err
	}
	if st.Nlink == 0 {
		// Removed meanwhile (resumed, destroyed).
		return fmt.Errorf("checkpoint directory: %w", os.ErrNotExist)
	}
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := fsyncAt(dfd, name); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := dir.Sync(); err != nil {
		return err
	}
	if err := syncDir(m.cfg.CheckpointDir); err != nil {
		return err
	}
	if ds, ok := rt.(DiskSyncer); ok {
		if err := ds.SyncDisk(m.life, id); err != nil {
			return fmt.Errorf("writable layer: %w", err)
		}
	}
	fd, err := unix.Openat(dfd, syncedFile, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("mark synced: %w", err)
	}
	err = unix.Fsync(fd)
	_ = unix.Close(fd)
	if err != nil {
		return fmt.Errorf("mark synced: %w", err)
	}
	return dir.Sync()
}

// fsyncAt flushes regular file name in directory dfd, not following a
// symbolic link; anything else is left alone.
func fsyncAt(dfd int, name string) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil
		}
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	return unix.Fsync(fd)
}

// flush is a pending checkpoint flush: stop ends its wait, done closes
// once it has returned.
type flush struct {
	stop, done chan struct{}
	once       sync.Once
}

// startFlush registers the flush of sandbox id's checkpoint that is
// about to start, ending one still registered (there is none: a pause
// follows a resume, which ended it).
func (m *Manager) startFlush(id string) *flush {
	m.takeFlush(id).end()
	f := &flush{stop: make(chan struct{}), done: make(chan struct{})}
	m.flushMu.Lock()
	if m.flushes == nil {
		m.flushes = map[string]*flush{}
	}
	m.flushes[id] = f
	m.flushMu.Unlock()
	return f
}

// flushDone unregisters f, which has returned.
func (m *Manager) flushDone(id string, f *flush) {
	m.flushMu.Lock()
	if m.flushes[id] == f {
		delete(m.flushes, id)
	}
	m.flushMu.Unlock()
	close(f.done)
}

// takeFlush unregisters sandbox id's pending checkpoint flush and returns
// it (nil if none), for the removal of that checkpoint to end: taken when
// the checkpoint is renamed or removed, so a later pause's flush, which
// registers anew, is never the one ended.
func (m *Manager) takeFlush(id string) *flush {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	f := m.flushes[id]
	delete(m.flushes, id)
	return f
}

// end ends the flush and waits until it has returned: one still waiting
// for its delay returns at once, one already flushing finishes (its mark
// included) first. Nothing for nil.
func (f *flush) end() {
	if f == nil {
		return
	}
	f.once.Do(func() { close(f.stop) })
	<-f.done
}
