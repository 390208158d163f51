package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestPauseNoDiskRoom: a gVisor pause whose memory image would not fit
// on the disk of the daemon's checkpoint directory (here a 32 MiB tmpfs
// mounted over it, against a sandbox holding 48 MiB) is refused up front
// with resource_exhausted naming the sizes, through the API and the CLI,
// and the sandbox runs on with its memory: runsc ends a sandbox whose
// save fails, so a pause begun there would have lost every process. A
// memory snapshot with no room in the snapshot directory is refused the
// same way. Given room, the same sandbox pauses with its memory and
// resumes counting.
func TestPauseNoDiskRoom(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	ctx := t.Context()
	dir := d.CheckpointDir("")
	unmount := smallDisk(t, dir)
	snapDir := filepath.Join(d.DataDir, "snapshots")
	unmountSnap := smallDisk(t, snapDir)

	sb := d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Memory: "512M", Timeout: "30m"})
	startCounter(t, sb)
	before := readCount(t, sb)
	_, err := d.Client.Pause(ctx, sb.ID)
	if errdefs.Code(err) != errdefs.CodeResourceExhausted || !strings.Contains(err.Error(), "memory image needs about") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("pause with no room for the memory = %v; want resource_exhausted naming the image's size and %s", err, dir)
	}
	if _, stderr, code := d.CLI(t, nil, "pause", sb.ID); code == 0 || !strings.Contains(stderr, "memory image needs about") {
		t.Errorf("berth pause with no room: exit %d, stderr %q; want a failure naming the image's size", code, stderr)
	}
	_, err = d.Client.Snapshot(ctx, sb.ID, "no-room")
	if errdefs.Code(err) != errdefs.CodeResourceExhausted || !strings.Contains(err.Error(), snapDir) {
		t.Errorf("memory snapshot with no room = %v; want resource_exhausted naming %s", err, snapDir)
	}
	got, err := d.Client.Get(ctx, sb.ID)
	if err != nil || got.State != client.StateReady {
		t.Fatalf("after the refused pauses: %+v, %v; want ready", got.Sandbox, err)
	}
	assertCounting(t, sb, before, "after the refused pauses and snapshot")
	for _, p := range []string{dir, snapDir} {
		if ents, err := os.ReadDir(p); err != nil || len(ents) != 0 {
			t.Errorf("%s after the refusals: %d entries, %v; want none", p, len(ents), err)
		}
	}

	// The leak checks below see the test's own mounts too.
	unmount()
	unmountSnap()
	before = readCount(t, sb)
	p, err := d.Client.Pause(ctx, sb.ID)
	if err != nil || p.Pause != client.PauseMemory {
		t.Fatalf("pause with room = %+v, %v; want a memory pause", p.Sandbox, err)
	}
	harness.AssertPausedClean(t, d, sb.ID)
	if _, err := d.Client.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	assertCounting(t, sb, before, "after a pause with room")
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// smallDisk mounts a 32 MiB tmpfs over dir (made if missing) until the
// test ends or the returned func unmounts it.
func smallDisk(t *testing.T, dir string) (unmount func()) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "berth-test-small", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs at %s: %v %s", dir, err, out)
	}
	mounted := true
	unmount = func() {
		if mounted {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v %s", dir, err, out)
			}
			mounted = false
		}
	}
	t.Cleanup(unmount)
	return unmount
}
