package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Extracting an image layer (a tar stream) into a directory that becomes
// an overlay lower dir.
//
// Every path in the tar is made local first (cleanEntryPath: rooted, then
// cleaned, so ".." can never climb above the layer), and every file system
// operation happens relative to a directory opened with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS: a symlink the tar itself planted
// ("a -> /etc", then "a/passwd") is never followed, it fails the layer.
//
// OCI whiteouts become overlay whiteouts, which overlay honours in lower
// layers as in upper ones: ".wh.NAME" a 0/0 character device NAME, and
// ".wh..wh..opq" the trusted.overlay.opaque xattr on its directory. Hard
// links point at an earlier entry of the same layer, or, when the target
// came from a lower layer (overlay cannot link across layers), at a copy.
// Owners are shifted by the store's uid base; ids above the sandbox's range
// become nobody. Device nodes and sockets are skipped: the runtime gives
// each sandbox its own /dev.

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	nobodyID       = 65534
)

// extractStats describes one extracted layer.
type extractStats struct {
	Files    int   // regular files written
	Bytes    int64 // their total size
	Remapped int   // entries whose owner was out of range and became nobody
	Skipped  int   // device nodes and other entries a sandbox cannot use
}

// cleanEntryPath turns a tar entry name into a path relative to the layer
// root: slash-separated, no "..", no leading slash, "." for the root. It
// fails only for names no file can have (a NUL byte, empty).
func cleanEntryPath(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("tar entry name %q is not a path", name)
	}
	p := path.Clean("/" + name)
	if p == "/" {
		return ".", nil
	}
	return p[1:], nil
}

// extractor writes one layer. rootFD is an O_PATH descriptor of the
// layer's (initially empty) directory.
type extractor struct {
	root   string
	rootFD int
	base   uint32
	lowers []string // lower layers' dirs, topmost first, for hard links
	stats  extractStats
	// dirs are directories to give their tar times once everything inside
	// them is written (creating entries bumps a directory's mtime).
	dirs []dirTime
}

type dirTime struct {
	rel string
	ts  []unix.Timespec
}

// extractLayer extracts the tar stream r into dst, an existing empty
// directory. lowers are the directories of the layers below, topmost first.
func extractLayer(ctx context.Context, r io.Reader, dst string, base uint32, lowers []string) (extractStats, error) {
	fd, err := unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return extractStats{}, fmt.Errorf("open layer dir %s: %w", dst, err)
	}
	defer unix.Close(fd)
	x := &extractor{root: dst, rootFD: fd, base: base, lowers: lowers}
	// The layer root is the sandbox's "/": owned by its root, 0755.
	if err := x.chown(fd, "", 0, 0); err != nil {
		return extractStats{}, err
	}
	if err := unix.Chmod(dst, 0o755); err != nil {
		return extractStats{}, err
	}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return x.stats, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return x.stats, fmt.Errorf("read layer: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return x.stats, fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if err := unix.UtimesNanoAt(fd, d.rel, d.ts, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return x.stats, fmt.Errorf("set times of %s: %w", d.rel, err)
		}
	}
	return x.stats, nil
}

// openDir opens rel (a cleaned relative path, "." for the root) beneath the
// layer root without following any symlink, creating missing directories
// (owned by the sandbox's root, 0755) when create is set.
func (x *extractor) openDir(rel string, create bool) (int, error) {
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(x.rootFD, rel, how)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, fmt.Errorf("open %s beneath the layer: %w", rel, err)
		}
		return fd, nil
	}
	// Walk down one component at a time, making what is missing.
	cur, err := unix.Dup(x.rootFD)
	if err != nil {
		return -1, err
	}
	for _, comp := range strings.Split(rel, "/") {
		next, err := unix.Openat2(cur, comp, how)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(cur, comp, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				if err = x.chown(cur, comp, 0, 0); err == nil {
					next, err = unix.Openat2(cur, comp, how)
				}
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("make %s beneath the layer: %w", rel, err)
		}
		cur = next
	}
	return cur, nil
}

// innerIDs returns the owner as the sandbox sees it: ids beyond its range
// (images built by tools that kept a build host's ids) become nobody.
func (x *extractor) innerIDs(hdr *tar.Header) (uint32, uint32) {
	uid, gid := hdr.Uid, hdr.Gid
	if uid < 0 || uid > maxInnerID || gid < 0 || gid > maxInnerID {
		x.stats.Remapped++
	}
	clamp := func(id int) uint32 {
		if id < 0 || id > maxInnerID {
			return nobodyID
		}
		return uint32(id)
	}
	return clamp(uid), clamp(gid)
}

// chown sets name (in dirfd; "" for dirfd itself) to the shifted owner.
func (x *extractor) chown(dirfd int, name string, uid, gid uint32) error {
	su, sg, err := shiftIDs(x.base, uid, gid)
	if err != nil {
		return err
	}
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fchownat(dirfd, name, int(su), int(sg), flags); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	return nil
}

// removeEntry deletes name in dirfd, recursively for a directory.
func (x *extractor) removeEntry(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err == nil || !errors.Is(err, unix.ENOTEMPTY) {
		return err
	}
	// A non-empty directory: through its own descriptor, never a path.
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	fd, err := unix.Openat2(dirfd, name, how)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = x.removeEntry(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanEntryPath(hdr.Name)
	if err != nil {
		return err
	}
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("the layer root must be a directory")
		}
		uid, gid := x.innerIDs(hdr)
		if err := x.chown(x.rootFD, "", uid, gid); err != nil {
			return err
		}
		x.dirs = append(x.dirs, dirTime{".", tarTimes(hdr)})
		return unix.Chmod(x.root, uint32(hdr.Mode)&0o7777)
	}
	pfd, err := x.openDir(dir, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	if strings.HasPrefix(name, whiteoutPrefix) {
		return x.whiteout(pfd, dir, name)
	}
	uid, gid := x.innerIDs(hdr)
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := x.removeEntry(pfd, name); err != nil {
				return err
			}
		}
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		x.dirs = append(x.dirs, dirTime{rel, tarTimes(hdr)})
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // TypeRegA is still written by old tools
		if err := x.removeEntry(pfd, name); err != nil {
			return err
		}
		if err := x.writeFile(pfd, name, r); err != nil {
			return err
		}
		x.stats.Files++
		x.stats.Bytes += hdr.Size
	case tar.TypeSymlink:
		if err := x.removeEntry(pfd, name); err != nil {
			return err
		}
		// The target is data for the sandbox; nothing here follows it.
		if err := unix.Symlinkat(hdr.Linkname, pfd, name); err != nil {
			return err
		}
	case tar.TypeLink:
		if err := x.removeEntry(pfd, name); err != nil {
			return err
		}
		return x.hardlink(pfd, name, hdr.Linkname)
	case tar.TypeFifo:
		if err := x.removeEntry(pfd, name); err != nil {
			return err
		}
		if err := unix.Mkfifoat(pfd, name, 0o600); err != nil {
			return err
		}
	default:
		// Device nodes, sockets and vendor types: a sandbox gets its /dev
		// from the runtime and could not use them anyway.
		x.stats.Skipped++
		return nil
	}
	return x.meta(pfd, name, hdr, uid, gid, mode)
}

// meta sets owner, xattrs, mode and (except for directories, done last)
// times, in that order: chown clears setuid/setgid and file capabilities.
func (x *extractor) meta(pfd int, name string, hdr *tar.Header, uid, gid, mode uint32) error {
	if err := x.chown(pfd, name, uid, gid); err != nil {
		return err
	}
	if err := x.xattrs(pfd, name, hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// fchmodat follows symlinks; the entry was just made and is not one.
		if err := unix.Fchmodat(pfd, name, mode, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if hdr.Typeflag == tar.TypeDir {
		return nil
	}
	if err := unix.UtimesNanoAt(pfd, name, tarTimes(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// xattrs applies the extended attributes a sandbox can use: file
// capabilities and user.*. trusted.* (overlay's own, which would let a
// layer forge whiteouts) and the rest of security.* are dropped.
func (x *extractor) xattrs(pfd int, name string, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || (attr != "security.capability" && !strings.HasPrefix(attr, "user.")) {
			continue
		}
		p := "/proc/self/fd/" + strconv.Itoa(pfd) + "/" + name
		if err := unix.Lsetxattr(p, attr, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
				continue // e.g. user.* on a symlink
			}
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
	}
	return nil
}

func (x *extractor) writeFile(pfd int, name string, r io.Reader) error {
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// whiteout records a deletion: an opaque marker on dir, or a whiteout
// device in place of the named entry.
func (x *extractor) whiteout(pfd int, dir, name string) error {
	if name == whiteoutOpaque {
		p := "/proc/self/fd/" + strconv.Itoa(pfd)
		// p is the magic link to the directory itself: follow it.
		if err := unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %s opaque: %w", dir, err)
		}
		return nil
	}
	target := strings.TrimPrefix(name, whiteoutPrefix)
	if target == "" || target == "." || target == ".." || strings.HasPrefix(target, whiteoutPrefix) {
		// ".wh..wh.*" other than the opaque marker are aufs bookkeeping.
		x.stats.Skipped++
		return nil
	}
	if err := x.removeEntry(pfd, target); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, target, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("whiteout %s: %w", target, err)
	}
	return x.chown(pfd, target, 0, 0)
}

// hardlink makes name (in pfd) a second name of the layer path linkname,
// or a copy of it when it lives in a lower layer.
func (x *extractor) hardlink(pfd int, name, linkname string) error {
	target, err := cleanEntryPath(linkname)
	if err != nil || target == "." {
		return fmt.Errorf("hard link target %q is not a file path", linkname)
	}
	tdir, tname := path.Split(target)
	tdir = strings.TrimSuffix(tdir, "/")
	if tdir == "" {
		tdir = "."
	}
	tfd, err := x.openDir(tdir, false)
	if err == nil {
		err = unix.Linkat(tfd, tname, pfd, name, 0)
		unix.Close(tfd)
		if err == nil {
			return nil
		}
	}
	if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("hard link to %s: %w", target, err)
	}
	for _, lower := range x.lowers {
		ok, err := x.copyFromLower(lower, target, pfd, name)
		if err != nil {
			return fmt.Errorf("hard link to %s (in a lower layer): %w", target, err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("hard link target %s: not in this layer or below", target)
}

// copyFromLower copies the regular file rel of the lower layer dir into
// name (in pfd) with its owner, mode and times (already shifted). It
// reports false when lower has no such entry.
func (x *extractor) copyFromLower(lower, rel string, pfd int, name string) (bool, error) {
	lfd, err := unix.Open(lower, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(lfd)
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	sfd, err := unix.Openat2(lfd, rel, how)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	src := os.NewFile(uintptr(sfd), rel)
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, fmt.Errorf("%s is not a regular file", rel)
	}
	dfd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, err
	}
	dst := os.NewFile(uintptr(dfd), name)
	_, err = dst.ReadFrom(src)
	if err == nil {
		err = unix.Fchown(dfd, int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = unix.Fchmod(dfd, st.Mode&0o7777)
	}
	if err == nil {
		err = unix.UtimesNanoAt(pfd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		x.stats.Files++
		x.stats.Bytes += st.Size
	}
	return err == nil, err
}

func tarTimes(hdr *tar.Header) []unix.Timespec {
	ts := func(t time.Time) unix.Timespec {
		if t.IsZero() || t.Year() < 1970 || t.Year() > 2200 {
			return unix.Timespec{} // the epoch, not an overflowed UnixNano
		}
		return unix.NsecToTimespec(t.UnixNano())
	}
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return []unix.Timespec{ts(at), ts(hdr.ModTime)}
}
