package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A sandbox's writable layer is owned by the sandbox's own host uid range
// (its root owns the layer's top directory), while stored layers are owned
// by the canonical range (Config.UIDBase), which the runtime maps onto
// each sandbox. Freezing a writable layer into a stored one moves every
// owner from the one range to the other.

// idRange is the number of ids a sandbox's range holds.
const idRange = maxInnerID + 1

// reown moves the owner and group of every entry under root from the
// range starting at from to the one starting at to. An id outside the
// source range fails the whole operation: it was not the sandbox's to
// give. chown clears setuid/setgid bits and file capabilities, so both are
// put back.
func reown(ctx context.Context, root string, from, to uint32) error {
	move := func(id uint32) (uint32, bool) {
		if id < from || id-from >= idRange {
			return 0, false
		}
		return to + (id - from), true
	}
	// A hard-linked file is met once per name; it is moved once.
	moved := map[inode]bool{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			ino := inode{st.Dev, st.Ino}
			if moved[ino] {
				return nil
			}
			moved[ino] = true
		}
		uid, ok1 := move(st.Uid)
		gid, ok2 := move(st.Gid)
		if !ok1 || !ok2 {
			return fmt.Errorf("%s: owner %d:%d is outside the sandbox's range %d..%d", p, st.Uid, st.Gid, from, from+idRange-1)
		}
		isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
		var fcap []byte
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			if n, err := unix.Lgetxattr(p, "security.capability", nil); err == nil && n > 0 {
				fcap = make([]byte, n)
				if n, err = unix.Lgetxattr(p, "security.capability", fcap); err != nil {
					return fmt.Errorf("read capabilities of %s: %w", p, err)
				}
				fcap = fcap[:n]
			}
		}
		if err := unix.Lchown(p, int(uid), int(gid)); err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
		if fcap != nil {
			if err := unix.Lsetxattr(p, "security.capability", fcap, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("restore capabilities of %s: %w", p, err)
			}
		}
		if !isLink && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
				return fmt.Errorf("chmod %s: %w", p, err)
			}
		}
		return nil
	})
}
