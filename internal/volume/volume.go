// Package volume keeps volumes' filesystems on the host: one sparse ext4
// image per volume (a journal, a size cap: a full volume is an ENOSPC in
// it, never a full host disk), owned by the runtimes' canonical uid range
// so every sandbox sees its own uids there through an idmapped bind.
//
// The image is mounted on the host only while something needs it there: a
// runtime binding it into a sandbox (the sandbox then holds its own bind)
// or a file operation. Whether a sandbox still holds it is the kernel's to
// say: the loop device stays bound to the image while any mount of its
// filesystem exists, in any mount namespace, and a new host mount reuses
// that device (diskimg.MountShared), so one image is never mounted as two
// filesystems. Nothing of a volume is mounted on the host when no sandbox
// and no operation uses it. Records are the sandbox Manager's; this
// package only keeps disks.
package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/diskimg"
)

// Disks keeps the volumes' images under one directory.
type Disks struct {
	dir     string
	uidBase uint32
	log     *slog.Logger

	mu    sync.Mutex
	disks map[string]*disk
}

// disk is one volume's host mount: held while users > 0.
type disk struct {
	mu    sync.Mutex
	users int
}

// New returns the disks kept under dir, whose files are owned by the
// canonical range starting at uidBase (its uid 0 is a sandbox's root).
func New(dir string, uidBase uint32, log *slog.Logger) (*Disks, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	d := &Disks{dir: dir, uidBase: uidBase, log: log, disks: map[string]*disk{}}
	// Mounts a killed daemon left on the host (a sandbox's own bind
	// keeps its filesystem; these are only the host's).
	if err := diskimg.UnmountAll(context.Background(), dir); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	return d, nil
}

func (d *Disks) image(id string) string { return filepath.Join(d.dir, id, "volume.img") }
func (d *Disks) mnt(id string) string   { return filepath.Join(d.dir, id, "mnt") }

func (d *Disks) get(id string) *disk {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.disks[id]
	if !ok {
		k = &disk{}
		d.disks[id] = k
	}
	return k
}

// checkID keeps IDs to one path element of the daemon's own making.
func checkID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("volume id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return fmt.Errorf("volume id %q: %w", id, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Make makes volume id's image of size bytes. Its root directory is
// owned by the sandbox's root and open to every user (mode 0777), as a
// volume is shared by sandboxes whose users differ.
func (d *Disks) Make(ctx context.Context, id string, size int64) (err error) {
	if err := checkID(id); err != nil {
		return err
	}
	dir := filepath.Join(d.dir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("volume %s: %w", id, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("volume %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir) // err says why
		}
	}()
	if err := diskimg.Make(ctx, d.image(id), size, diskimg.Format{Journal: true, RootUID: d.uidBase, RootGID: d.uidBase}); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	root, release, err := d.Mount(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	// mkfs's lost+found belongs to host root: nothing a sandbox could use.
	if err := os.Remove(filepath.Join(root, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return os.Chmod(root, 0o777)
}

// Mount mounts volume id on the host and returns its root, there until
// release is called (once). A runtime binds it into a sandbox from there;
// the sandbox's bind outlives the release.
func (d *Disks) Mount(ctx context.Context, id string) (root string, release func(), err error) {
	if err := checkID(id); err != nil {
		return "", nil, err
	}
	if _, err := os.Stat(d.image(id)); err != nil {
		return "", nil, fmt.Errorf("volume %s has no disk: %w", id, errdefs.ErrNotFound)
	}
	k := d.get(id)
	k.mu.Lock()
	defer k.mu.Unlock()
	mnt := d.mnt(id)
	if k.users == 0 {
		if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return "", nil, fmt.Errorf("volume %s: %w", id, err)
		}
		if err := diskimg.MountShared(d.image(id), mnt); err != nil {
			return "", nil, fmt.Errorf("volume %s: %w", id, err)
		}
	}
	k.users++
	var once sync.Once
	return mnt, func() { once.Do(func() { d.release(id, k) }) }, nil
}

func (d *Disks) release(id string, k *disk) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.users--
	if k.users > 0 {
		return
	}
	if err := diskimg.UnmountOne(context.Background(), d.mnt(id)); err != nil {
		d.log.Warn("volume_unmount", "volume_id", id, "err", err)
	}
}

// Used reports how many bytes volume id's files take (its filesystem's
// used blocks, its own bookkeeping included).
func (d *Disks) Used(ctx context.Context, id string) (int64, error) {
	root, release, err := d.Mount(ctx, id)
	if err != nil {
		return 0, err
	}
	defer release()
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return 0, fmt.Errorf("volume %s: %w", id, err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// InUse reports whether volume id's filesystem is mounted anywhere: on
// the host or in a sandbox.
func (d *Disks) InUse(id string) bool {
	return checkID(id) == nil && len(diskimg.LoopsBacking(d.image(id))) > 0
}

// settleTime bounds how long Remove waits for a volume's last mount to
// go: a sandbox destroyed just before drops its mount namespace, and with
// it its bind, as its last process is reaped.
const settleTime = 2 * time.Second

// settled reports whether volume id's filesystem is mounted nowhere,
// waiting up to settleTime for it.
func (d *Disks) settled(ctx context.Context, id string) bool {
	deadline := time.Now().Add(settleTime)
	for d.InUse(id) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond) // poll: the kernel sends no event for it
	}
	return true
}

// Remove deletes volume id's disk; while its filesystem is mounted
// anywhere it is refused with errdefs.ErrFailedPrecondition.
func (d *Disks) Remove(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	k := d.get(id)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.users > 0 || !d.settled(ctx, id) {
		return fmt.Errorf("volume %s is mounted in a sandbox: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err := os.RemoveAll(filepath.Join(d.dir, id)); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	d.mu.Lock()
	delete(d.disks, id)
	d.mu.Unlock()
	return nil
}

// IDs lists the volumes with a disk here.
func (d *Disks) IDs() ([]string, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && checkID(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
