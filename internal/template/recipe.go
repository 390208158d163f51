package template

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// recipe is how one built-in template is made.
type recipe struct {
	description string
	// sourceHash identifies the build's inputs; it names cache entries
	// and is recorded in the manifest.
	sourceHash func(s *Store) (string, error)
	// build fills dst, an empty directory, with the finished layer, owned
	// as the sandbox will see it (shifted by the store's uid base).
	build func(ctx context.Context, s *Store, dst string, log io.Writer) error
}

// builtinRecipes returns the templates berth knows how to build.
func builtinRecipes() map[string]recipe {
	return map[string]recipe{
		"minimal": {
			description: "busybox (static) with a root and a user account; starts in milliseconds",
			sourceHash:  minimalHash,
			build:       buildMinimal,
		},
		"base": {
			description: "Debian bookworm (minbase) with bash, python (3) and pip, node and npm, git, curl, and a user account with sudo",
			sourceHash:  baseHash,
			build:       buildBase,
		},
	}
}

// layerWriter writes entries into a layer being built, with ownership given
// as the sandbox sees it and shifted on the way to disk.
type layerWriter struct {
	root string
	base uint32
}

func (w layerWriter) path(rel string) string {
	return filepath.Join(w.root, filepath.FromSlash(strings.TrimPrefix(rel, "/")))
}

func (w layerWriter) chown(p string, uid, gid uint32) error {
	su, sg, err := shiftIDs(w.base, uid, gid)
	if err != nil {
		return err
	}
	if err := unix.Lchown(p, int(su), int(sg)); err != nil {
		return fmt.Errorf("chown %s: %w", p, err)
	}
	return nil
}

// dir creates rel (if missing) and sets its owner and mode.
func (w layerWriter) dir(rel string, mode uint32, uid, gid uint32) error {
	p := w.path(rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	if err := w.chown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}

// file writes rel (replacing it if present) with the given owner and mode.
func (w layerWriter) file(rel, content string, mode uint32, uid, gid uint32) error {
	p := w.path(rel)
	os.Remove(p) // might be a symlink or hardlink into something else
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		return err
	}
	if err := w.chown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}

// symlink creates rel pointing at target, owned by root.
func (w layerWriter) symlink(rel, target string) error {
	p := w.path(rel)
	if err := os.Symlink(target, p); err != nil {
		return err
	}
	return w.chown(p, 0, 0)
}

// copyFile copies the host file src to rel with the given owner and mode.
func (w layerWriter) copyFile(src, rel string, mode uint32, uid, gid uint32) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	p := w.path(rel)
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := w.chown(p, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(p, mode)
}

// appendLine appends line to rel unless a line with the same first
// colon-separated field is already there, keeping the file's owner and mode.
func (w layerWriter) appendLine(rel, line string) error {
	p := w.path(rel)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	key := strings.SplitN(line, ":", 2)[0] + ":"
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key) {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	b = append(b, line+"\n"...)
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	// Rewrite in place: the file's inode keeps its owner, mode and xattrs.
	return os.WriteFile(p, b, os.FileMode(st.Mode&0o777))
}
