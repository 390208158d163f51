package e2e

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// counterScript fills 48 MiB of sentry memory (/dev/shm is a tmpfs there;
// /tmp is on the disk) with random bytes, records their sum, then counts
// in a shell variable, writing each value to /tmp/count (by rename, so a
// reader never sees it empty): a process whose state lives only in memory.
const counterScript = `head -c 50331648 /dev/urandom > /dev/shm/ballast && md5sum /dev/shm/ballast > /tmp/sum && i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new && mv /tmp/count.new /tmp/count; sleep 0.05; done`

// readCount reads the counter's last value, 0 when there is none yet.
func readCount(t *testing.T, sb *client.Sandbox) int {
	t.Helper()
	n, _ := countOf(t, sb)
	return n
}

// countOf reads the counter's last value, failing when it cannot.
func countOf(t *testing.T, sb *client.Sandbox) (int, error) {
	var b bytes.Buffer
	if err := sb.ReadFile(t.Context(), "/tmp/count", &b); err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(b.String()))
}

// startCounter starts counterScript in sb and waits until it counts.
func startCounter(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	if _, err := sb.Start(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", counterScript}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the counter to fill its memory and count", func() bool { return readCount(t, sb) > 0 })
}

// assertCounting checks that sb's counter is the one from before (its
// count at least since, its memory's sum unchanged) and still counts.
func assertCounting(t *testing.T, sb *client.Sandbox, since int, when string) {
	t.Helper()
	first, err := countOf(t, sb)
	if err != nil {
		t.Fatalf("%s: reading the count: %v", when, err)
	}
	if first < since {
		t.Fatalf("%s: count %d, below %d before: the counter's memory was not kept", when, first, since)
	}
	waitFor(t, time.Minute, when+": the counter to count on", func() bool { return readCount(t, sb) > first })
	if got := MustRun(t, sb, "md5sum /dev/shm/ballast | cmp -s - /tmp/sum && echo same"); got != "same\n" {
		t.Errorf("%s: the 48 MiB in memory changed", when)
	}
}

// dirSize sums the sizes of the files under dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// takesDirectIO reports whether files made in dir can be opened with
// O_DIRECT.
func takesDirectIO(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, "direct-probe")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Logf("%s takes no O_DIRECT: %v", dir, err)
		return false
	}
	f.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	return true
}

// pageCacheBytes sums what of the files under dir is in the host's page
// cache (mincore of each file mapped).
func pageCacheBytes(t *testing.T, dir string) int64 {
	t.Helper()
	page := int64(os.Getpagesize())
	var n int64
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		defer unix.Munmap(m)
		vec := make([]byte, (fi.Size()+page-1)/page)
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			return errno
		}
		for _, v := range vec {
			n += int64(v & 1)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("page cache of %s: %v", dir, err)
	}
	return n * page
}

// TestPauseResumeMemoryGVisor: pausing a gVisor sandbox keeps every
// process and its memory (inspect says "pause": "memory"): a process
// counting in memory counts on after resume from where it was, its 48 MiB
// unchanged. While paused the host holds none of it: the sandbox's memory
// cgroup, which held the 48 MiB, is gone with every process of it; the
// memory is in the checkpoint on disk. Also across a daemon restart.
func TestPauseResumeMemoryGVisor(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	ctx := t.Context()
	sb := d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Memory: "512M", Timeout: "30m"})
	startCounter(t, sb)
	assertFiltered(t, sb, "before the pause")
	charged := d.CgroupMemory(sb.ID)
	if charged < 48<<20 {
		t.Fatalf("the sandbox's memory cgroup holds %d bytes, want at least the counter's 48 MiB", charged)
	}
	before := readCount(t, sb)
	// An exec streaming through the daemon holds a connection in the
	// sandbox's network stack, which runsc will not checkpoint: the pause
	// ends it first, and the exec says so.
	streaming, _ := streamingExec(t, sb)
	p, err := d.Client.Pause(ctx, sb.ID)
	if err != nil {
		t.Fatalf("pause: %v\n%s", err, d.Logs())
	}
	if p.State != client.StatePaused || p.Pause != client.PauseMemory {
		t.Fatalf("Pause = %s/%q, want paused with memory", p.State, p.Pause)
	}
	select {
	case err := <-streaming:
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pausing") {
			t.Errorf("streaming exec across the pause = %v, want failed_precondition naming pausing", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the streaming exec still runs after the pause")
	}
	if out, _, code := d.CLI(t, nil, "inspect", sb.ID); code != 0 || !strings.Contains(out, `"pause": "memory"`) {
		t.Errorf("berth inspect of the paused sandbox = %q, want \"pause\": \"memory\"", out)
	}
	// Given back: no cgroup (the kernel removes one only when no task is
	// in it), no process, mount or network object of the sandbox; only
	// its disk and its checkpoint stay.
	if !d.CgroupGone(sb.ID) {
		t.Errorf("the paused sandbox's cgroup is still there")
	}
	harness.AssertPausedClean(t, d, sb.ID)
	cp := dirSize(filepath.Join(d.DataDir, "checkpoints", sb.ID))
	t.Logf("memory cgroup held %d MiB running; paused: no cgroup, checkpoint %d MiB on disk", charged>>20, cp>>20)
	if cp < 48<<20 {
		t.Errorf("checkpoint holds %d bytes, less than the 48 MiB in memory", cp)
	}
	// And on disk, not in the host's page cache: the sentry wrote its
	// pages with O_DIRECT (runsc checkpoint --direct) where its runsc
	// has the flag and the data dir takes it, so the pause gave the
	// memory back rather than moving it into dirty cache pages.
	if strings.Contains(d.Logs(), "direct_image_io=true") && takesDirectIO(t, d.DataDir) {
		cached := pageCacheBytes(t, filepath.Join(d.DataDir, "checkpoints", sb.ID))
		t.Logf("of the checkpoint, %d KiB in the page cache", cached>>10)
		if cached > cp/4 {
			t.Errorf("%d of the checkpoint's %d bytes are in the host's page cache: its pages were not written with O_DIRECT", cached, cp)
		}
	}

	// The flush that lets the checkpoint outlive a host restart follows
	// the pause: the checkpoint names this boot, and is marked flushed
	// once its image, its rename and the writable layer are on the disk.
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	if made, err := os.ReadFile(filepath.Join(d.CheckpointDir(sb.ID), ".berth-boot-id")); err != nil || string(made) != string(boot) {
		t.Errorf("checkpoint's boot id = %q, %v; want this boot's, %q", made, err, boot)
	}
	d.WaitCheckpointFlushed(t, sb.ID)

	r, err := d.Client.Resume(ctx, sb.ID, 0)
	if err != nil || r.State != client.StateReady || r.Pause != "" {
		t.Fatalf("resume: %+v, %v\n%s", r, err, d.Logs())
	}
	assertCounting(t, sb, before, "after resume")
	assertFiltered(t, sb, "after resume")

	// Paused across a restart, then resumed: the same counter counts on.
	before = readCount(t, sb)
	if p, err = d.Client.Pause(ctx, sb.ID); err != nil || p.Pause != client.PauseMemory {
		t.Fatalf("second pause: %+v, %v", p, err)
	}
	d.Stop()
	d.Start()
	harness.AssertPausedClean(t, d, sb.ID)
	r, err = d.Client.Resume(ctx, sb.ID, 0)
	if err != nil || r.State != client.StateReady || r.Pause != "" {
		t.Fatalf("resume after a restart: %+v, %v\n%s", r, err, d.Logs())
	}
	assertCounting(t, sb, before, "after a restart and resume")
	t.Logf("memory cgroup holds %d MiB after resume", d.CgroupMemory(sb.ID)>>20)
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// assertFiltered checks that gVisor sandbox sb's processes still run
// under the sandbox's seccomp filter: syslog(2), which the sentry answers
// for anyone (dmesg prints its boot log), is denied. The filter denies it
// by number alone, so each task's answer comes from its cache of the
// filter's results, which a restore computes afresh for every task and
// Berth's runsc takes from the tasks before it with the same filter
// (scripts/runsc-patches/seccomp-cache-by-filter.patch).
func assertFiltered(t *testing.T, sb *client.Sandbox, when string) {
	t.Helper()
	var out bytes.Buffer
	code, err := sb.Exec(t.Context(), client.ExecRequest{Cmd: "dmesg", Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("%s: dmesg in %s: %v", when, sb.ID, err)
	}
	if code == 0 || !strings.Contains(out.String(), "not permitted") {
		t.Errorf("%s: dmesg in %s = exit %d, %q; want the seccomp filter's EPERM", when, sb.ID, code, out.String())
	}
}

// TestPauseCheckpointFromEarlierBoot: a memory checkpoint is trusted
// after a daemon restart (the page cache outlives the daemon) but not
// after a host restart that cut its background flush short: the daemon
// start that finds one refuses it, the sandbox failed with a reason that
// says so, and nothing of it is left. The host restart is played by what
// it leaves: the checkpoint's boot ID another boot's, its flush mark
// absent.
func TestPauseCheckpointFromEarlierBoot(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	ctx := t.Context()
	sb := d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Timeout: "30m"})
	if p, err := d.Client.Pause(ctx, sb.ID); err != nil || p.Pause != client.PauseMemory {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	ck := d.CheckpointDir(sb.ID)
	d.Stop()
	if err := os.Remove(filepath.Join(ck, ".berth-synced")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ck, ".berth-boot-id"), []byte("00000000-0000-4000-8000-000000000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	got, err := d.Client.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != client.StateFailed || !strings.Contains(got.Reason, "host restarted before the paused sandbox's checkpoint reached the disk") {
		t.Fatalf("after the restart: %s %q; want failed, saying the checkpoint was not flushed", got.State, got.Reason)
	}
	if _, err := d.Client.Resume(ctx, sb.ID, 0); err == nil {
		t.Error("a sandbox whose checkpoint was refused resumed")
	}
	harness.AssertNoLeaks(t, d)
}
