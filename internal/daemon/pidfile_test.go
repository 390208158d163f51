package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestLockDataDirPIDFile(t *testing.T) {
	dir := t.TempDir()
	pidPath := filepath.Join(dir, PIDFile)
	// A stale pid file (its daemon died without removing it) is replaced.
	if err := os.WriteFile(pidPath, []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unlock, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lockDataDir over a stale pid file: %v", err)
	}
	b, err := os.ReadFile(pidPath)
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("pid file = %q, %v; want %d", b, err, os.Getpid())
	}
	// A second daemon on the same data dir is refused, naming the first.
	_, err = lockDataDir(dir)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("second lockDataDir = %v, want failed precondition naming pid %d", err, os.Getpid())
	}
	if b2, _ := os.ReadFile(pidPath); string(b2) != string(b) {
		t.Errorf("the refused daemon rewrote the pid file: %q", b2)
	}
	unlock()
	if _, err := os.Stat(pidPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file after a clean exit: %v, want gone", err)
	}
	unlock2, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lockDataDir after release: %v", err)
	}
	unlock2()
}
