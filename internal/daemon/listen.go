package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/berth-sandbox/berth/errdefs"
)

// SocketName is the daemon's local socket in its data dir.
const SocketName = "berth.sock"

// SocketPath is the local socket of the daemon with data dir dataDir.
func SocketPath(dataDir string) string { return filepath.Join(dataDir, SocketName) }

// checkExposure refuses to serve an unauthenticated API beyond loopback:
// whoever reaches it would own every sandbox on the host.
func checkExposure(cfg Config) error {
	if cfg.RequireAuth || cfg.InsecureNoAuth || LoopbackOnly(cfg.Listen) {
		return nil
	}
	return fmt.Errorf("listen %s reaches beyond loopback, and the API would accept requests without a key: run with --require-auth (and create keys with `berth apikey create`), or with --insecure-no-auth to serve it unauthenticated anyway: %w",
		cfg.Listen, errdefs.ErrFailedPrecondition)
}

// LoopbackOnly reports whether a listen address binds loopback only.
func LoopbackOnly(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// listenSocket listens on the root-only unix socket at path, replacing a
// stale one (the data dir lock says no other daemon owns it).
func listenSocket(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("local socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("local socket: %w", err)
	}
	// Listen creates it with the umask's mode: narrow it before anyone
	// can connect through the (0711) data dir.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("local socket: %w", err)
	}
	return ln, nil
}
