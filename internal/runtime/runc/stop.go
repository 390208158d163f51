package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/diskimg"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Stop ends every process of sandbox id and releases what only a running
// sandbox needs (the runc container, its cgroups, the overlay and disk
// mounts and the loop device) but keeps its disk: StateDir/<id> with the
// disk image (the writable layer) and its uid range, for Start. It is
// idempotent, and safe on a sandbox a crash left half stopped. What a
// stopped sandbox holds on the host is a directory and a claim file,
// nothing in the kernel.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, err := os.Stat(r.dir(id)); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	start := time.Now()
	phases := phaseTimer{last: start}
	errs := r.endProcesses(ctx, id, &phases)
	// A sandbox made for a restore (PrepareRestore) is gone with them,
	// and so is a memory load still going on.
	for _, mark := range []string{r.preparedMark(id), r.loadingMark(id)} {
		if err := os.Remove(mark); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := r.unmountRootfs(ctx, id); err != nil {
		errs = append(errs, err)
	}
	phases.mark("unmount")
	r.log.Debug("sandbox stopped", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	return nil
}

// unmountRootfs unmounts everything under the sandbox's state dir and
// frees its loop device, leaving the disk image.
func (r *Runtime) unmountRootfs(ctx context.Context, id string) error {
	if err := diskimg.UnmountAll(ctx, r.dir(id)); err != nil {
		return err
	}
	if err := diskimg.DetachLoops(r.image(id)); err != nil {
		return err
	}
	// A process that was still dying when its mounts were detached (a
	// gofer on a loaded host) keeps the file system, and so the loop
	// device, until it is gone: a stopped sandbox holds neither, so wait
	// for it here rather than leave it to whoever comes next.
	if err := waitLoopsGone(r.image(id), loopsGoneLimit); err != nil {
		return fmt.Errorf("disk of sandbox %s: %w", id, err)
	}
	if mps, err := diskimg.MountsUnder(r.dir(id)); err != nil || len(mps) > 0 {
		return fmt.Errorf("mounts left under %s: %v (%v)", r.dir(id), mps, err)
	}
	return nil
}

// Start runs the agent again in a sandbox Stop left: the disk image is
// mounted again on the layers the sandbox was created with (spec.Layers
// is not used for the root filesystem: the writable layer belongs to the
// first ones) and the agent starts as in Create, BeforeStart included.
// Its processes start afresh; its files are what they were. On failure
// the sandbox is left stopped, for the caller to retry or destroy.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (err error) {
	start := time.Now()
	phases := phaseTimer{last: start}
	if err := r.validate(spec); err != nil {
		return err
	}
	id := spec.ID
	if _, err := os.Stat(r.image(id)); err != nil {
		return fmt.Errorf("start sandbox %s: no disk: %w", id, errdefs.ErrNotFound)
	}
	slot, ok := r.slots.lookup(r.dir(id))
	if !ok {
		return fmt.Errorf("start sandbox %s: no uid range recorded: %w", id, errdefs.ErrNotFound)
	}
	if st, ok, err := r.state(ctx, id); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	} else if ok && st.Status != "stopped" {
		return fmt.Errorf("start sandbox %s: it is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	// Whatever a crash left half way (a stale container record, mounts):
	// Stop is idempotent.
	if err := r.Stop(ctx, id); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	defer func() {
		if err == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if serr := r.Stop(cctx, id); serr != nil {
			err = errors.Join(err, fmt.Errorf("undo: %w", serr))
		}
	}()
	uid := hostBase(slot)
	if err := r.remountRootfs(id, uid); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	phases.mark("mount")
	if err := r.run(ctx, spec, uid, nil, &phases); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	r.log.Debug("sandbox started", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
	return nil
}

// layersFile, in a sandbox's state dir, lists the layers its writable
// layer was made on (JSON): a sandbox started again must get the same.
const layersFile = "layers.json"

func (r *Runtime) writeLayers(id string, layers []string) error {
	b, err := json.Marshal(layers)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.dir(id), layersFile), b, 0o600)
}

func (r *Runtime) readLayers(id string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(r.dir(id), layersFile))
	if err != nil {
		return nil, fmt.Errorf("layers of sandbox %s: %w", id, err)
	}
	var layers []string
	if err := json.Unmarshal(b, &layers); err != nil || len(layers) == 0 {
		return nil, fmt.Errorf("layers of sandbox %s: %q is not a layer list: %w", id, b, errdefs.ErrFailedPrecondition)
	}
	for _, l := range layers {
		if !filepath.IsAbs(l) {
			return nil, fmt.Errorf("layers of sandbox %s: %q is not absolute: %w", id, l, errdefs.ErrFailedPrecondition)
		}
	}
	return layers, nil
}

// rootfsMounted reports whether the sandbox's overlay is mounted.
func (r *Runtime) rootfsMounted(id string) bool {
	mps, err := diskimg.MountsUnder(r.rootfs(id))
	return err == nil && slices.Contains(mps, r.rootfs(id))
}

// remountRootfs mounts a stopped sandbox's disk image and its overlay
// again, on the layers it was created with, as prepareRootfs first made
// them.
func (r *Runtime) remountRootfs(id string, uid uint32) error {
	layers, err := r.readLayers(id)
	if err != nil {
		return err
	}
	disk, rootfs := r.diskDir(id), r.rootfs(id)
	for _, d := range []string{disk, rootfs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	// A mount of the image that Stop could only detach lazily (a dying
	// process still held it) keeps its file system alive, bound to its
	// loop device, until that process is gone; mounting the image again
	// meanwhile would run two ext4 instances on one image, the new one
	// blind to what the old one has not written back.
	if err := waitLoopsGone(r.image(id), loopsGoneLimit); err != nil {
		return fmt.Errorf("disk of sandbox %s: %w", id, err)
	}
	if err := diskimg.Mount(r.image(id), disk, diskimg.Scratch); err != nil {
		return err
	}
	upper, work := filepath.Join(disk, "upper"), filepath.Join(disk, "work")
	for _, d := range []string{upper, work} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("disk of sandbox %s has no %s: %w", id, filepath.Base(d), errdefs.ErrFailedPrecondition)
		}
	}
	// A crash may have left the empty mount points of the idmapped
	// views; Stop made sure nothing is mounted under the state dir.
	if err := os.RemoveAll(filepath.Join(r.dir(id), "lower")); err != nil {
		return err
	}
	ns, err := r.idmaps.get(r.cfg.UIDBase, uid, r.cfg.UIDCount)
	if err != nil {
		return err
	}
	lowers, err := mountIdmappedLayers(layers, filepath.Join(r.dir(id), "lower"), ns)
	if err != nil {
		return err
	}
	err = mountOverlay(lowers, upper, work, rootfs)
	if derr := detachLayers(lowers); err == nil {
		err = derr
	}
	return err
}

// loopsGoneLimit bounds the wait for a dying process to let go of a
// sandbox's disk: generous, for a host under heavy load.
const loopsGoneLimit = 2 * time.Minute

// waitLoopsGone waits until no loop device is bound to image any more,
// up to limit.
func waitLoopsGone(image string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		devs := diskimg.LoopsBacking(image)
		if len(devs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still attached to %v %s after Stop: %w", devs, limit, errdefs.ErrUnavailable)
		}
		// Poll: the kernel unbinds the device when its last user goes
		// (detaching again covers a device left without autoclear).
		_ = diskimg.DetachLoops(image)
		time.Sleep(50 * time.Millisecond)
	}
}

// SyncDisk puts stopped sandbox id's writable layer (its disk image) on
// the disk itself, so its pause outlives a host restart
// (sandbox.DiskSyncer). Its file system, mounted without write barriers
// (diskimg.Scratch), was unmounted at Stop without flushing the host's
// disk: what it wrote is in the image file's page cache until this.
func (r *Runtime) SyncDisk(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	f, err := os.OpenFile(r.image(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync disk of sandbox %s: %w", id, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync disk of sandbox %s: %w", id, err)
	}
	return nil
}
