package e2e

import (
	"fmt"
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
	var (
		mu   sync.Mutex
		uids = map[int]string{}
	)
	byID := map[string]*client.Sandbox{}
	ids := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		byID[sb.ID] = sb
		ids = append(ids, sb.ID)
	}
	// The checks and the teardown run batch at a time too: one at a
	// time, 210 of each took minutes.
	harness.Each(t, batch, ids, func(id string) error {
		sb := byID[id]
		// Answering is the exec running to exit 0 with every byte of
		// its output: no output is lost under this load either.
		var out strings.Builder
		code, err := sb.Exec(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "echo ok"}, Stdout: &out})
		if err != nil || code != 0 {
			return fmt.Errorf("echo ok = %d, %v (stdout %q)", code, err, out.String())
		}
		if out.String() != "ok\n" {
			return fmt.Errorf("echo ok exited 0 but its stdout arrived as %q", out.String())
		}
		pid, err := agentPid(d, id)
		if err != nil {
			return err
		}
		uid, err := harness.ProcUID(pid)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if other, dup := uids[uid]; dup {
			return fmt.Errorf("shares host uid %d with %s", uid, other)
		}
		uids[uid] = id
		if keyed[uid] {
			return fmt.Errorf("host uid %d has kernel keys charged", uid)
		}
		return nil
	})
	t.Logf("%d sandboxes, %d distinct host uids", len(sbs), len(uids))
	harness.Each(t, batch, ids, func(id string) error { return d.Client.Kill(t.Context(), id) })
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
