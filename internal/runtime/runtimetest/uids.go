package runtimetest

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/test/harness"
)

// testDistinctUIDs: every sandbox gets its own host uid range, also
// across two backends on one host (two daemons), and its root owns what it
// sees of the shared layers. No key is charged to a sandbox's host uid
// (the runtime makes no session keyring per sandbox), so the kernel's
// per-uid key quota cannot cap how many sandboxes a host runs.
func testDistinctUIDs(t *testing.T, h Harness) {
	a, b := h.New(t), h.New(t)
	if a.HostUID == nil {
		t.Skip("harness has no HostUID")
	}
	seen := map[uint32]string{}
	var ids []string
	for _, inst := range []Instance{a, a, b} {
		id, _ := start(t, h, inst)
		uid, err := inst.HostUID(id)
		if err != nil {
			t.Fatal(err)
		}
		if uid == 0 {
			t.Fatalf("sandbox %s root is host root", id)
		}
		if other, dup := seen[uid]; dup {
			t.Errorf("sandboxes %s and %s share host uid %d", other, id, uid)
		}
		seen[uid] = id
		ids = append(ids, id)
		if keyUsers(t)[uid] {
			t.Errorf("host uid %d of sandbox %s holds kernel keys (/proc/key-users)", uid, id)
		}
		if inst.Exec == nil {
			continue
		}
		// Layer files (busybox) are the sandbox root's inside.
		out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", "stat -c %u:%g /bin/busybox; id -u")
		if err != nil || strings.TrimSpace(string(out)) != "0:0\n0" {
			t.Errorf("owner of /bin/busybox and uid inside %s = %q, %v; want 0:0 and 0", id, out, err)
		}
	}
	t.Logf("sandboxes %v, host uids %v", ids, seen)
}

// keyUsers returns the host uids that /proc/key-users lists: those with
// at least one key charged to them.
func keyUsers(t *testing.T) map[uint32]bool {
	t.Helper()
	b, err := os.ReadFile("/proc/key-users")
	if err != nil {
		t.Skipf("no /proc/key-users: %v", err)
	}
	out := map[uint32]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		var uid uint32
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "%d:", &uid); err == nil {
			out[uid] = true
		}
	}
	return out
}

// testDestroyForkBomb: a sandbox whose every pid slot is taken by
// processes that fork in a loop is destroyed, every time, with nothing
// left behind.
func testDestroyForkBomb(t *testing.T, h Harness) {
	inst := h.New(t)
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	if inst.PidsLimitGap != "" {
		t.Skip(inst.PidsLimitGap)
	}
	for i := range 3 {
		id, spec := start(t, h, inst)
		if spec.PidsLimit <= 0 {
			t.Skip("spec has no pids limit")
		}
		// Each process loops forking copies of itself that do the same:
		// the sandbox fills its pids limit and stays full, every process
		// retrying fork as fast as it can.
		bomb := "b() { while :; do b & done; }; b >/dev/null 2>&1 & echo started"
		if out, err := inst.Exec(t.Context(), id, "/bin/sh", "-c", bomb); err != nil {
			t.Fatalf("start bomb: %v: %s", err, out)
		}
		// The kernel says when the limit is full: it counts each fork
		// it refused in pids.events. pids.current is only a sample of
		// a count that moves, and one run (under load) never saw it at
		// the limit in two minutes.
		harness.WaitFor(t, 2*time.Minute, "the kernel to refuse a fork at the pids limit (pids.events max > 0)", func() bool {
			s, err := inst.Backend.Stats(t.Context(), id)
			return err == nil && (s.PidsRefused > 0 || s.PidsCurrent >= spec.PidsLimit)
		})
		if err := inst.Backend.Destroy(t.Context(), id); err != nil {
			t.Fatalf("round %d: Destroy = %v", i, err)
		}
		assertGone(t, inst, id)
		if st, err := inst.Backend.Inspect(t.Context(), id); err == nil && st.Status != runtime.StatusUnknown {
			t.Errorf("round %d: Inspect after Destroy = %+v", i, st)
		}
	}
}
