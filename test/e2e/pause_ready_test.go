package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestResumeReadyGVisor: a daemon with --resume-ready 2 makes, after a
// pause with memory, the runtime sandbox the resume restores into (a
// resume_ready event; the sandbox's cgroup holds the waiting sentry, not
// its memory), and the resume restores into it: the counter counts on
// with its 48 MiB unchanged. With a third sandbox paused, the oldest
// ready one is given back (nothing of it left but its disk and image)
// and still resumes, made afresh. A destroy of a ready one and a SIGKILL
// of the daemon with one ready leave nothing behind.
func TestResumeReadyGVisor(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t, "--resume-ready", "2")
	ctx := t.Context()
	create := func() *client.Sandbox {
		return d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Memory: "512M", Timeout: "30m"})
	}
	// pauseReady pauses sb and waits for its resume_ready event, which
	// the daemon records after the pause.
	pauseReady := func(sb *client.Sandbox) {
		t.Helper()
		evs, err := d.Client.Events(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, e := range evs {
			if e.Type == client.EventResumeReady {
				seen++
			}
		}
		if p, err := d.Client.Pause(ctx, sb.ID); err != nil || p.Pause != client.PauseMemory {
			t.Fatalf("pause %s: %+v, %v", sb.ID, p, err)
		}
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		err = d.Client.FollowEvents(fctx, sb.ID, func(e client.Event) error {
			if e.Type == client.EventResumeReady {
				if seen--; seen < 0 {
					return errors.New("ready")
				}
			}
			return nil
		})
		if err == nil || err.Error() != "ready" {
			t.Fatalf("no resume_ready event for %s after its pause: %v\n%s", sb.ID, err, d.Logs())
		}
	}
	// heldBy lists what the host holds of sandbox id beyond a paused
	// one's disk and image.
	heldBy := func(id string) []string {
		var out []string
		for _, l := range harness.PausedLeaks(d, id) {
			if strings.Contains(l, id) {
				out = append(out, l)
			}
		}
		return out
	}

	a := create()
	startCounter(t, a)
	before := readCount(t, a)
	pauseReady(a)
	if d.CgroupGone(a.ID) || len(heldBy(a.ID)) == 0 {
		t.Errorf("a ready sandbox holds nothing: its waiting sentry is not there")
	}
	if charged := d.CgroupMemory(a.ID); charged >= 48<<20 {
		t.Errorf("a ready sandbox's cgroup holds %d MiB: its memory was loaded before the resume", charged>>20)
	} else {
		t.Logf("ready to resume, its cgroup holds %d MiB", charged>>20)
	}
	// The processes that waited (its sentry, its gofer) are the ones
	// that run it after the resume: a resume made afresh would have
	// ended them.
	waited := harness.Procs(func(p harness.Proc) bool { return strings.Contains(p.Cmdline, a.ID) })
	if len(waited) == 0 {
		t.Fatalf("no process of the ready sandbox %s", a.ID)
	}
	if r, err := d.Client.Resume(ctx, a.ID, 0); err != nil || r.State != client.StateReady {
		t.Fatalf("resume of a ready sandbox: %+v, %v\n%s", r, err, d.Logs())
	}
	for _, p := range waited {
		if now := harness.Procs(func(q harness.Proc) bool { return q.PID == p.PID && q.Cmdline == p.Cmdline }); len(now) == 0 {
			t.Errorf("process %d (%.60s) of the ready sandbox is gone after its resume: the resume did not restore into it", p.PID, p.Cmdline)
		}
	}
	assertCounting(t, a, before, "after a ready resume")

	// Three paused, two ready: a, the oldest, is given back.
	b, c := create(), create()
	before = readCount(t, a)
	pauseReady(a)
	pauseReady(b)
	pauseReady(c)
	if l := heldBy(a.ID); len(l) > 0 || !d.CgroupGone(a.ID) {
		t.Errorf("the oldest ready sandbox is still held after two newer ones: %v", l)
	}
	if len(heldBy(b.ID)) == 0 || len(heldBy(c.ID)) == 0 {
		t.Errorf("the two newest paused sandboxes are not both ready")
	}
	if _, err := d.Client.Resume(ctx, a.ID, 0); err != nil {
		t.Fatalf("resume of a sandbox no longer ready: %v\n%s", err, d.Logs())
	}
	assertCounting(t, a, before, "after a resume made afresh")
	// A ready one destroyed; the daemon killed with the other ready.
	if err := d.Client.Kill(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill9()
	d.Start()
	if l := heldBy(c.ID); len(l) > 0 {
		t.Errorf("a ready sandbox still held after a daemon restart: %v", l)
	}
	if _, err := d.Client.Resume(ctx, c.ID, 0); err != nil {
		t.Fatalf("resume after a daemon restart: %v\n%s", err, d.Logs())
	}
	if got := MustRun(t, c, "echo back"); got != "back\n" {
		t.Errorf("after a restart and resume: %q", got)
	}
	for _, sb := range []*client.Sandbox{a, c} {
		if err := d.Client.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	AssertNoLeaks(t, d)
}
