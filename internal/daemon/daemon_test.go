package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestCheckTraversable(t *testing.T) {
	root := t.TempDir()
	private := filepath.Join(root, "private")
	open := filepath.Join(root, "open")
	for dir, mode := range map[string]os.FileMode{private: 0o700, open: 0o711} {
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	// t.TempDir's own parents may be private on some hosts; make the
	// chain up to root searchable for this test's sake.
	if err := os.Chmod(root, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(root), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := checkTraversable(filepath.Join(open, "data")); err != nil {
		t.Errorf("checkTraversable(under 0711) = %v, want nil", err)
	}
	err := checkTraversable(filepath.Join(private, "data"))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("checkTraversable(under 0700) = %v, want ErrFailedPrecondition", err)
	}
	for _, want := range []string{private, "chmod o+x"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
