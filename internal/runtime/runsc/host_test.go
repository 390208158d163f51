package runsc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
)

// TestHostProcesses: what a gVisor sandbox runs on the host never runs as
// host root. The sentry (State.Pid) runs as nobody in a user namespace of
// its own; every other process in the sandbox's cgroup (the gofer) runs as
// the sandbox's own host uid.
func TestHostProcesses(t *testing.T) {
	h := newHarness(t)
	inst := h.New(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	if err := inst.Backend.Create(ctx, h.Spec(t, id)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	slotUID, err := inst.HostUID(id)
	if err != nil || slotUID == 0 {
		t.Fatalf("HostUID = %d, %v", slotUID, err)
	}
	if uid := procUID(t, st.Pid); uid != 65534 {
		t.Errorf("sentry (pid %d) runs as host uid %d, want 65534 (nobody)", st.Pid, uid)
	}
	for _, ns := range []string{"user", "mnt", "pid", "net", "ipc", "uts"} {
		host, _ := os.Readlink("/proc/self/ns/" + ns)
		sb, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", st.Pid, ns))
		if err != nil || sb == host {
			t.Errorf("sentry %s namespace = %q, %v; want its own", ns, sb, err)
		}
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", inst.Footprint.CgroupParent, id, "cgroup.procs"))
	if err != nil {
		t.Skipf("no v1 pids cgroup to list: %v", err)
	}
	pids := strings.Fields(string(b))
	if len(pids) < 2 {
		t.Errorf("cgroup holds %v, want the sentry and the gofer", pids)
	}
	for _, p := range pids {
		pid, _ := strconv.Atoi(p)
		uid := procUID(t, pid)
		switch {
		case pid == st.Pid:
		case uid != int(slotUID):
			t.Errorf("process %d in the sandbox's cgroup runs as host uid %d, want the sandbox's %d", pid, uid, slotUID)
		}
	}
}

// TestBeforeStartNetNS: a BeforeStart hook gets a pid whose network
// namespace (not the host's) is the one the sandbox then runs in, which
// is how the Manager wires the sandbox's veth before gVisor reads it.
func TestBeforeStartNetNS(t *testing.T) {
	h := newHarness(t)
	inst := h.New(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	spec := h.Spec(t, id)
	var hooked unix.Stat_t
	spec.BeforeStart = func(ctx context.Context, pid int) error {
		return unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &hooked)
	}
	if err := inst.Backend.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })
	st, err := inst.Backend.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var host, got unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &got); err != nil {
		t.Fatal(err)
	}
	if hooked.Ino == 0 || hooked.Ino == host.Ino {
		t.Fatalf("hook saw netns %d (host %d)", hooked.Ino, host.Ino)
	}
	if got.Ino != hooked.Ino || got.Dev != hooked.Dev {
		t.Errorf("sandbox runs in netns %d, hook wired %d", got.Ino, hooked.Ino)
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}

func procUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			uid, _ := strconv.Atoi(f[1]) // effective
			return uid
		}
	}
	t.Fatalf("no Uid in status of %d", pid)
	return -1
}
