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
	"github.com/berth-sandbox/berth/internal/template"
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
	id, spec, before := startCounter(t, h, inst)
	// A sandbox that never came from an image has nothing loading.
	checkLoaded(t, inst.Backend, id)
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
	after := checkCountsOn(t, inst, id, restored.NetNSPath, before)
	t.Logf("counter before %+v, after %+v", before, after)
	// A restarted daemon asks about the load of a sandbox it adopts
	// (its pages may still be loading), then this one asks again.
	if inst.Reopen != nil {
		checkLoaded(t, inst.Reopen(t), id)
	}
	checkLoaded(t, inst.Backend, id)
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	assertGone(t, inst, id)
}

// PageLoader is the optional ability of a backend whose Restore returns
// before the sandbox's memory is all back to wait for the rest (gVisor's
// background restore): nil once every page is in, an error if the load
// failed (the sandbox's processes are then killed).
type PageLoader interface {
	WaitRestored(ctx context.Context, id string) error
}

// checkLoaded checks that sandbox id's memory load, where it goes on
// after a restore, ends well, as b (a backend of the instance, or one
// reopened as a restarted daemon would) sees it.
func checkLoaded(t *testing.T, b Backend, id string) {
	t.Helper()
	if pl, ok := b.(PageLoader); ok {
		if err := pl.WaitRestored(t.Context(), id); err != nil {
			t.Errorf("WaitRestored after a good restore = %v", err)
		}
	}
}

// testCutShortImage: a checkpoint whose biggest file (a memory image's
// pages) lost its second half is never restored as if whole. Either
// Restore fails, leaving the sandbox stopped, or (a backend that loads
// pages after Restore returns) the load fails: WaitRestored says so and
// the sandbox's processes are killed. Destroy then leaves nothing.
func testCutShortImage(t *testing.T, h Harness) {
	inst := h.New(t)
	cp, ok := inst.Backend.(Checkpointer)
	stopper, canStop := inst.Backend.(Stopper)
	if !ok || !canStop || !inst.Checkpoints || inst.Exec == nil {
		t.Skip("backend cannot checkpoint")
	}
	ctx := t.Context()
	id, spec, _ := startCounter(t, h, inst)
	dir := filepath.Join(t.TempDir(), "image")
	if err := cp.Checkpoint(ctx, id, dir); err != nil {
		t.Fatalf("Checkpoint = %v", err)
	}
	if err := stopper.Stop(ctx, id); err != nil {
		t.Fatalf("Stop after Checkpoint = %v", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var biggest string
	var size int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.Size() > size {
			biggest, size = e.Name(), fi.Size()
		}
	}
	if biggest == "" {
		t.Fatalf("no file in the checkpoint %s", dir)
	}
	if err := os.Truncate(filepath.Join(dir, biggest), size/2); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut %s from %d to %d bytes", biggest, size, size/2)
	spec.NetNSPath = testNetNS(t, id+"c")
	if err := cp.Restore(ctx, spec, dir); err != nil {
		t.Logf("Restore = %v", err)
		if st, err := inst.Backend.Inspect(ctx, id); err == nil && st.Status == runtime.StatusRunning {
			t.Errorf("after a failed Restore the sandbox is running")
		}
	} else {
		pl, ok := inst.Backend.(PageLoader)
		if !ok {
			t.Fatalf("Restore from a cut image succeeded, and the backend has no WaitRestored to say the load failed")
		}
		err := pl.WaitRestored(ctx, id)
		t.Logf("WaitRestored = %v", err)
		if err == nil {
			t.Fatalf("WaitRestored after a restore from a cut image = nil; want the load's failure")
		}
		// The runtime kills the sandbox's processes once its load has
		// failed: Inspect reports it, bounded by a generous limit.
		harness.WaitFor(t, 60*time.Second, "the sandbox to stop after its memory load failed", func() bool {
			st, err := inst.Backend.Inspect(ctx, id)
			return err != nil || st.Status != runtime.StatusRunning
		})
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	assertGone(t, inst, id)
}

// RestorePreparer is the optional ability to make, ahead of a restore,
// the sandbox a checkpointed one is restored into (gVisor's `runsc
// create`), so the restore itself is shorter.
type RestorePreparer interface {
	PrepareRestore(ctx context.Context, spec runtime.Spec, dir string) error
}

// testPrepareRestore: a checkpointed and stopped sandbox prepared for its
// restore holds more than a stopped one (the prepared sandbox's processes
// and root filesystem), and a Stop then leaves only what a stop leaves. A
// Restore into a prepared sandbox brings the counter back with its memory
// in the network namespace the restore's BeforeStart hook was given (not
// the host's), which the prepared sandbox waited in.
func testPrepareRestore(t *testing.T, h Harness) {
	inst := h.New(t)
	pr, ok := inst.Backend.(RestorePreparer)
	stopper, canStop := inst.Backend.(Stopper)
	cp, canCheckpoint := inst.Backend.(Checkpointer)
	if !ok || !canStop || !canCheckpoint || !inst.Checkpoints || inst.Exec == nil {
		t.Skip("backend cannot prepare a restore")
	}
	ctx := t.Context()
	id, spec, before := startCounter(t, h, inst)
	dir := filepath.Join(t.TempDir(), "image")
	if err := cp.Checkpoint(ctx, id, dir); err != nil {
		t.Fatalf("Checkpoint = %v", err)
	}
	if err := stopper.Stop(ctx, id); err != nil {
		t.Fatalf("Stop after Checkpoint = %v", err)
	}
	spec.NetNSPath = ""
	if err := pr.PrepareRestore(ctx, spec, dir); errors.Is(err, errdefs.ErrNotImplemented) {
		// This one cannot: the stopped sandbox is left as it was, and
		// restores as without.
		for _, l := range StoppedSandboxLeaks(inst.Footprint, id) {
			t.Errorf("after a refused PrepareRestore the stopped sandbox holds %s", l)
		}
		if err := cp.Restore(ctx, spec, dir); err != nil {
			t.Fatalf("Restore after a refused PrepareRestore = %v", err)
		}
		checkCountsOn(t, inst, id, netnsOf(t, inst, id), before)
		return
	} else if err != nil {
		t.Fatalf("PrepareRestore = %v", err)
	}
	if len(StoppedSandboxLeaks(inst.Footprint, id)) == 0 {
		t.Errorf("a prepared sandbox holds no more than a stopped one")
	}
	if err := stopper.Stop(ctx, id); err != nil {
		t.Fatalf("Stop of a prepared sandbox = %v", err)
	}
	for _, l := range StoppedSandboxLeaks(inst.Footprint, id) {
		t.Errorf("a prepared sandbox, stopped, holds %s", l)
	}
	if err := pr.PrepareRestore(ctx, spec, dir); err != nil {
		t.Fatalf("PrepareRestore after a Stop = %v", err)
	}
	var host, hooked unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		t.Fatal(err)
	}
	hookedPid := 0
	spec.BeforeStart = func(_ context.Context, pid int) error {
		hookedPid = pid
		return unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &hooked)
	}
	if err := cp.Restore(ctx, spec, dir); err != nil {
		t.Fatalf("Restore into the prepared sandbox = %v", err)
	}
	if hookedPid == 0 || hooked.Ino == host.Ino {
		t.Fatalf("BeforeStart got pid %d, netns %d (the host's %d)", hookedPid, hooked.Ino, host.Ino)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("Inspect after Restore = %+v, %v", st, err)
	}
	var now unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &now); err != nil || now.Ino != hooked.Ino || now.Dev != hooked.Dev {
		t.Errorf("restored sandbox runs in netns %d (%v), the hook was given %d", now.Ino, err, hooked.Ino)
	}
	after := checkCountsOn(t, inst, id, netnsOf(t, inst, id), before)
	t.Logf("counter before %+v, after %+v", before, after)
	checkLoaded(t, inst.Backend, id)
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	assertGone(t, inst, id)
}

// netnsOf is the network namespace path of running sandbox id's init.
func netnsOf(t *testing.T, inst Instance, id string) string {
	t.Helper()
	st, err := inst.Backend.Inspect(t.Context(), id)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("Inspect %s = %+v, %v", id, st, err)
	}
	return fmt.Sprintf("/proc/%d/ns/net", st.Pid)
}

// startCounter creates a sandbox whose init counts in memory (the test
// agent's count mode), in a network namespace of the test's, and waits
// until it counts. It is destroyed when the test ends (Destroy is
// idempotent, so a test may destroy it earlier).
func startCounter(t *testing.T, h Harness, inst Instance) (string, runtime.Spec, counter) {
	t.Helper()
	ctx := t.Context()
	id := NewID()
	spec := h.Spec(t, id)
	spec.NetNSPath = testNetNS(t, id+"a")
	// The counter is the sandbox's init: gVisor releases from 2023 on
	// SIGKILL, at restore, every process that came in through `runsc
	// exec` and its children (a caller no longer connected), while the
	// init and its descendants (every process of a Berth sandbox, as the
	// agent is the init) are restored.
	spec.AgentArgs = []string{"count", "/count"}
	create(t, inst, spec)
	var before counter
	harness.WaitFor(t, 30*time.Second, "the counter to count", func() bool {
		before = readCounter(ctx, inst, id)
		return before.n >= 2
	})
	return id, spec, before
}

// checkCountsOn checks that sandbox id, started from an image of a
// counting sandbox whose count read before when the image was taken,
// runs in the network namespace at netns (its own, not the image's
// source's) and counts on from the same memory: the same token and
// checksum, from at least before's count, and growing. It returns the
// last count read.
func checkCountsOn(t *testing.T, inst Instance, id, netns string, before counter) counter {
	t.Helper()
	ctx := t.Context()
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil || st.Status != runtime.StatusRunning || st.Pid <= 0 {
		t.Fatalf("Inspect %s = %+v, %v; want running", id, st, err)
	}
	var want, got unix.Stat_t
	if err := unix.Stat(netns, &want); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &got); err != nil {
		t.Fatal(err)
	}
	if want.Ino != got.Ino || want.Dev != got.Dev {
		t.Errorf("sandbox %s netns inode %d, want the new one %d", id, got.Ino, want.Ino)
	}
	// Counting on means counting after the start: the count saved in the
	// image may already be past before's, so progress is measured from
	// the first count read after it.
	var first, after counter
	harness.WaitFor(t, 30*time.Second, "the counter's file to be readable after the start from the image", func() bool {
		first = readCounter(ctx, inst, id)
		return first.token != ""
	})
	harness.WaitFor(t, 30*time.Second, "the counter to count on after the start from the image", func() bool {
		after = readCounter(ctx, inst, id)
		return after.token != "" && after.n > first.n+1
	})
	if first.n < before.n || after.token != before.token || after.sum != before.sum {
		t.Errorf("sandbox %s counter = %+v (first read %+v), before the image = %+v; want the same token and memory checksum, counting on from where it was", id, after, first, before)
	}
	return after
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

// LiveCopier is the optional ability to save a running sandbox's memory
// image and leave it running (CheckpointLive), and to start other
// sandboxes from that image (runtime.Spec.RestoreImage): snapshots and
// forks that keep processes. UpperDir is where the sandbox's writable
// layer is, which a copy's root filesystem must hold as of the image.
type LiveCopier interface {
	CopiesMemory() bool
	CheckpointLive(ctx context.Context, id, dir string) error
	UpperDir(id string) (string, error)
}

// testCheckpointLiveCopy: a live checkpoint of a counting sandbox leaves
// it counting, and a new sandbox started from the image, on the source's
// files as of the image and in a network namespace of its own, counts on
// from the same memory (token and checksum). The two are independent
// afterwards: a file written in one is absent from the other, and the
// copy outlives its source. A backend that cannot copy refuses both
// halves with ErrNotImplemented and leaves the sandbox running.
func testCheckpointLiveCopy(t *testing.T, h Harness) {
	inst := h.New(t)
	lc, ok := inst.Backend.(LiveCopier)
	if !ok {
		t.Skip("backend has no CheckpointLive")
	}
	ctx := t.Context()
	if !lc.CopiesMemory() {
		id, _ := start(t, h, inst)
		if err := lc.CheckpointLive(ctx, id, t.TempDir()); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("CheckpointLive = %v, want ErrNotImplemented", err)
		}
		if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status != runtime.StatusRunning {
			t.Errorf("Inspect after refused CheckpointLive = %+v, %v; want running", st, err)
		}
		cid := NewID()
		spec := h.Spec(t, cid)
		spec.RestoreImage = t.TempDir()
		if err := inst.Backend.Create(ctx, spec); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("Create with RestoreImage = %v, want ErrNotImplemented", err)
			_ = inst.Backend.Destroy(context.Background(), cid)
		}
		assertGone(t, inst, cid)
		return
	}
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	id, spec, before := startCounter(t, h, inst)

	// The image and the files of the same instant: the sandbox is frozen
	// while both are taken, as a snapshot does.
	image := filepath.Join(t.TempDir(), "image")
	layer := filepath.Join(SandboxReadableDir(t), "layer")
	if err := inst.Backend.Pause(ctx, id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	t0 := time.Now()
	if err := lc.CheckpointLive(ctx, id, image); err != nil {
		t.Fatalf("CheckpointLive = %v", err)
	}
	t.Logf("CheckpointLive took %v", time.Since(t0))
	upper, err := lc.UpperDir(id)
	if err != nil {
		t.Fatalf("UpperDir = %v", err)
	}
	// The writable layer frozen as the Manager does it: a read-only layer
	// owned by the range the spec's layers are in (their root's owner).
	var base unix.Stat_t
	if err := unix.Stat(spec.Layers[0], &base); err != nil {
		t.Fatal(err)
	}
	store, err := template.New(template.Config{DataDir: t.TempDir(), UIDBase: base.Uid})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.FreezeLayer(ctx, upper, layer); err != nil {
		t.Fatalf("FreezeLayer = %v", err)
	}
	if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status != runtime.StatusPaused {
		t.Errorf("Inspect after CheckpointLive of a paused sandbox = %+v, %v; want paused", st, err)
	}
	if err := inst.Backend.Resume(ctx, id); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	var srcAfter counter
	harness.WaitFor(t, 30*time.Second, "the source to count on after its live checkpoint", func() bool {
		srcAfter = readCounter(ctx, inst, id)
		return srcAfter.token == before.token && srcAfter.n > before.n+1
	})

	cid := NewID()
	cspec := h.Spec(t, cid)
	cspec.Layers = append(append([]string(nil), spec.Layers...), layer)
	cspec.AgentArgs = spec.AgentArgs
	cspec.NetNSPath = testNetNS(t, cid+"b")
	cspec.RestoreImage = image
	t0 = time.Now()
	if err := inst.Backend.Create(ctx, cspec); err != nil {
		t.Fatalf("Create from the image = %v", err)
	}
	t.Logf("Create from the image took %v", time.Since(t0))
	t.Cleanup(func() {
		if err := inst.Backend.Destroy(context.Background(), cid); err != nil {
			t.Errorf("Destroy copy = %v", err)
		}
	})
	checkCountsOn(t, inst, cid, cspec.NetNSPath, before)
	checkLoaded(t, inst.Backend, cid)

	// Independent: a file written in the copy is not in the source, and
	// the copy runs on without it.
	if out, err := inst.Exec(ctx, cid, "/bin/sh", "-c", "echo copy > /only-in-copy"); err != nil {
		t.Fatalf("write in the copy: %v: %s", err, out)
	}
	if out, err := inst.Exec(ctx, id, "/bin/cat", "/only-in-copy"); err == nil {
		t.Errorf("the copy's file is readable in the source: %q", out)
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy source = %v", err)
	}
	assertGone(t, inst, id)
	last := readCounter(ctx, inst, cid)
	harness.WaitFor(t, 30*time.Second, "the copy to count on without its source", func() bool {
		c := readCounter(ctx, inst, cid)
		return c.token == before.token && c.n > last.n+1
	})
}
