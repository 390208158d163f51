package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// skipFunc says whether the entry at rel (slash-separated, relative to the
// copy's root, no leading slash) is left out of a copy. Skipping a directory
// skips its contents.
type skipFunc func(rel string, st *unix.Stat_t) bool

// shiftCopy copies the tree at src into the existing directory dst, adding
// base to every uid and gid. Modes (setuid/setgid/sticky included), times,
// xattrs (except POSIX ACLs, whose ids would need shifting too), symlinks,
// fifos and hardlinks are kept; device nodes and sockets are skipped, since
// the runtime provides /dev. One goroutine walks the tree while a pool
// copies file contents, in the kernel (copy_file_range) where it can.
func shiftCopy(ctx context.Context, src, dst string, base uint32, skip skipFunc) error {
	sh := &shifter{
		base:  base,
		skip:  skip,
		jobs:  make(chan fileJob, 256),
		first: map[inode]string{},
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(sh.jobs)
		var st unix.Stat_t
		if err := unix.Lstat(src, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", src, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("copy source %s is not a directory", src)
		}
		if err := sh.applyMeta(src, dst, &st); err != nil {
			return err
		}
		sh.dirs = append(sh.dirs, dirTimes{dst, st})
		return sh.walk(gctx, src, dst, "")
	})
	workers := max(4, 2*runtime.NumCPU())
	for range workers {
		g.Go(func() error {
			for j := range sh.jobs {
				if err := gctx.Err(); err != nil {
					return err
				}
				if err := sh.copyFile(j); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Second names of hardlinked files, once every first name exists.
	for _, l := range sh.links {
		if err := os.Link(l.target, l.name); err != nil {
			return fmt.Errorf("hardlink %s: %w", l.name, err)
		}
	}
	// Directory times last, deepest first: creating entries bumps them.
	for i := len(sh.dirs) - 1; i >= 0; i-- {
		d := sh.dirs[i]
		if err := setTimes(d.path, &d.st); err != nil {
			return err
		}
	}
	return nil
}

type inode struct{ dev, ino uint64 }

type fileJob struct {
	src, dst string
	st       unix.Stat_t
}

type dirTimes struct {
	path string
	st   unix.Stat_t
}

type link struct{ target, name string }

type shifter struct {
	base uint32
	skip skipFunc
	jobs chan fileJob

	// Owned by the walking goroutine until the pool is done.
	first map[inode]string // dst of the first name of each multiply linked file
	links []link
	dirs  []dirTimes
	files atomic.Int64
}

func (sh *shifter) walk(ctx context.Context, srcDir, dstDir, rel string) error {
	d, err := os.Open(srcDir)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("read dir %s: %w", srcDir, err)
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		src := filepath.Join(srcDir, name)
		dst := filepath.Join(dstDir, name)
		r := name
		if rel != "" {
			r = rel + "/" + name
		}
		var st unix.Stat_t
		if err := unix.Lstat(src, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", src, err)
		}
		if sh.skip != nil && sh.skip(r, &st) {
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdir(dst, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", dst, err)
			}
			if err := sh.applyMeta(src, dst, &st); err != nil {
				return err
			}
			sh.dirs = append(sh.dirs, dirTimes{dst, st})
			if err := sh.walk(ctx, src, dst, r); err != nil {
				return err
			}
		case unix.S_IFREG:
			if st.Nlink > 1 {
				key := inode{st.Dev, st.Ino}
				if target, ok := sh.first[key]; ok {
					sh.links = append(sh.links, link{target, dst})
					continue
				}
				sh.first[key] = dst
			}
			select {
			case sh.jobs <- fileJob{src, dst, st}:
			case <-ctx.Done():
				return ctx.Err()
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
			if err := sh.applyMeta(src, dst, &st); err != nil {
				return err
			}
			if err := setTimes(dst, &st); err != nil {
				return err
			}
		case unix.S_IFIFO:
			if err := unix.Mkfifo(dst, 0o600); err != nil {
				return fmt.Errorf("mkfifo %s: %w", dst, err)
			}
			if err := sh.applyMeta(src, dst, &st); err != nil {
				return err
			}
			if err := setTimes(dst, &st); err != nil {
				return err
			}
		default:
			// Device nodes and sockets: the runtime provides /dev, and a
			// socket file is meaningless without its listener.
		}
	}
	return nil
}

// copyFile copies one regular file's contents and metadata.
func (sh *shifter) copyFile(j fileJob) error {
	in, err := os.OpenFile(j.src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(j.dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	// *os.File.ReadFrom uses copy_file_range: no round trip through user
	// space, and a reflink on filesystems that can share extents.
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", j.src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copy %s: %w", j.src, err)
	}
	if err := sh.applyMeta(j.src, j.dst, &j.st); err != nil {
		return err
	}
	sh.files.Add(1)
	return setTimes(j.dst, &j.st)
}

// applyMeta sets shifted ownership, xattrs and mode on dst, in that order:
// chown clears setuid/setgid bits and file capabilities, so they come after.
func (sh *shifter) applyMeta(src, dst string, st *unix.Stat_t) error {
	uid, gid, err := shiftIDs(sh.base, st.Uid, st.Gid)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if err := unix.Lchown(dst, int(uid), int(gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil // symlink modes mean nothing on Linux and can't be set
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	return nil
}

func shiftIDs(base, uid, gid uint32) (uint32, uint32, error) {
	if uid > math.MaxUint32-base || gid > math.MaxUint32-base {
		return 0, 0, fmt.Errorf("owner %d:%d does not fit above uid base %d", uid, gid, base)
	}
	return base + uid, base + gid, nil
}

func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times %s: %w", path, err)
	}
	return nil
}

// copyXattrs copies extended attributes from src to dst without following
// symlinks. POSIX ACLs are left out: they embed ids that would need the
// same shift, and debootstrap results carry none.
func copyXattrs(src, dst string) error {
	size, err := unix.Llistxattr(src, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return fmt.Errorf("list xattrs %s: %w", src, err)
	}
	if size == 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(src, buf)
	if err != nil {
		return fmt.Errorf("list xattrs %s: %w", src, err)
	}
	for _, name := range splitNul(buf[:size]) {
		if name == "system.posix_acl_access" || name == "system.posix_acl_default" {
			continue
		}
		vsize, err := unix.Lgetxattr(src, name, nil)
		if err != nil {
			return fmt.Errorf("get xattr %s of %s: %w", name, src, err)
		}
		val := make([]byte, vsize)
		if vsize > 0 {
			if vsize, err = unix.Lgetxattr(src, name, val); err != nil {
				return fmt.Errorf("get xattr %s of %s: %w", name, src, err)
			}
		}
		if err := unix.Lsetxattr(dst, name, val[:vsize], 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
				continue // e.g. user.* on a symlink; nothing a sandbox needs
			}
			return fmt.Errorf("set xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			if i > start {
				out = append(out, string(b[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

// DirSize is the apparent size of the regular files under root, counting
// each hardlinked file once.
func DirSize(root string) (int64, error) {
	var total int64
	seen := map[inode]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			k := inode{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Size
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", root, err)
	}
	return total, nil
}
