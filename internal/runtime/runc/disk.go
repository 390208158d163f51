package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The sandbox's writable layer lives in its own sparse ext4 image so that a
// full sandbox disk is an ENOSPC inside that image, never a full host disk.
// The image is attached to a loop device with LO_FLAGS_AUTOCLEAR, so the
// kernel detaches the device by itself once the last mount of it is gone:
// an unmount is the whole teardown, and a crash between steps leaves no
// orphaned loop device behind a mount that no longer exists.

// makeImage creates a sparse file of size bytes at path and formats it ext4.
// No journal: the image is scratch space that dies with the sandbox, and a
// journal costs both create time and space. lazy_itable_init and nodiscard
// keep mkfs from touching (and so allocating) the whole file. A
// background mkfs (refilling the disk pool) runs at the lowest CPU and
// I/O priority, so that it takes only what live sandboxes and creates
// leave over.
func makeImage(ctx context.Context, path string, size int64, background bool) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F",
		"-O", "^has_journal",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
		"-m", "0", // no root reserve: sandbox root is not host root
		path)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("mkfs.ext4: %w", err)
	}
	if background {
		// Set once it runs; the few instructions before count for nothing.
		lowerPriority(cmd.Process.Pid)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// lowerPriority gives process pid the lowest CPU priority (nice 19) and
// the idle I/O class. Best effort: a process that already ended, or a
// kernel without I/O priorities, leaves it as it was.
func lowerPriority(pid int) {
	_ = unix.Setpriority(unix.PRIO_PROCESS, pid, 19)
	const (
		ioprioWhoProcess = 1
		ioprioClassIdle  = 3
		ioprioClassShift = 13
	)
	_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(pid), ioprioClassIdle<<ioprioClassShift)
}

// attachLoop binds image to a free loop device with autoclear set and
// returns the open device. The caller mounts it and then closes it; from
// then on the mount alone keeps the device alive.
func attachLoop(image string) (*os.File, error) {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open disk image: %w", err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop-control: %w", err)
	}
	defer ctl.Close()
	// Another process may grab the device between GET_FREE and CONFIGURE;
	// CONFIGURE then fails with EBUSY and we ask again.
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("loop get free: %w", err)
		}
		dev, err := openLoop(n)
		if err != nil {
			return nil, fmt.Errorf("open loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("loop configure: %w", err)
		}
	}
	return nil, errors.New("loop configure: no free loop device after retries")
}

// openLoop opens /dev/loopN. Where /dev is not the kernel's devtmpfs (a
// privileged container's or systemd-nspawn's /dev, a copy made at start)
// the node of a loop device the kernel made since is missing: it is made
// here from the device number sysfs gives.
func openLoop(n int) (*os.File, error) {
	path := fmt.Sprintf("/dev/loop%d", n)
	dev, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if !errors.Is(err, os.ErrNotExist) {
		return dev, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/class/block/loop%d/dev", n))
	if err != nil {
		return nil, fmt.Errorf("loop device %d: no %s and no device number in sysfs: %w", n, path, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return nil, fmt.Errorf("loop device %d: device number %q: %w", n, b, err)
	}
	if err := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(major, minor))); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("loop device %d: make %s: %w", n, path, err)
	}
	return os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
}

// mountImage attaches image to a loop device and mounts it at target.
func mountImage(image, target string) error {
	dev, err := attachLoop(image)
	if err != nil {
		return err
	}
	// Closing dev after the mount drops our reference; autoclear then
	// ties the device's life to the mount. If the mount fails, closing it
	// detaches the device at once.
	defer dev.Close()
	if err := unix.Mount(dev.Name(), target, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev.Name(), target, err)
	}
	return nil
}

// mountOverlay stacks layers (lowest first, as runtime.Spec orders them)
// under upper at target. Overlay wants the topmost lower dir first.
func mountOverlay(layers []string, upper, work, target string) error {
	lower := make([]string, len(layers))
	for i, l := range layers {
		if strings.ContainsAny(l, ":,") {
			return fmt.Errorf("layer path %q contains ':' or ','", l)
		}
		lower[len(layers)-1-i] = l
	}
	// index=off and xino=off: the upper dir never moves to another lower
	// stack, so the inode index buys nothing and would tie the upper dir to
	// these exact lower dirs' file handles.
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off",
		strings.Join(lower, ":"), upper, work)
	if len(data) >= os.Getpagesize() {
		return fmt.Errorf("overlay options are %d bytes, over the page size", len(data))
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}

// mountsUnder returns the mount points at or below dir, deepest first, so
// they can be unmounted in that order.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
	if err != nil {
		return nil, err
	}
	// Later entries in mountinfo are mounted later; unmount them first.
	out := make([]string, 0, len(mounts))
	for i := len(mounts) - 1; i >= 0; i-- {
		out = append(out, mounts[i].Mountpoint)
	}
	return out, nil
}

// unmountAll unmounts everything at or below dir. A busy mount is retried
// briefly (the sandbox's last processes may still be exiting), then
// detached lazily so teardown always makes progress; the lazy case is
// reported so the caller does not delete a directory that still has a
// filesystem behind it.
func unmountAll(ctx context.Context, dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	var errs []error
	for _, mp := range mps {
		if err := unmountOne(ctx, mp); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func unmountOne(ctx context.Context, mp string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Unmount(mp, 0)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // unmounted, or not a mount point any more
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) && ctx.Err() == nil:
			time.Sleep(20 * time.Millisecond) // poll: a dying process still holds it
		default:
			if derr := unix.Unmount(mp, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
			return nil
		}
	}
}

// loopsBacking returns the loop devices whose backing file is image.
func loopsBacking(image string) []string {
	var out []string
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		bf := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if bf == image {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	return out
}

// detachLoops clears loop devices still bound to image: normally autoclear
// has done it, but a device configured by a crashed daemon before its
// mount existed may linger.
func detachLoops(image string) error {
	var errs []error
	for _, dev := range loopsBacking(image) {
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			errs = append(errs, fmt.Errorf("detach %s: %w", dev, err))
		}
		f.Close()
	}
	return errors.Join(errs...)
}
