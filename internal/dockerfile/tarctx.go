package dockerfile

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// MaxContext bounds the bytes of a build context sent to the daemon.
const MaxContext = types.MaxBuildContext

// ExtractContext unpacks a build context tar (as the CLI sends it) into
// dir, an empty directory. Names are confined to dir lexically and every
// write goes through an os.Root, so neither "../" nor a symlink in the
// archive leads out; only directories, regular files and symlinks are
// made, owned by the daemon. Errors are ErrInvalidArgument.
func ExtractContext(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(io.LimitReader(r, MaxContext+1))
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("build context: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		rel := cleanRel(h.Name)
		if rel == "." {
			continue
		}
		if d := path.Dir(rel); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("build context %s: %v: %w", h.Name, err, errdefs.ErrInvalidArgument)
			}
		}
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(rel, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("build context %s: %v: %w", h.Name, err, errdefs.ErrInvalidArgument)
			}
			err = root.Chmod(rel, mode|0o700)
		case tar.TypeReg:
			total += h.Size
			if total > MaxContext {
				return fmt.Errorf("build context is larger than %d bytes: %w", int64(MaxContext), errdefs.ErrInvalidArgument)
			}
			_ = root.Remove(rel)
			var f *os.File
			if f, err = root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err == nil {
					err = root.Chmod(rel, mode)
				}
			}
		case tar.TypeSymlink:
			_ = root.Remove(rel)
			err = root.Symlink(h.Linkname, rel)
		default:
			continue // hard links, devices, fifos: not part of a context
		}
		if err != nil {
			return fmt.Errorf("build context %s: %v: %w", h.Name, err, errdefs.ErrInvalidArgument)
		}
	}
}
