package runc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// Files in a sandbox's root filesystem, reached from the host: the
// runtime writes /etc/hostname and /etc/hosts this way before the sandbox
// starts, and the Manager its egress CA and resolver while the agent
// starts (ReadRootFile, WriteRootFile). Every path is resolved by the
// kernel inside the root (openat2 RESOLVE_IN_ROOT): a symlink a template
// layer planted, absolute or full of "..", resolves as it would in the
// sandbox and never onto the host. RESOLVE_NO_XDEV keeps the walk on the
// root's overlay (nothing else is mounted under it on the host side), and
// that overlay is nodev, so no device node of a layer opens.

// rootResolve is how every path in a sandbox's root is resolved.
const rootResolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// rootRel turns an absolute path in the sandbox into one relative to its
// root, refusing what is not a clean absolute path.
func rootRel(p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q is not a clean absolute file path: %w", p, errdefs.ErrInvalidArgument)
	}
	return p[1:], nil
}

// openRoot opens sandbox id's mounted root filesystem.
func (r *Runtime) openRoot(id string) (*os.File, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	root, err := os.Open(r.rootfs(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	// Mounted, the root is the sandbox's overlay; unmounted, the empty
	// directory under it, which is not the sandbox's.
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &st); err != nil || st.Type != unix.OVERLAYFS_SUPER_MAGIC {
		root.Close()
		return nil, fmt.Errorf("sandbox %s: root filesystem not mounted: %w", id, errdefs.ErrFailedPrecondition)
	}
	return root, nil
}

// ReadRootFile reads the regular file at p (absolute, in the sandbox) in
// sandbox id's root filesystem, at most max bytes (a longer file is an
// error). A missing file is errdefs.ErrNotFound.
func (r *Runtime) ReadRootFile(id, p string, max int64) ([]byte, error) {
	rel, err := rootRel(p)
	if err != nil {
		return nil, err
	}
	root, err := r.openRoot(id)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO opens without a writer, and is refused below.
	fd, err := unix.Openat2(int(root.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: rootResolve,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("read %s: %w", p, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := regular(f); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read %s: over %d bytes: %w", p, max, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// WriteRootFile writes data to p (absolute, in the sandbox) in sandbox
// id's root filesystem, replacing what the file held, as the agent's own
// file write does: a symlink is followed (inside the root), missing
// parent directories are made, and what it makes is owned by the
// sandbox's root, mode 0644 (directories 0755). Anything but a regular
// file at p is refused.
func (r *Runtime) WriteRootFile(id, p string, data []byte) error {
	rel, err := rootRel(p)
	if err != nil {
		return err
	}
	uid, err := r.HostUID(id)
	if err != nil {
		return err
	}
	root, err := r.openRoot(id)
	if err != nil {
		return err
	}
	defer root.Close()
	rfd := int(root.Fd())
	if err := mkdirAllInRoot(rfd, path.Dir(rel), int(uid)); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return writeInRoot(rfd, rel, data, int(uid), 0)
}

// mkdirAllInRoot makes the directory rel (relative to the root rfd) and
// any missing parents, each resolved inside the root, owned by uid.
func mkdirAllInRoot(rfd int, rel string, uid int) error {
	if rel == "." || rel == "" {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		dir := strings.Join(parts[:i+1], "/")
		fd, err := unix.Openat2(rfd, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: rootResolve})
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("directory /%s: %w", dir, err)
		}
		// The parent exists (made or found in the step before); the new
		// entry is made in it as resolved, never through a symlink.
		pfd := rfd
		if i > 0 {
			if pfd, err = unix.Openat2(rfd, strings.Join(parts[:i], "/"), &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: rootResolve}); err != nil {
				return fmt.Errorf("directory /%s: %w", dir, err)
			}
		}
		err = unix.Mkdirat(pfd, parts[i], 0o755)
		if err == nil {
			err = unix.Fchownat(pfd, parts[i], uid, uid, unix.AT_SYMLINK_NOFOLLOW)
		} else if errors.Is(err, unix.EEXIST) {
			err = nil // made meanwhile: the next step opens it as resolved
		}
		if pfd != rfd {
			unix.Close(pfd)
		}
		if err != nil {
			return fmt.Errorf("directory /%s: %w", dir, err)
		}
	}
	return nil
}

// writeInRoot writes body to rel (relative to the root rfd), truncating,
// owned by uid; extra adds open flags (O_NOFOLLOW: refuse a symlink).
func writeInRoot(rfd int, rel string, body []byte, uid, extra int) error {
	// O_NONBLOCK: a FIFO without a reader fails the open (ENXIO) instead
	// of blocking it.
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   uint64(unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY | extra),
		Mode:    0o644,
		Resolve: rootResolve,
	})
	if err != nil {
		return fmt.Errorf("write /%s: %w", rel, err)
	}
	file := os.NewFile(uintptr(fd), rel)
	err = regular(file)
	if err == nil {
		_, err = file.Write(body)
	}
	if err == nil {
		err = file.Chown(uid, uid)
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write /%s: %w", rel, err)
	}
	return nil
}

// regular refuses an open file that is not a regular file.
func regular(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s): %w", fi.Mode().Type(), errdefs.ErrInvalidArgument)
	}
	return nil
}
