package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Snapshot layers: a sandbox's writable layer frozen into a read-only
// layer owned by the canonical range (as cached environments are), and
// the portable form of such a layer: an OCI-style layer tar (ids as the
// sandbox sees them, overlay whiteouts as ".wh." entries, opaque
// directories as ".wh..wh..opq"), which the same safe extractor that
// unpacks image layers reads back on another host.

// FreezeLayer copies src, a sandbox's upper dir (its processes frozen),
// into dst, which must not exist, moving owners from the sandbox's range
// to the canonical one. It returns the size of the layer's files. On an
// error dst is removed.
func (s *Store) FreezeLayer(ctx context.Context, src, dst string) (size int64, err error) {
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dst) // err says why
		}
	}()
	var top unix.Stat_t
	if err := unix.Lstat(src, &top); err != nil {
		return 0, fmt.Errorf("freeze layer: %w", err)
	}
	if top.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, fmt.Errorf("freeze layer: %s is not a directory", src)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "cp", "-a", "--preserve=all", "--no-target-directory", src, dst)
	cmd.Stderr = &stderr
	// It dies with the daemon: a restarted daemon removes the half
	// copy, which a copy still running would write into again.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(stderr.String()))
	}
	// Overlay makes whiteouts with the mounter's credentials (host
	// root): they belong to the sandbox's root like the layer's top.
	if err := ownWhiteouts(dst, top.Uid); err != nil {
		return 0, err
	}
	if top.Uid != s.cfg.UIDBase {
		if err := reown(ctx, dst, top.Uid, s.cfg.UIDBase); err != nil {
			return 0, fmt.Errorf("freeze layer: %w", err)
		}
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		return 0, err
	}
	if err := syncFS(dst); err != nil {
		return 0, err
	}
	return DirSize(dst)
}

// isWhiteout reports whether st is an overlay whiteout: a 0/0 character
// device.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func ownWhiteouts(root string, uid uint32) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeCharDevice == 0 {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if isWhiteout(&st) {
			return unix.Lchown(p, int(uid), int(uid))
		}
		return nil
	})
}

// ExportLayer writes the layer at dir (owned by the canonical range) to w
// as a layer tar.
func (s *Store) ExportLayer(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[inode]string{}
	base := s.cfg.UIDBase
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		uid, gid := int(st.Uid)-int(base), int(st.Gid)-int(base)
		if uid < 0 || uid > maxInnerID || gid < 0 || gid > maxInnerID {
			return fmt.Errorf("export %s: owner %d:%d is outside the layer's range", rel, st.Uid, st.Gid)
		}
		hdr := &tar.Header{Name: rel, Uid: uid, Gid: gid, Mode: int64(st.Mode & 0o7777),
			ModTime: timeOf(st.Mtim), Format: tar.FormatPAX}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case unix.S_IFREG:
			ino := inode{st.Dev, st.Ino}
			if first, ok := links[ino]; ok && st.Nlink > 1 {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			} else {
				links[ino] = rel
				hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		case unix.S_IFCHR:
			if !isWhiteout(&st) {
				return nil // the runtime gives each sandbox its own /dev
			}
			hdr.Typeflag, hdr.Mode = tar.TypeReg, 0o644
			hdr.Name = filepath.Join(filepath.Dir(rel), whiteoutPrefix+filepath.Base(rel))
		default:
			return nil
		}
		if hdr.Typeflag != tar.TypeLink {
			if err := exportXattrs(p, hdr); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, hdr.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("export %s: %w", rel, err)
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			if v, err := getxattr(p, "trusted.overlay.opaque"); err == nil && string(v) == "y" {
				return tw.WriteHeader(&tar.Header{Name: rel + "/" + whiteoutOpaque, Typeflag: tar.TypeReg, Mode: 0o644,
					ModTime: hdr.ModTime, Format: tar.FormatPAX})
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("export layer: %w", err)
	}
	if v, err := getxattr(dir, "trusted.overlay.opaque"); err == nil && string(v) == "y" {
		if err := tw.WriteHeader(&tar.Header{Name: whiteoutOpaque, Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	return tw.Close()
}

// exportXattrs adds the attributes an import keeps (file capabilities,
// user.*) to hdr.
func exportXattrs(p string, hdr *tar.Header) error {
	size, err := unix.Llistxattr(p, nil)
	if err != nil || size == 0 {
		return nil //nolint:nilerr // no xattrs (or none supported): nothing to keep
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(p, buf); err != nil {
		return fmt.Errorf("list xattrs of %s: %w", p, err)
	}
	for _, name := range splitNul(buf[:size]) {
		if name != "security.capability" && !strings.HasPrefix(name, "user.") {
			continue
		}
		v, err := getxattr(p, name)
		if err != nil {
			return err
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(v)
	}
	return nil
}

func getxattr(p, name string) ([]byte, error) {
	n, err := unix.Lgetxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	v := make([]byte, n)
	if n, err = unix.Lgetxattr(p, name, v); err != nil {
		return nil, fmt.Errorf("get xattr %s of %s: %w", name, p, err)
	}
	return v[:n], nil
}

// ImportLayer extracts a layer tar from r into dst (made here; it must not
// exist) with the image extractor: paths confined to dst, no symlink
// followed, owners shifted into the canonical range. It returns the size
// of the layer's files; on an error dst is removed.
func (s *Store) ImportLayer(ctx context.Context, r io.Reader, dst string) (size int64, err error) {
	if err := os.Mkdir(dst, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return 0, fmt.Errorf("import layer: %s exists", dst)
		}
		return 0, fmt.Errorf("import layer: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dst) // err says why
		}
	}()
	if _, err := extractLayer(ctx, r, dst, s.cfg.UIDBase, nil); err != nil {
		return 0, fmt.Errorf("import layer: %w", err)
	}
	if err := syncFS(dst); err != nil {
		return 0, err
	}
	return DirSize(dst)
}

func timeOf(ts unix.Timespec) time.Time { return time.Unix(ts.Unix()) }
