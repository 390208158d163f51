package e2e

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestDensityPastKeyQuota holds more sandboxes on one daemon than the
// kernel's per-uid key quota (kernel.keys.maxkeys, 200 by default) has
// keys: that is where creates used to fail ("unable to join session
// keyring: disk quota exceeded"), when every sandbox's root was one host
// uid and runc made a session keyring per sandbox. Now every sandbox has
// its own host uid and no keyring is made, which the test checks directly:
// all uids distinct, none with a key charged in /proc/key-users. Creates
// come 25 at a time and none may fail; every sandbox still answers once
// all exist. The 500-sandbox run with memory per sandbox is the density
// benchmark (go run ./bench -density 500).
func TestDensityPastKeyQuota(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 210 sandboxes")
	}
	const n, batch = 210, 25
	if b, err := os.ReadFile("/proc/sys/kernel/keys/maxkeys"); err == nil {
		t.Logf("kernel.keys.maxkeys = %s", strings.TrimSpace(string(b)))
	}
	d := StartDaemon(t)
	var sbs []*client.Sandbox
	for len(sbs) < n {
		k := min(batch, n-len(sbs))
		var (
			mu   sync.Mutex
			wg   sync.WaitGroup
			errs []error
		)
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := d.Client.Create(t.Context(), client.CreateRequest{Template: "minimal", Timeout: "1h"})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				sbs = append(sbs, sb)
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("%d of %d creates failed with %d sandboxes live; first: %v", len(errs), k, len(sbs), errs[0])
		}
	}
	keyed := harness.KeyUsers(t)
	uids := map[int]string{}
	for _, sb := range sbs {
		// Answering is the exec running to exit 0. Its output is only
		// logged: under this load an exec's stdout is sometimes lost on
		// the way back, which is the agent-output issue, not density.
		if out, _, code := Run(t, sb, "echo ok"); code != 0 {
			t.Errorf("sandbox %s: echo ok exited %d (stdout %q)", sb.ID, code, out)
		} else if out != "ok\n" {
			t.Logf("sandbox %s: echo ok exited 0 but its stdout arrived as %q", sb.ID, out)
		}
		uid := hostUID(t, MustAgentPid(t, d, sb.ID))
		if other, dup := uids[uid]; dup {
			t.Errorf("sandboxes %s and %s share host uid %d", other, sb.ID, uid)
		}
		uids[uid] = sb.ID
		if keyed[uid] {
			t.Errorf("sandbox %s: host uid %d has kernel keys charged", sb.ID, uid)
		}
	}
	t.Logf("%d sandboxes, %d distinct host uids", len(sbs), len(uids))
	for _, sb := range sbs {
		if err := d.Client.Kill(t.Context(), sb.ID); err != nil {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	}
	AssertNoLeaks(t, d)
}

// hostUID is the real uid of a host process.
func hostUID(t *testing.T, pid int) int {
	t.Helper()
	u, err := harness.ProcUID(pid)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
