package dockerfile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/berth-sandbox/berth/errdefs"
)

// BuildContext is a build's context directory. Everything read from it goes
// through an os.Root, so no path or symlink leads out of it, and what
// .dockerignore excludes is never read.
type BuildContext struct {
	root *os.Root
	pm   *patternmatcher.PatternMatcher
}

// OpenContext opens dir as a build context, with its .dockerignore.
func OpenContext(dir string) (*BuildContext, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("build context %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	c := &BuildContext{root: root}
	f, err := root.Open(".dockerignore")
	if err == nil {
		patterns, perr := ignorefile.ReadAll(io.LimitReader(f, 1<<20))
		f.Close()
		if perr != nil {
			root.Close()
			return nil, fmt.Errorf(".dockerignore: %v: %w", perr, errdefs.ErrInvalidArgument)
		}
		if c.pm, err = patternmatcher.New(patterns); err != nil {
			root.Close()
			return nil, fmt.Errorf(".dockerignore: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		root.Close()
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return c, nil
}

// Close releases the context.
func (c *BuildContext) Close() error { return c.root.Close() }

// cleanRel confines a source path to the context lexically: absolute
// paths and ".." resolve inside it, as Docker does.
func cleanRel(p string) string {
	p = path.Clean("/" + strings.ReplaceAll(p, "\\", "/"))
	if p == "/" {
		return "."
	}
	return p[1:]
}

func (c *BuildContext) ignored(rel string) bool {
	if c.pm == nil || rel == "." {
		return false
	}
	ok, err := c.pm.MatchesOrParentMatches(rel)
	return err == nil && ok
}

// source is one matched source: its context-relative path.
type source struct {
	rel  string
	info fs.FileInfo
}

// sources expands COPY/ADD sources (globs allowed) into what exists and
// is not ignored. A source that matches nothing is an error naming it.
func (c *BuildContext) sources(srcs []string) ([]source, error) {
	var out []source
	for _, s := range srcs {
		rel := cleanRel(s)
		var matches []string
		if strings.ContainsAny(rel, "*?[") {
			if _, err := path.Match(rel, ""); err != nil {
				return nil, fmt.Errorf("source %q: bad pattern: %w", s, errdefs.ErrInvalidArgument)
			}
			err := fs.WalkDir(c.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if ok, _ := path.Match(rel, p); ok {
					matches = append(matches, p)
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("source %q: %w", s, err)
			}
		} else {
			matches = []string{rel}
		}
		n := 0
		for _, m := range matches {
			if c.ignored(m) {
				continue
			}
			fi, err := c.root.Lstat(m)
			if err != nil {
				continue
			}
			out = append(out, source{rel: m, info: fi})
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("source %q: not in the build context (or excluded by .dockerignore): %w", s, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

// entry is one file to copy: where it is in the context and where it goes,
// relative to the destination root.
type entry struct {
	src  string
	dst  string
	info fs.FileInfo
	// top is a directory source itself: its contents are copied, and the
	// destination directory is made like a parent (not with its mode).
	top bool
}

// plan lists what copying srcs to dest (absolute, in the image) writes.
func (c *BuildContext) plan(srcs []string, dest string) ([]entry, error) {
	ss, err := c.sources(srcs)
	if err != nil {
		return nil, err
	}
	destDir := strings.HasSuffix(dest, "/") || len(ss) > 1
	dest = cleanRel(dest)
	var out []entry
	for _, s := range ss {
		if !s.info.IsDir() {
			d := dest
			if destDir {
				d = path.Join(dest, path.Base(s.rel))
			}
			out = append(out, entry{src: s.rel, dst: d, info: s.info})
			continue
		}
		// A directory's contents go into dest.
		err := fs.WalkDir(c.root.FS(), s.rel, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if c.ignored(p) {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel := strings.TrimPrefix(strings.TrimPrefix(p, s.rel), "/")
			if s.rel == "." {
				rel = p
				if p == "." {
					rel = ""
				}
			}
			out = append(out, entry{src: p, dst: path.Join(dest, rel), info: fi, top: p == s.rel})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("copy %s: %w", s.rel, err)
		}
	}
	slices.SortStableFunc(out, func(a, b entry) int { return strings.Compare(a.dst, b.dst) })
	return out, nil
}

// hash sums what the entries are: paths, types, modes, link targets and
// contents. It is the part of a COPY's cache key that the files make.
func (c *BuildContext) hash(es []entry) (string, error) {
	h := sha256.New()
	for _, e := range es {
		mode := e.info.Mode()
		if e.top {
			mode = fs.ModeDir
		}
		fmt.Fprintf(h, "%s\x00%s\x00%o\x00", e.src, e.dst, mode)
		switch {
		case e.info.Mode()&fs.ModeSymlink != 0:
			t, err := c.root.Readlink(e.src)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "%s\x00", t)
		case e.info.Mode().IsRegular():
			if err := c.sumFile(h, e.src); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (c *BuildContext) sumFile(h hash.Hash, rel string) error {
	f, err := c.root.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(h, f)
	fmt.Fprintf(h, "\x00%d\x00", n)
	return err
}

// DirAttrs says who owns a directory of the image below a new layer
// (host ids) and its mode; ok is false when the image has none there.
type DirAttrs func(rel string) (uid, gid int, mode fs.FileMode, ok bool)

// mkParents makes the directories leading to rel in dst that the layer
// lacks, with the owner and mode the image below gives them (a new layer's
// directory hides the attributes of the one beneath), or root's and 0755.
func mkParents(dst *os.Root, rel string, attrs DirAttrs, rootID int) error {
	if rel == "." || rel == "" {
		return nil
	}
	if err := mkParents(dst, path.Dir(rel), attrs, rootID); err != nil {
		return err
	}
	if _, err := dst.Lstat(rel); err == nil {
		return nil
	}
	uid, gid, mode, ok := 0, 0, fs.FileMode(0), false
	if attrs != nil {
		uid, gid, mode, ok = attrs(rel)
	}
	if !ok {
		uid, gid, mode = rootID, rootID, 0o755
	}
	if err := dst.Mkdir(rel, 0o700); err != nil {
		return err
	}
	if err := dst.Lchown(rel, uid, gid); err != nil {
		return err
	}
	return dst.Chmod(rel, mode.Perm()|mode&fs.ModeSticky)
}

// copyTo writes the entries into the layer directory layer, owned by
// uid:gid (host ids, already shifted); directories above them that the
// layer lacks take their attributes from attrs; chmod, when not zero,
// is the mode of every copied file and directory (COPY --chmod). Writes
// go through an os.Root of the layer: a symlink copied from the context is
// never followed.
func (c *BuildContext) copyTo(es []entry, layer string, uid, gid int, attrs DirAttrs, rootID int, chmod fs.FileMode) error {
	dst, err := os.OpenRoot(layer)
	if err != nil {
		return err
	}
	defer dst.Close()
	for _, e := range es {
		top := path.Dir(e.dst)
		if e.top {
			top = e.dst
		}
		if err := mkParents(dst, top, attrs, rootID); err != nil {
			return fmt.Errorf("copy %s to /%s: %w", e.src, e.dst, err)
		}
		if e.top {
			continue
		}
		if err := c.copyOne(dst, e, uid, gid, chmod); err != nil {
			return fmt.Errorf("copy %s to /%s: %w", e.src, e.dst, err)
		}
	}
	return nil
}

func (c *BuildContext) copyOne(dst *os.Root, e entry, uid, gid int, chmod fs.FileMode) error {
	mode := e.info.Mode()
	switch {
	case mode.IsDir():
		if e.dst == "." {
			return nil
		}
		if err := dst.Mkdir(e.dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case mode&fs.ModeSymlink != 0:
		t, err := c.root.Readlink(e.src)
		if err != nil {
			return err
		}
		_ = dst.Remove(e.dst)
		if err := dst.Symlink(t, e.dst); err != nil {
			return err
		}
		return dst.Lchown(e.dst, uid, gid)
	case mode.IsRegular():
		in, err := c.root.Open(e.src)
		if err != nil {
			return err
		}
		defer in.Close()
		_ = dst.Remove(e.dst)
		out, err := dst.OpenFile(e.dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	default:
		return nil // devices, fifos, sockets: not copied
	}
	if err := dst.Lchown(e.dst, uid, gid); err != nil {
		return err
	}
	if chmod != 0 {
		return dst.Chmod(e.dst, chmod)
	}
	return dst.Chmod(e.dst, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}
