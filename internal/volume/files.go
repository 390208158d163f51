package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Files works on a mounted volume's files from the host (E2B's volume
// content API), as a sandbox would see them: every path resolves inside
// the volume (os.Root: a symlink or ".." never leads out of it), and uids
// and gids are the sandbox's, kept on disk in the canonical range.
type Files struct {
	root    *os.Root
	uidBase uint32
}

// OpenFiles opens the volume mounted at dir (Disks.Mount's root). Close it
// before releasing the mount.
func OpenFiles(dir string, uidBase uint32) (*Files, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &Files{root: r, uidBase: uidBase}, nil
}

// Close closes the volume's root.
func (f *Files) Close() error { return f.root.Close() }

// MaxID is the largest uid or gid a sandbox has (the runtimes' range is
// 65536 ids).
const MaxID = 65535

// Entry is one file as both volume APIs show it.
type Entry = types.VolumeEntry

// CleanPath turns a path in the volume ("/a/b", "a/b", "/") into the
// relative name os.Root takes ("a/b", "."), refusing one that is empty,
// holds a NUL or climbs above the root.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("path: empty: %w", errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", fmt.Errorf("path %q: a NUL byte or over 4096 bytes: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q: '..' is not allowed: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	if c == "" {
		return ".", nil
	}
	return c, nil
}

// wirePath is name's path as the API shows it.
func wirePath(name string) string {
	if name == "." {
		return "/"
	}
	return "/" + name
}

// checkIDs refuses a uid or gid outside a sandbox's range.
func checkIDs(uid, gid *uint32) error {
	for _, c := range []struct {
		name string
		v    *uint32
	}{{"uid", uid}, {"gid", gid}} {
		if c.v != nil && *c.v > MaxID {
			return fmt.Errorf("%s %d is over %d: %w", c.name, *c.v, MaxID, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// mapErr turns an os error into an errdefs class the API maps.
func mapErr(op, p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %s: %w", op, p, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s %s: %w", op, p, errdefs.ErrAlreadyExists)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY):
		return fmt.Errorf("%s %s: %v: %w", op, p, err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%s %s: the volume is full: %w", op, p, errdefs.ErrResourceExhausted)
	case strings.Contains(err.Error(), "path escapes from parent"):
		return fmt.Errorf("%s %s: a symlink leads out of the volume: %w", op, p, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// entry describes name, not following a final symlink.
func (f *Files) entry(name string) (Entry, error) {
	fi, err := f.root.Lstat(name)
	if err != nil {
		return Entry{}, mapErr("stat", wirePath(name), err)
	}
	e := Entry{Name: path.Base(wirePath(name)), Path: wirePath(name), Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Mtime: fi.ModTime().UTC()}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		if t, err := f.root.Readlink(name); err == nil {
			e.Target = t
		}
	default:
		e.Type = "unknown"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = f.inner(st.Uid), f.inner(st.Gid)
		e.Atime = time.Unix(st.Atim.Sec, st.Atim.Nsec).UTC()
		e.Ctime = time.Unix(st.Ctim.Sec, st.Ctim.Nsec).UTC()
	}
	return e, nil
}

// inner is host id as a sandbox sees it; one outside the range shows as
// the overflow id (nobody), as in a sandbox.
func (f *Files) inner(id uint32) uint32 {
	if id < f.uidBase || id-f.uidBase > MaxID {
		return 65534
	}
	return id - f.uidBase
}

// Stat describes the file at p.
func (f *Files) Stat(p string) (Entry, error) {
	name, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	return f.entry(name)
}

// MaxListed bounds one listing.
const MaxListed = 10000

// List lists directory p, and below it to depth levels (1: its entries
// only), depth first in name order; p naming anything else lists its own
// entry alone (as ls does).
func (f *Files) List(p string, depth int) ([]Entry, error) {
	name, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	if depth < 1 {
		return nil, fmt.Errorf("depth %d: want at least 1: %w", depth, errdefs.ErrInvalidArgument)
	}
	e, err := f.entry(name)
	if err != nil {
		return nil, err
	}
	if e.Type != "directory" {
		return []Entry{e}, nil
	}
	var out []Entry
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		d, err := f.root.Open(dir)
		if err != nil {
			return mapErr("list", wirePath(dir), err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return mapErr("list", wirePath(dir), err)
		}
		slices.Sort(names)
		for _, n := range names {
			child := n
			if dir != "." {
				child = dir + "/" + n
			}
			e, err := f.entry(child)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue // removed meanwhile
			}
			if err != nil {
				return err
			}
			if len(out) == MaxListed {
				return fmt.Errorf("list %s: over %d entries: list a deeper directory or less deep: %w", wirePath(name), MaxListed, errdefs.ErrInvalidArgument)
			}
			out = append(out, e)
			if e.Type == "directory" && level < depth {
				if err := walk(child, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(name, 1); err != nil {
		return nil, err
	}
	return out, nil
}

// Attrs are the owner and mode a new or changed file gets; nil leaves one
// as it is (a new file: root's, 0644 or 0755 for a directory).
type Attrs struct {
	UID, GID *uint32
	Mode     *uint32
}

// apply sets a's owner and mode on name.
func (f *Files) apply(name string, a Attrs) error {
	if err := checkIDs(a.UID, a.GID); err != nil {
		return err
	}
	if a.UID != nil || a.GID != nil {
		uid, gid := -1, -1
		if a.UID != nil {
			uid = int(f.uidBase + *a.UID)
		}
		if a.GID != nil {
			gid = int(f.uidBase + *a.GID)
		}
		if err := f.root.Lchown(name, uid, gid); err != nil {
			return mapErr("chown", wirePath(name), err)
		}
	}
	if a.Mode != nil {
		if *a.Mode > 0o7777 {
			return fmt.Errorf("mode %o: want at most 07777: %w", *a.Mode, errdefs.ErrInvalidArgument)
		}
		fi, err := f.root.Lstat(name)
		if err != nil {
			return mapErr("chmod", wirePath(name), err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("chmod %s: a symlink has no mode of its own: %w", wirePath(name), errdefs.ErrInvalidArgument)
		}
		if err := f.root.Chmod(name, fileMode(*a.Mode)); err != nil {
			return mapErr("chmod", wirePath(name), err)
		}
	}
	return nil
}

// fileMode turns a Unix mode (setuid, setgid, sticky and permissions)
// into Go's.
func fileMode(m uint32) fs.FileMode {
	out := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		out |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// rootOwned is who a new file belongs to: root unless a names another.
func rootOwned(a Attrs) Attrs {
	zero := uint32(0)
	if a.UID == nil {
		a.UID = &zero
	}
	if a.GID == nil {
		a.GID = &zero
	}
	return a
}

// parents makes the missing directories above name, owned by a's owner.
func (f *Files) parents(name string, a Attrs) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	var missing []string
	for d := dir; d != "."; d = path.Dir(d) {
		if _, err := f.root.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := f.root.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return mapErr("mkdir", wirePath(missing[i]), err)
		}
		if err := f.apply(missing[i], Attrs{UID: a.UID, GID: a.GID}); err != nil {
			return err
		}
	}
	return nil
}

// MakeDir makes directory p; with force its missing parents too, and an
// existing directory is no error.
func (f *Files) MakeDir(p string, a Attrs, force bool) (Entry, error) {
	name, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if err := checkIDs(a.UID, a.GID); err != nil {
		return Entry{}, err
	}
	a = rootOwned(a)
	if force {
		if err := f.parents(name, a); err != nil {
			return Entry{}, err
		}
	}
	if err := f.root.Mkdir(name, 0o755); err != nil {
		if !force || !errors.Is(err, fs.ErrExist) {
			return Entry{}, mapErr("mkdir", wirePath(name), err)
		}
		if e, serr := f.entry(name); serr != nil || e.Type != "directory" {
			return Entry{}, mapErr("mkdir", wirePath(name), err)
		}
		return f.entry(name)
	}
	if err := f.apply(name, a); err != nil {
		return Entry{}, err
	}
	return f.entry(name)
}

// ReadFile opens file p for reading (a symlink in the volume is
// followed, inside it) and returns what it is as opened: serve fi.Size()
// bytes of it, whatever a writer in a sandbox does to it meanwhile.
func (f *Files) ReadFile(p string) (file *os.File, fi fs.FileInfo, err error) {
	name, err := CleanPath(p)
	if err != nil {
		return nil, nil, err
	}
	file, err = f.root.Open(name)
	if err != nil {
		return nil, nil, mapErr("read", wirePath(name), err)
	}
	fi, err = file.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		file.Close()
		return nil, nil, fmt.Errorf("read %s: not a file: %w", wirePath(name), errdefs.ErrInvalidArgument)
	}
	return file, fi, nil
}

// WriteFile writes r to file p, replacing what it held; with force its
// missing parent directories are made. The file is written beside and
// renamed over p, so a reader never sees it half written.
func (f *Files) WriteFile(p string, r io.Reader, a Attrs, force bool) (Entry, error) {
	name, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if name == "." {
		return Entry{}, fmt.Errorf("write /: the volume's root is a directory: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkIDs(a.UID, a.GID); err != nil {
		return Entry{}, err
	}
	if a.Mode != nil && *a.Mode > 0o7777 {
		return Entry{}, fmt.Errorf("mode %o: want at most 07777: %w", *a.Mode, errdefs.ErrInvalidArgument)
	}
	a = rootOwned(a)
	if force {
		if err := f.parents(name, a); err != nil {
			return Entry{}, err
		}
	}
	if fi, err := f.root.Lstat(name); err == nil && fi.IsDir() {
		return Entry{}, fmt.Errorf("write %s: a directory is there: %w", wirePath(name), errdefs.ErrFailedPrecondition)
	}
	tmp := path.Join(path.Dir(name), fmt.Sprintf(".berth-upload-%d-%d", os.Getpid(), time.Now().UnixNano()))
	file, err := f.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Entry{}, mapErr("write", wirePath(name), err)
	}
	_, err = io.Copy(file, r)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if a.Mode == nil {
			mode := uint32(0o644)
			a.Mode = &mode
		}
		err = f.apply(tmp, a)
	}
	if err == nil {
		err = f.root.Rename(tmp, name)
	}
	if err != nil {
		_ = f.root.Remove(tmp) // err says why
		return Entry{}, mapErr("write", wirePath(name), err)
	}
	return f.entry(name)
}

// SetAttrs changes p's owner and mode.
func (f *Files) SetAttrs(p string, a Attrs) (Entry, error) {
	name, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if _, err := f.entry(name); err != nil {
		return Entry{}, err
	}
	if err := f.apply(name, a); err != nil {
		return Entry{}, err
	}
	return f.entry(name)
}

// Remove removes p, a directory with everything in it. The root itself is
// not removed.
func (f *Files) Remove(p string) error {
	name, err := CleanPath(p)
	if err != nil {
		return err
	}
	if name == "." {
		return fmt.Errorf("remove /: the volume's root stays (remove its entries, or the volume): %w", errdefs.ErrInvalidArgument)
	}
	if _, err := f.root.Lstat(name); err != nil {
		return mapErr("remove", wirePath(name), err)
	}
	return mapErr("remove", wirePath(name), f.root.RemoveAll(name))
}

// Serve answers an HTTP request with size bytes of file: exactly what
// Content-Length says, though a sandbox may grow or cut the file
// meanwhile (a file cut short ends the answer early, which the client
// sees as a short body).
func Serve(w http.ResponseWriter, file io.Reader, size int64) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, file, size) // a client that went away ends the copy
}
