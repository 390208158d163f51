package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/test/harness"
)

// Checkpointer is the optional ability to save a sandbox's running state
// and bring it back.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, dir string) error
	Restore(ctx context.Context, spec runtime.Spec, dir string) error
}

// testCheckpointRestore: a process that counts in memory keeps counting
// after its sandbox is checkpointed and restored, with its memory
// unchanged, in a network namespace the sandbox has never been in. A
// backend that cannot checkpoint says so with ErrNotImplemented and leaves
// the sandbox running.
func testCheckpointRestore(t *testing.T, h Harness) { checkpointRestore(t, h, false) }

// testCheckpointStopRestore: as CheckpointRestore, with the checkpointed
// sandbox stopped (Stopper) in between, as a paused sandbox is kept: it
// then holds nothing but its disk, and Restore brings its root filesystem
// back.
func testCheckpointStopRestore(t *testing.T, h Harness) { checkpointRestore(t, h, true) }

func checkpointRestore(t *testing.T, h Harness, stop bool) {
	inst := h.New(t)
	stopper, canStop := inst.Backend.(Stopper)
	if stop && (!canStop || !inst.Checkpoints) {
		t.Skip("backend cannot checkpoint and stop")
	}
	cp, ok := inst.Backend.(Checkpointer)
	if !ok {
		t.Skip("backend has no Checkpoint/Restore")
	}
	ctx := t.Context()
	if !inst.Checkpoints {
		id, _ := start(t, h, inst)
		if err := cp.Checkpoint(ctx, id, t.TempDir()); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("Checkpoint = %v, want ErrNotImplemented", err)
		}
		if err := cp.Restore(ctx, h.Spec(t, id), t.TempDir()); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("Restore = %v, want ErrNotImplemented", err)
		}
		if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status != runtime.StatusRunning {
			t.Errorf("Inspect after refused Checkpoint = %+v, %v; want running", st, err)
		}
		return
	}
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	id := NewID()
	spec := h.Spec(t, id)
	spec.NetNSPath = testNetNS(t, id+"a")
	// The counter is the sandbox's init: gVisor releases from 2023 on
	// SIGKILL, at restore, every process that came in through `runsc
	// exec` and its children (a caller no longer connected), while the
	// init and its descendants (every process of a Berth sandbox, as the
	// agent is the init) are restored.
	spec.AgentArgs = []string{"count", "/count"}
	if err := inst.Backend.Create(ctx, spec); err != nil {
		t.Fatalf("Create = %v", err)
	}
	t.Cleanup(func() {
		if err := inst.Backend.Destroy(context.Background(), id); err != nil {
			t.Errorf("Destroy = %v", err)
		}
	})
	var before counter
	harness.WaitFor(t, 30*time.Second, "the counter to count", func() bool {
		before = readCounter(ctx, inst, id)
		return before.n >= 2
	})
	dir := filepath.Join(t.TempDir(), "image")
	t0 := time.Now()
	if err := cp.Checkpoint(ctx, id, dir); err != nil {
		t.Fatalf("Checkpoint = %v", err)
	}
	t.Logf("Checkpoint took %v", time.Since(t0))
	if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status != runtime.StatusStopped {
		t.Errorf("Inspect after Checkpoint = %+v, %v; want stopped", st, err)
	}
	at := readCounter(ctx, inst, id)
	if at.token != "" {
		t.Errorf("counter readable in a checkpointed sandbox: %+v", at)
	}
	if stop {
		if err := stopper.Stop(ctx, id); err != nil {
			t.Fatalf("Stop after Checkpoint = %v", err)
		}
		for _, l := range StoppedSandboxLeaks(inst.Footprint, id) {
			t.Errorf("checkpointed and stopped sandbox holds %s", l)
		}
	}
	restored := spec
	restored.NetNSPath = testNetNS(t, id+"b")
	t0 = time.Now()
	if err := cp.Restore(ctx, restored, dir); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	t.Logf("Restore took %v", time.Since(t0))
	// The image goes as soon as Restore returns, as a resumed sandbox's
	// does: a runtime that loads memory pages after Restore returns (a
	// runsc with restore --background) must read them from files it
	// holds open, and the counter's checksum below, computed again and
	// again over its memory, says whether every page came back.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil || st.Status != runtime.StatusRunning || st.Pid <= 0 {
		t.Fatalf("Inspect after Restore = %+v, %v; want running", st, err)
	}
	var want, got unix.Stat_t
	if err := unix.Stat(restored.NetNSPath, &want); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &got); err != nil {
		t.Fatal(err)
	}
	if want.Ino != got.Ino || want.Dev != got.Dev {
		t.Errorf("restored sandbox netns inode %d, want the new one %d", got.Ino, want.Ino)
	}
	// Counting on means counting after the restore: the count saved in
	// the checkpoint may already be past before's, so progress is
	// measured from the first count read after the restore.
	var first, after counter
	harness.WaitFor(t, 30*time.Second, "the restored counter's file to be readable", func() bool {
		first = readCounter(ctx, inst, id)
		return first.token != ""
	})
	harness.WaitFor(t, 30*time.Second, "the restored counter to count on", func() bool {
		after = readCounter(ctx, inst, id)
		return after.token != "" && after.n > first.n+1
	})
	if first.n < before.n || after.token != before.token || after.sum != before.sum {
		t.Errorf("counter after restore = %+v (first read %+v), before = %+v; want the same token and memory checksum, counting on from where it was", after, first, before)
	}
	t.Logf("counter before %+v, after %+v", before, after)
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	assertGone(t, inst, id)
}

// counter is one line of the test agent's count mode.
type counter struct {
	token string
	n     int
	sum   string
}

func readCounter(ctx context.Context, inst Instance, id string) counter {
	out, err := inst.Exec(ctx, id, "/bin/cat", "/count")
	if err != nil {
		return counter{}
	}
	var c counter
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "%s %d %s", &c.token, &c.n, &c.sum); err != nil {
		return counter{}
	}
	return c
}

// testNetNS makes a named network namespace for the test and returns its
// path; it is deleted when the test ends.
func testNetNS(t *testing.T, suffix string) string {
	t.Helper()
	ipBin, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("ip (iproute2) not installed")
	}
	name := "berth-" + suffix
	if out, err := exec.Command(ipBin, "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(ipBin, "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del: %v: %s", err, out)
		}
	})
	return "/run/netns/" + name
}
