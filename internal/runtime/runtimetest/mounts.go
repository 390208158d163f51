package runtimetest

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// volumeDir makes a host directory owned by the canonical range's root
// (base), holding file f (owned by canonical uid base+1000, "from-host").
func volumeDir(t *testing.T, base uint32) string {
	t.Helper()
	dir := filepath.Join(SandboxReadableDir(t), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, []byte("from-host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		id   uint32
	}{{dir, base}, {f, base + 1000}} {
		if err := os.Chown(c.path, int(c.id), int(c.id)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// testMounts: a Spec's Mounts appear in the sandbox at their
// destinations, with the canonical range's owners mapped onto the
// sandbox's (base+1000 is the sandbox's 1000); what the sandbox writes
// lands on the host dir owned by base+its uid, and what the host writes
// shows in the sandbox; a read-only mount refuses writes, also under
// /tmp; the host keeps no mount of its own while the sandbox runs; a
// stop and start (and a checkpoint and restore) bind them again; a bad
// mount is refused and leaves nothing.
func testMounts(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil || inst.UIDBase == 0 {
		t.Skip("harness has no Exec or no canonical uid base")
	}
	ctx := t.Context()
	base := inst.UIDBase
	rw, ro := volumeDir(t, base), volumeDir(t, base)
	id := NewID()
	spec := h.Spec(t, id)
	spec.Mounts = []runtime.Mount{
		{Source: rw, Destination: "/data"},
		{Source: ro, Destination: "/tmp/ro", ReadOnly: true},
	}
	if inst.MountsGap != "" {
		if err := inst.Backend.Create(ctx, spec); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("Create with mounts = %v, want ErrNotImplemented (%s)", err, inst.MountsGap)
		}
		assertGone(t, inst, id)
		return
	}
	if err := inst.Backend.Create(ctx, spec); err != nil {
		t.Fatalf("Create with mounts = %v", err)
	}
	t.Cleanup(func() { _ = inst.Backend.Destroy(ctx, id) })
	sh := func(script string) (string, error) {
		t.Helper()
		out, err := inst.Exec(ctx, id, "/bin/sh", "-c", script)
		return strings.TrimSpace(string(out)), err
	}
	check := func(round string) {
		t.Helper()
		if out, err := sh("stat -c '%u %g' /data/f; cat /data/f /tmp/ro/f"); err != nil || out != "1000 1000\nfrom-host\nfrom-host" {
			t.Fatalf("%s: owner and contents in the sandbox = %q, %v; want 1000 1000 and from-host twice", round, out, err)
		}
		if out, err := sh("echo nope > /tmp/ro/w"); err == nil || !strings.Contains(out, "Read-only") {
			t.Errorf("%s: a write on the read-only mount = %q, %v; want refused (read-only)", round, out, err)
		}
		if _, err := os.Stat(filepath.Join(ro, "w")); err == nil {
			t.Errorf("%s: the read-only mount's host dir got the sandbox's write", round)
		}
		mps, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(inst.Footprint.StateDir, id, "vol")))
		if err != nil || len(mps) > 0 {
			t.Errorf("%s: host mounts under the sandbox's vol dir = %d, %v; want none", round, len(mps), err)
		}
	}
	check("after create")
	uid, err := sh("id -u")
	if err != nil {
		t.Fatalf("id -u: %v: %s", err, uid)
	}
	n, err := strconv.Atoi(uid)
	if err != nil {
		t.Fatalf("id -u = %q", uid)
	}
	if out, err := sh("echo from-sandbox > /data/w"); err != nil {
		t.Fatalf("write on the mount: %v: %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(rw, "w"))
	if err != nil || string(b) != "from-sandbox\n" {
		t.Fatalf("host reads the sandbox's write = %q, %v", b, err)
	}
	if owner := fileOwner(t, filepath.Join(rw, "w")); owner != base+uint32(n) {
		t.Errorf("the sandbox's file (uid %d inside) is owned by host uid %d, want %d", n, owner, base+uint32(n))
	}
	if err := os.WriteFile(filepath.Join(rw, "late"), []byte("later\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := sh("cat /data/late"); err != nil || out != "later" {
		t.Errorf("a host write after the start, in the sandbox = %q, %v", out, err)
	}
	if s, ok := inst.Backend.(Stopper); ok {
		if err := s.Stop(ctx, id); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		for _, l := range StoppedSandboxLeaks(inst.Footprint, id) {
			t.Errorf("stopped sandbox with mounts holds %s", l)
		}
		if err := s.Start(ctx, spec); err != nil {
			t.Fatalf("Start = %v", err)
		}
		check("after stop and start")
	}
	if cp, ok := inst.Backend.(Checkpointer); ok && inst.Checkpoints {
		dir := filepath.Join(t.TempDir(), "image")
		if err := cp.Checkpoint(ctx, id, dir); err != nil {
			t.Fatalf("Checkpoint = %v", err)
		}
		if err := cp.Restore(ctx, spec, dir); err != nil {
			t.Fatalf("Restore = %v", err)
		}
		check("after checkpoint and restore")
		if out, err := sh("cat /data/w"); err != nil || out != "from-sandbox" {
			t.Errorf("the sandbox's write after the restore = %q, %v", out, err)
		}
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	assertGone(t, inst, id)
	if b, err := os.ReadFile(filepath.Join(rw, "w")); err != nil || string(b) != "from-sandbox\n" {
		t.Errorf("the mount's files after Destroy = %q, %v; want kept", b, err)
	}

	// Refused before anything is made.
	for _, bad := range []runtime.Mount{
		{Source: rw, Destination: "/proc/x"},
		{Source: rw, Destination: "data"},
		{Source: "rel", Destination: "/data"},
		{Source: filepath.Join(rw, "f"), Destination: "/data"},
	} {
		id := NewID()
		spec := h.Spec(t, id)
		spec.Mounts = []runtime.Mount{bad}
		if err := inst.Backend.Create(ctx, spec); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create with mount %+v = %v, want ErrInvalidArgument", bad, err)
			_ = inst.Backend.Destroy(ctx, id)
		}
		assertGone(t, inst, id)
	}
}

func fileOwner(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}
