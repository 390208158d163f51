package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestSnapshotDaemonKilled: a daemon SIGKILLed while a snapshot copies
// its source's files (the source frozen meanwhile) leaves, after a
// restart, the source running (thawed: a command runs in it), no
// half-written snapshot listed or on disk, and nothing leaked. Both
// levels: runc freezes the source with the cgroup freezer, gVisor with
// runsc pause.
func TestSnapshotDaemonKilled(t *testing.T) {
	forEachIsolation(t, testSnapshotDaemonKilled)
}

func testSnapshotDaemonKilled(t *testing.T, iso string) {
	d := StartDaemon(t)
	ctx := t.Context()
	src := d.Create(t, client.CreateRequest{Isolation: iso, Timeout: "30m", Disk: "2G"})
	// Enough to copy that the snapshot is still copying when the test
	// sees it start.
	MustRun(t, src, "dd if=/dev/zero of=/home/big bs=1M count=256 2>/dev/null && sync && echo data > /home/f")

	snapDir := filepath.Join(d.DataDir, "snapshots")
	done := make(chan error, 1)
	go func() {
		_, err := d.Client.Snapshot(ctx, src.ID, "killed")
		done <- err
	}()
	// The snapshot is copying once its half-written layer appears.
	var copying string
	harness.WaitFor(t, 2*time.Minute, "a half-written snapshot layer", func() bool {
		ms, _ := filepath.Glob(filepath.Join(snapDir, "*.partial", "layer"))
		if len(ms) > 0 {
			copying = ms[0]
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("the snapshot ended (%v) before the test saw it copying", err)
		default:
		}
		return false
	})
	d.Kill9()
	t.Logf("daemon killed while %s was being written", copying)
	if err := <-done; err == nil {
		t.Errorf("the snapshot call succeeded although its daemon was killed while copying")
	}

	d.Start()
	got, err := d.Client.Get(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	switch got.State {
	case client.StateReady:
		// Thawed: its processes run.
		if out := MustRun(t, src, "cat /home/f"); out != "data\n" {
			t.Errorf("the source after the restart: /home/f = %q, want data", out)
		}
	case client.StatePaused, client.StateFailed:
		t.Logf("the source is %s after the restart: %s", got.State, got.Reason)
		if got.Reason == "" {
			t.Errorf("the source is %s after the restart without a reason", got.State)
		}
	default:
		t.Errorf("the source is %s after the restart, want ready (or paused/failed with a reason)", got.State)
	}
	snaps, err := d.Client.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 0 {
		t.Errorf("snapshots listed after the restart: %+v, want none (the killed one was never complete)", snaps)
	}
	ents, _ := os.ReadDir(snapDir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".partial") {
			t.Errorf("half-written snapshot %s left on disk after the restart", e.Name())
		}
	}
	// A snapshot taken now works.
	if got.State == client.StateReady {
		if _, err := d.Client.Snapshot(ctx, src.ID, "after"); err != nil {
			t.Fatalf("snapshot after the restart: %v\n%s", err, d.Logs())
		}
	}
	d.DestroyAll()
	if ss, err := d.Client.Snapshots(ctx); err == nil {
		for _, s := range ss {
			if err := d.Client.RemoveSnapshot(ctx, s.ID); err != nil {
				t.Error(err)
			}
		}
	}
	AssertNoLeaks(t, d)
	harness.AssertSnapshotsClean(t, d)
}
