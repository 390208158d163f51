package runc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Template layers are stored once, owned by the canonical range
// (UIDBase..). Each sandbox sees them through idmapped mounts (Linux 5.12;
// overlayfs accepts idmapped lower layers since 5.19) that map the
// canonical range onto the sandbox's slot, so nothing is copied or chowned
// per sandbox and one sandbox's view of a layer says nothing about
// another's.
//
// The idmapped mounts exist on the host only while the overlay is being
// mounted: overlayfs takes a private clone of each lower layer's mount, so
// the attached copies under StateDir/<id>/lower are detached right after.
// A crash in between leaves them under the sandbox's state dir, where
// Destroy's unmountAll finds them like any other mount.

// usernsFD returns an open user namespace whose uid and gid maps send
// inner..inner+count-1 to outer..outer+count-1: the mapping an idmapped
// mount applies to on-disk ids. It is held by unshare(1) and cat(1) until
// it is open (holdUserNS), owned by host root: no process ever runs in it.
// (A Go child made with CLONE_NEWUSER would be a full fork of the daemon,
// whose page-table copy stalls every thread of the daemon meanwhile.)
func usernsFD(inner, outer, count uint32) (*os.File, error) {
	m := []specs.LinuxIDMapping{{ContainerID: inner, HostID: outer, Size: count}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, err := holdUserNS(ctx, nil, m, m)
	if err != nil {
		return nil, fmt.Errorf("idmap: %w", err)
	}
	defer ns.close()
	f, err := os.Open(ns.path)
	if err != nil {
		return nil, fmt.Errorf("user namespace for idmap: %w", err)
	}
	return f, nil
}

// idmapNS keeps, per sandbox root uid, the user namespace usernsFD made
// for it while the slot is in use (drop), so a restart or a volume of the
// sandbox does not make it again, and makes the next slots' ahead of the
// creates that will claim them (prefetch). The namespace only describes
// a mapping: no process ever runs in it, so it holds no state one sandbox
// could leave for the next one on the same uid slot. (The sandbox's own user
// namespace, which its processes live in and which holds keyrings and
// per-namespace counters, is made fresh for every sandbox: newUserNS.)
type idmapNS struct {
	mu       sync.Mutex
	fds      map[uint32]*os.File      // by outer (host) uid
	inflight map[uint32]chan struct{} // namespaces being made, by outer uid
	closed   bool
}

// get returns the namespace mapping inner.. onto outer.. (count ids);
// inner and count are the runtime's, the same for every uid, so outer
// alone keys it. The caller must not close it. A namespace being made
// (prefetch) is waited for, not made twice.
func (c *idmapNS) get(inner, outer, count uint32) (*os.File, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, errors.New("user namespace for idmap: runtime closed")
		}
		if f, ok := c.fds[outer]; ok {
			c.mu.Unlock()
			return f, nil
		}
		wait, busy := c.inflight[outer]
		if !busy {
			if c.inflight == nil {
				c.inflight = map[uint32]chan struct{}{}
			}
			done := make(chan struct{})
			c.inflight[outer] = done
			c.mu.Unlock()
			return c.make(inner, outer, count, done)
		}
		c.mu.Unlock()
		<-wait
	}
}

// make makes the namespace (outside the lock: creates on other slots do
// not wait for it) and keeps it.
func (c *idmapNS) make(inner, outer, count uint32, done chan struct{}) (*os.File, error) {
	f, err := usernsFD(inner, outer, count)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.inflight, outer)
	close(done)
	if err != nil {
		return nil, err
	}
	if c.closed {
		f.Close()
		return nil, errors.New("user namespace for idmap: runtime closed")
	}
	if c.fds == nil {
		c.fds = map[uint32]*os.File{}
	}
	c.fds[outer] = f
	return f, nil
}

// prefetch makes the namespace for outer in the background unless it is
// kept or being made: the create that takes that uid slot next then skips
// making it (two process starts, usernsFD).
func (c *idmapNS) prefetch(inner, outer, count uint32, log *slog.Logger) {
	c.mu.Lock()
	_, kept := c.fds[outer]
	_, busy := c.inflight[outer]
	closed := c.closed
	c.mu.Unlock()
	if kept || busy || closed {
		return
	}
	go func() {
		if _, err := c.get(inner, outer, count); err != nil {
			log.Debug("idmap_prefetch", "outer_uid", outer, "err", err)
		}
	}()
}

// drop closes the namespace kept for outer, once the uid slot it maps to
// is free again: slots are handed out in rotation, so a released one is
// the last to come back, and keeping every namespace a long-lived daemon
// ever made would hold one descriptor per slot it ever used.
func (c *idmapNS) drop(outer uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.fds[outer]; ok {
		f.Close()
		delete(c.fds, outer)
	}
}

// close drops every namespace kept; namespaces made later are dropped too.
func (c *idmapNS) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.fds {
		f.Close()
	}
	c.fds = nil
	c.closed = true
}

// mountIdmappedLayers attaches an idmapped, read-only view of each layer
// under dir (dir/0, dir/1, …) and returns their paths in the same order.
func mountIdmappedLayers(layers []string, dir string, userns *os.File) (_ []string, err error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(layers))
	defer func() {
		if err != nil {
			_ = detachLayers(out) // the caller gets err; this is cleanup
		}
	}()
	for i, l := range layers {
		target := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(target, 0o700); err != nil {
			return nil, err
		}
		if err := mountIdmapped(l, target, userns, true); err != nil {
			return nil, err
		}
		out = append(out, target)
	}
	return out, nil
}

// mountIdmapped attaches at target a clone of the mount at src, mapped
// through userns, nosuid and nodev, and read-only if readOnly.
func mountIdmapped(src, target string, userns *os.File, readOnly bool) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID,
		Userns_fd: uint64(userns.Fd()),
	}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s (needs Linux 5.12+ and a filesystem that supports idmapped mounts): %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", target, err)
	}
	return nil
}

// detachLayers removes the attached idmapped views; an overlay built on
// them keeps its own private clones.
func detachLayers(paths []string) error {
	var errs []error
	for _, p := range paths {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			continue
		}
		os.Remove(p)
	}
	if len(paths) > 0 {
		os.Remove(filepath.Dir(paths[0]))
	}
	return errors.Join(errs...)
}
