package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-sandbox/berth/errdefs"
)

// PIDFile is the daemon's pid file in its data dir: written once the data
// dir's lock is held, removed on a clean exit. One left by a daemon that
// died is stale (its lock went with it) and is overwritten.
const PIDFile = "berth.pid"

// lockDataDir takes the data dir's lock (berth.lock, flock: released by
// the kernel however the daemon ends) and writes the pid file; the
// returned func removes the pid file and releases the lock. A second
// daemon on the same data dir is refused, naming the one that holds it.
func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "berth.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		holder := "another berth daemon"
		if pid, ok := readPID(dir); ok {
			holder = fmt.Sprintf("berth daemon pid %d (%s)", pid, filepath.Join(dir, PIDFile))
		}
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by %s; stop it first or pick another --data-dir: %w", dir, holder, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	pidPath := filepath.Join(dir, PIDFile)
	// Whatever is there is stale: whoever wrote it no longer holds the lock.
	if err := writeFileAtomic(pidPath, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		f.Close()
		return nil, fmt.Errorf("pid file: %w", err)
	}
	return func() {
		os.Remove(pidPath)
		f.Close()
	}, nil
}

// readPID reads the pid file of the data dir.
func readPID(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, PIDFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// writeFileAtomic writes data to path through a temporary file and a
// rename, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
