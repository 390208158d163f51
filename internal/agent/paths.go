package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

var errBadPath = errors.New("invalid path")

// resolvePath turns a client path into an absolute, cleaned one: "~" and
// "~/x" expand to home, relative paths are taken from home (as envd does).
// It does not touch the filesystem: the agent runs inside the sandbox's own
// mount namespace, so there is no host tree to escape into, and symlinks are
// the sandbox's business.
func resolvePath(p, home string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path contains NUL byte: %w", errBadPath)
	}
	if home == "" || !filepath.IsAbs(home) {
		home = "/"
	}
	switch {
	case p == "":
		return filepath.Clean(home), nil
	case p == "~":
		return filepath.Clean(home), nil
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(home, p[2:]), nil
	case p[0] == '~':
		return "", fmt.Errorf("path %q: cannot expand another user's home: %w", p, errBadPath)
	case filepath.IsAbs(p):
		return filepath.Clean(p), nil
	default:
		return filepath.Join(home, p), nil
	}
}
