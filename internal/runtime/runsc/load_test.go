package runsc_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
	th "github.com/berth-sandbox/berth/test/harness"
)

// TestLoadFailsAfterRestore: a sandbox restored in the background (runsc
// restore --background) whose memory load fails after Restore returned.
// The sandbox writes 8 MiB of pages of a known pattern to its /dev/shm
// (the sentry's memory) before the checkpoint. The checkpoint is served
// through FUSE, and reads of a stretch of its pages file that holds only
// those pages (found by their bytes; the restore itself needs none of
// them) are held until the test lets them fail (EIO): Restore returns
// while those reads wait, the sandbox runs (a command too), WaitRestored
// waits; once they fail, WaitRestored fails (with the sentry's "async
// MemoryFile loading failed: I/O error" when its runsc reached the sentry
// before the sentry ended the sandbox, else with runsc's failure to ask),
// the sandbox's processes are gone, and Destroy leaves nothing. (runsc
// opens the image as root; the sentry reads it from its own user
// namespace, which a FUSE mount admits only with allow_other.) The
// daemon's handling of such a failure is e2e's
// TestLoadFailsAfterResumeGVisor.
func TestLoadFailsAfterRestore(t *testing.T) {
	h := newHarness(t)
	bin, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	if help, _ := exec.Command(bin, "help", "restore").CombinedOutput(); !bytes.Contains(help, []byte("-background")) {
		t.Skip("this runsc restores everything before it returns (no restore --background)")
	}
	inst := h.New(t)
	pl, ok := inst.Backend.(runtimetest.PageLoader)
	if !ok {
		t.Fatal("runsc runtime cannot wait for a load")
	}
	ctx := t.Context()
	id, spec, image := checkpointed(t, h, inst, 8<<20)
	cp := inst.Backend.(runtimetest.Checkpointer)
	const pages = "pages.img"
	from, to := th.HeldStretch(t, filepath.Join(image, pages))
	mnt := t.TempDir()
	gate := th.ServeHeld(t, image, mnt, pages, from, to)
	// Before the unmount, whatever the test leaves (the sentry holds
	// the image's files open until its load ends or it is gone).
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })

	restored := make(chan error, 1)
	go func() { restored <- cp.Restore(ctx, spec, mnt) }()
	select {
	case err := <-restored:
		if err != nil {
			t.Fatalf("Restore with a stretch of the pages held = %v", err)
		}
	case <-time.After(2 * time.Minute):
		gate.Release()
		t.Fatalf("Restore did not return while a stretch of the pages was held (held reads: %v)", gate.WasHeld())
	}
	if s, err := inst.Backend.Inspect(ctx, id); err != nil || s.Status != runtime.StatusRunning {
		t.Fatalf("Inspect after Restore = %+v, %v; want running", s, err)
	}
	// The load reaches the held stretch (bounded by a generous limit),
	// then those reads fail.
	select {
	case <-gate.Held():
	case <-time.After(2 * time.Minute):
		t.Fatal("no read of the held stretch of the pages came after Restore")
	}
	// It runs while its load waits.
	if out, err := inst.Exec(ctx, id, "/bin/echo", "up"); err != nil || string(out) != "up\n" {
		t.Fatalf("a command while the load waits = %q, %v", out, err)
	}
	loaded := make(chan error, 1)
	go func() { loaded <- pl.WaitRestored(ctx, id) }()
	select {
	case err := <-loaded:
		t.Fatalf("WaitRestored = %v before the held reads ended; want it to wait for the load", err)
	default:
	}
	gate.Release()
	if err := <-loaded; err == nil {
		t.Fatal("WaitRestored after reads of the pages failed = nil; want the load's failure")
	} else {
		t.Logf("WaitRestored = %v", err)
	}
	th.WaitFor(t, 60*time.Second, "the sandbox to stop after its memory load failed", func() bool {
		s, err := inst.Backend.Inspect(ctx, id)
		return err != nil || s.Status != runtime.StatusRunning
	})
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}
