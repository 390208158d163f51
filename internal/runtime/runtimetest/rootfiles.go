package runtimetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// rootWriter is a backend that reaches a sandbox's root filesystem from
// the host (the sandbox package's RootWriter).
type rootWriter interface {
	ReadRootFile(id, path string, max int64) ([]byte, error)
	WriteRootFile(id, path string, data []byte) error
}

// testRootFiles: from the BeforeStart hook (where a create uses it), a
// write makes missing directories and a file owned by the sandbox's root
// that the sandbox then reads; a read returns a layer's file and refuses
// one over its bound; a missing file is ErrNotFound; a template's
// symlinks resolve inside the root, never onto the host, even when they
// point at a host path by name; a FIFO is refused both ways; a bad path
// is ErrInvalidArgument.
func testRootFiles(t *testing.T, h Harness) {
	inst := h.New(t)
	rw, ok := inst.Backend.(rootWriter)
	if !ok {
		t.Skip("backend cannot reach a sandbox's root from the host")
	}
	if inst.Exec == nil || inst.UIDBase == 0 {
		t.Skip("harness has no Exec or no canonical uid base")
	}
	hostDir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(hostDir, "secret"), []byte("the host's"), 0o644))
	layer := filepath.Join(SandboxReadableDir(t), "layer")
	for _, d := range []string{"etc/ssl/certs", "etc/tricks"} {
		if err := os.MkdirAll(filepath.Join(layer, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bundle := "-----BEGIN CERTIFICATE-----\nsystem\n-----END CERTIFICATE-----\n"
	must(t, os.WriteFile(filepath.Join(layer, "etc/ssl/certs/ca-certificates.crt"), []byte(bundle), 0o644))
	// By name, the host's directory; in the sandbox, a path under its root.
	must(t, os.Symlink(hostDir, filepath.Join(layer, "etc/tricks/host")))
	must(t, os.Symlink("../../../../../../.."+hostDir, filepath.Join(layer, "etc/tricks/up")))
	must(t, unix.Mkfifo(filepath.Join(layer, "etc/tricks/fifo"), 0o644))
	must(t, filepath.Walk(layer, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(inst.UIDBase), int(inst.UIDBase))
	}))

	id := NewID()
	spec := h.Spec(t, id)
	spec.Layers = append(spec.Layers, layer)
	var hookErrs []string
	fail := func(format string, err error) {
		hookErrs = append(hookErrs, strings.ReplaceAll(format, "%v", errString(err)))
	}
	spec.BeforeStart = func(context.Context, int) error {
		if err := rw.WriteRootFile(id, "/etc/berth/new/file", []byte("from the host\n")); err != nil {
			fail("write a new file: %v", err)
		}
		if b, err := rw.ReadRootFile(id, "/etc/ssl/certs/ca-certificates.crt", 1<<20); err != nil || string(b) != bundle {
			fail("read a layer's file: %v", err)
		}
		if _, err := rw.ReadRootFile(id, "/etc/ssl/certs/ca-certificates.crt", 8); err == nil {
			fail("read over its bound succeeded: %v", err)
		}
		if _, err := rw.ReadRootFile(id, "/etc/none", 1<<20); !errors.Is(err, errdefs.ErrNotFound) {
			fail("read a missing file: %v, want ErrNotFound", err)
		}
		// Written or refused, never on the host.
		_ = rw.WriteRootFile(id, "/etc/tricks/host/planted", []byte("x"))
		_ = rw.WriteRootFile(id, "/etc/tricks/up/planted-up", []byte("x"))
		for _, p := range []string{"/etc/tricks/host/secret", "/etc/tricks/up/secret"} {
			if b, err := rw.ReadRootFile(id, p, 1<<20); !errors.Is(err, errdefs.ErrNotFound) {
				fail("read "+p+" through a template's symlink: "+string(b)+" %v, want ErrNotFound", err)
			}
		}
		if err := rw.WriteRootFile(id, "/etc/tricks/fifo", []byte("x")); err == nil {
			fail("write to a FIFO succeeded: %v", err)
		}
		if _, err := rw.ReadRootFile(id, "/etc/tricks/fifo", 1<<20); err == nil {
			fail("read of a FIFO succeeded: %v", err)
		}
		for _, p := range []string{"etc/hosts", "/etc/../etc/hosts", "/", ""} {
			if err := rw.WriteRootFile(id, p, []byte("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
				fail("write to path "+p+": %v, want ErrInvalidArgument", err)
			}
		}
		return nil
	}
	if err := inst.Backend.Create(t.Context(), spec); err != nil {
		t.Fatalf("Create = %v", err)
	}
	t.Cleanup(func() { _ = inst.Backend.Destroy(context.Background(), id) })
	for _, e := range hookErrs {
		t.Error(e)
	}
	for _, name := range []string{"planted", "planted-up", "secret"} {
		b, err := os.ReadFile(filepath.Join(hostDir, name))
		if name == "secret" && string(b) != "the host's" || name != "secret" && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a write through a template's symlink reached the host: %s: %q, %v", name, b, err)
		}
	}
	out, err := inst.Exec(t.Context(), id, "/bin/cat", "/etc/berth/new/file")
	if err != nil || string(out) != "from the host\n" {
		t.Errorf("the sandbox reads %q, %v, want the host's write", out, err)
	}
	for _, p := range []string{"/etc/berth/new/file", "/etc/berth"} {
		out, err = inst.Exec(t.Context(), id, "/bin/ls", "-lnd", p)
		if f := strings.Fields(string(out)); err != nil || len(f) < 4 || f[2] != "0" || f[3] != "0" {
			t.Errorf("ls -lnd %s in the sandbox = %q, %v, want owned by its root (0 0)", p, out, err)
		}
	}
	if _, err := rw.ReadRootFile("no-such-sandbox", "/etc/hosts", 1<<20); err == nil {
		t.Error("ReadRootFile of an unknown sandbox succeeded")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
