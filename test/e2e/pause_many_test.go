package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// parked is one sandbox of TestPauseResumeMany.
type parked struct {
	sb     *client.Sandbox
	gvisor bool
	// auto: created with auto-resume; its first exec wakes it.
	auto  bool
	count int // the counter's value before a pause (gVisor)
}

// TestPauseResumeMany: a host parks its work sites together and wakes
// them together, as a fleet does overnight. Eight runc sandboxes and,
// where runsc runs, four gVisor ones (each counting in memory) are paused
// by concurrent requests: each is paused as its runtime allows (memory on
// gVisor, filesystem on runc) and holds nothing on the host. Half are then
// woken by resume requests and half, created with auto-resume, by their
// first exec, all at once: each has its own files back (never another's),
// the gVisor ones count on from where they were, and no two share an
// address. Parked again together, they survive a daemon restart and wake
// together once more; destroyed together, they leave nothing behind.
func TestPauseResumeMany(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	var fleet []*parked
	add := func(iso string, n int) {
		for range n {
			p := &parked{gvisor: iso == client.IsolationGVisor, auto: len(fleet)%2 == 1}
			req := client.CreateRequest{Isolation: iso, Timeout: "30m", AutoResume: p.auto}
			if p.gvisor {
				req.Memory = "512M"
			}
			p.sb = d.Create(t, req)
			MustRun(t, p.sb, "echo "+p.sb.ID+" > /home/who")
			if p.gvisor {
				startCounter(t, p.sb)
			}
			fleet = append(fleet, p)
		}
	}
	add(client.IsolationRunc, 8)
	if _, err := exec.LookPath("runsc"); err == nil {
		add(client.IsolationGVisor, 4)
	} else {
		t.Log("runsc is not installed: runc sandboxes only")
	}
	ids := make([]string, len(fleet))
	for i, p := range fleet {
		ids[i] = p.sb.ID
	}

	// all runs op for every sandbox at once; the errors come back to the
	// test's goroutine, which may end the test.
	all := func(what string, op func(p *parked) error) {
		t.Helper()
		errs := make([]error, len(fleet))
		var g errgroup.Group
		for i, p := range fleet {
			g.Go(func() error { errs[i] = op(p); return nil })
		}
		_ = g.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s %s: %v", what, fleet[i].sb.ID, err)
			}
		}
		if t.Failed() {
			t.Fatalf("%s failed\n%s", what, d.Logs())
		}
	}
	park := func() {
		t.Helper()
		for _, p := range fleet {
			if p.gvisor {
				p.count = readCount(t, p.sb)
			}
		}
		all("pause", func(p *parked) error {
			got, err := d.Client.Pause(ctx, p.sb.ID)
			if err != nil {
				return err
			}
			want := client.PauseFilesystem
			if p.gvisor {
				want = client.PauseMemory
			}
			if got.State != client.StatePaused || got.Pause != want {
				return fmt.Errorf("paused as %s/%q, want %s/%q", got.State, got.Pause, client.StatePaused, want)
			}
			return nil
		})
		harness.AssertPausedClean(t, d, ids...)
	}
	wake := func(round string) {
		t.Helper()
		all("wake", func(p *parked) error {
			if !p.auto {
				if _, err := d.Client.Resume(ctx, p.sb.ID, 0); err != nil {
					return err
				}
			}
			out, stderr, code, err := harness.Exec(p.sb, "cat /home/who")
			if err != nil || code != 0 {
				return fmt.Errorf("exec after the wake: %d %s %v", code, stderr, err)
			}
			if got := strings.TrimSpace(out); got != p.sb.ID {
				return fmt.Errorf("/home/who = %q, want its own id", got)
			}
			return nil
		})
		addrs := map[string]string{}
		for _, p := range fleet {
			got, err := d.Client.Get(ctx, p.sb.ID)
			if err != nil || got.State != client.StateReady || got.Network == nil {
				t.Fatalf("%s: %s after the wake: %+v, %v", round, p.sb.ID, got.Sandbox, err)
			}
			if other, ok := addrs[got.Network.Address]; ok {
				t.Errorf("%s: %s and %s both have address %s", round, other, p.sb.ID, got.Network.Address)
			}
			addrs[got.Network.Address] = p.sb.ID
			if p.gvisor {
				assertCounting(t, p.sb, p.count, round+" "+p.sb.ID)
			}
		}
	}

	park()
	wake("first wake")
	park()
	d.Stop()
	d.Start()
	harness.AssertPausedClean(t, d, ids...)
	wake("wake after a restart")
	all("destroy", func(p *parked) error { return d.Client.Kill(ctx, p.sb.ID) })
	AssertNoLeaks(t, d)
}
