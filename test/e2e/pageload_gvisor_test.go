package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestLoadFailsAfterResumeGVisor: a gVisor sandbox resumed from its
// memory checkpoint whose memory load fails after the resume answered
// (a restore in the background: the sandbox runs while its pages are read
// in). The checkpoint is served to the daemon through FUSE, and reads of
// a stretch of its pages file that only the /dev/shm file holds (found by
// its bytes) wait until the test lets them fail with EIO. The resume
// answers and the sandbox runs commands while they wait; once they fail,
// the daemon stops the sandbox with the load's failure as its reason, and
// nothing of it is left on the host.
func TestLoadFailsAfterResumeGVisor(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	if !strings.Contains(d.Logs(), "background_restore=true") {
		t.Skip("this runsc restores everything before it returns (no restore --background)")
	}
	ctx := t.Context()
	sb := d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Memory: "512M", Timeout: "30m"})
	if got := MustRun(t, sb, harness.PatternScript("/dev/shm/hold", 32<<20)); got != "held\n" {
		t.Fatalf("the pattern's script = %q", got)
	}
	if p, err := d.Client.Pause(ctx, sb.ID); err != nil || p.Pause != client.PauseMemory {
		t.Fatalf("Pause = %+v, %v; want paused with memory", p, err)
	}
	d.WaitCheckpointFlushed(t, sb.ID)

	// The checkpoint moves out, and the daemon finds it again, through a
	// symbolic link, in a FUSE mount of it.
	image := filepath.Join(t.TempDir(), "image")
	if err := os.Rename(d.CheckpointDir(sb.ID), image); err != nil {
		t.Fatal(err)
	}
	const pages = "pages.img"
	from, to := harness.HeldStretch(t, filepath.Join(image, pages))
	mnt := t.TempDir()
	gate := harness.ServeHeld(t, image, mnt, pages, from, to)
	if err := os.Symlink(mnt, d.CheckpointDir(sb.ID)); err != nil {
		t.Fatal(err)
	}
	// Before the unmount: the sentry holds the image's files open until
	// its load ends or it is gone. (Not with ctx, which ends before the
	// cleanups run.)
	t.Cleanup(func() { _ = d.Client.Kill(context.Background(), sb.ID) })

	resumed := make(chan error, 1)
	go func() {
		_, err := d.Client.Resume(ctx, sb.ID, 0)
		resumed <- err
	}()
	select {
	case err := <-resumed:
		if err != nil {
			t.Fatalf("Resume with part of the pages held = %v\n%s", err, d.Logs())
		}
	case <-time.After(2 * time.Minute):
		gate.Release()
		t.Fatalf("Resume did not answer while part of the pages was held (a held read came: %v)", gate.WasHeld())
	}
	select {
	case <-gate.Held():
	case <-time.After(2 * time.Minute):
		t.Fatal("no read of the held pages came after the resume")
	}
	// It runs while its load waits.
	if got := MustRun(t, sb, "echo up"); got != "up\n" {
		t.Fatalf("a command while the load waits = %q", got)
	}
	if got, err := d.Client.Get(ctx, sb.ID); err != nil || got.State != client.StateReady {
		t.Fatalf("Get while the load waits = %+v, %v; want ready", got, err)
	}

	gate.Release()
	var got *client.Sandbox
	waitFor(t, 2*time.Minute, "the daemon to stop the sandbox whose memory load failed", func() bool {
		var err error
		got, err = d.Client.Get(ctx, sb.ID)
		return err == nil && got.State == client.StateStopped
	})
	t.Logf("stopped: %s", got.Reason)
	if !strings.Contains(got.Reason, "memory image load failed after the resume") {
		t.Errorf("stopped sandbox's reason = %q, want the memory load's failure", got.Reason)
	}
	if types := eventTypes(t, d, sb.ID); len(types) == 0 || types[len(types)-1] != client.EventDestroyed {
		t.Errorf("events after the load failed = %v, want it to end with %s", types, client.EventDestroyed)
	}
	harness.AssertNoLeaks(t, d)
}
