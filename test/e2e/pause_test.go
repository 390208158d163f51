package e2e

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestPauseResumeFilesystem: on runc a pause keeps the sandbox's files,
// environment, labels and network policy, ends its processes and holds
// nothing on the host but its disk (no process, mount, netns, link,
// cgroup or nftables entry), also across a daemon restart; resume starts
// the agent again with the same token and files, and the CLI does both.
func TestPauseResumeFilesystem(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	sb := d.Create(t, client.CreateRequest{
		Env: map[string]string{"FOO": "bar"}, Labels: map[string]string{"team": "a"}, Timeout: "30m",
		Network: &client.NetworkPolicy{Mode: "allow", Allow: []string{"example.com"}},
	})
	MustRun(t, sb, "echo kept > /home/kept; sleep 1000 >/dev/null 2>&1 &")
	first, err := d.Client.Get(ctx, sb.ID)
	if err != nil || first.Network == nil {
		t.Fatalf("get: %+v, %v", first, err)
	}
	p, err := d.Client.Pause(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != client.StatePaused || p.Pause != client.PauseFilesystem || !p.Deadline.IsZero() || p.Remaining == "" {
		t.Fatalf("Pause = %+v; want paused, filesystem, no deadline, time remaining", p.Sandbox)
	}
	remaining, err := time.ParseDuration(p.Remaining)
	if err != nil || remaining <= 0 || remaining > 30*time.Minute {
		t.Errorf("remaining %q: want a duration in (0, 30m]", p.Remaining)
	}
	harness.AssertPausedClean(t, d, sb.ID)
	if pol, err := d.Client.NetworkPolicy(ctx, sb.ID); err != nil || pol.Mode != "allow" || !slices.Contains(pol.Allow, "example.com") {
		t.Errorf("network policy while paused = %+v, %v; want the one it keeps", pol, err)
	}
	if _, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/true"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec in a paused sandbox = %v, want failed_precondition", err)
	}
	// Paused sandboxes survive a restart, holding no more than before.
	d.Stop()
	d.Start()
	got, err := d.Client.Get(ctx, sb.ID)
	if err != nil || got.State != client.StatePaused || got.Pause != client.PauseFilesystem || got.Remaining != p.Remaining {
		t.Fatalf("after a restart: %+v, %v; want paused as before", got.Sandbox, err)
	}
	harness.AssertPausedClean(t, d, sb.ID)

	out, stderr, code := d.CLI(t, nil, "resume", sb.ID)
	if code != 0 {
		t.Fatalf("berth resume: %d %s %s", code, out, stderr)
	}
	got, err = d.Client.Get(ctx, sb.ID)
	if err != nil || got.State != client.StateReady || got.Pause != "" || !got.Deadline.After(time.Now()) {
		t.Fatalf("after resume: %+v, %v; want ready with a deadline ahead", got.Sandbox, err)
	}
	if got := MustRun(t, sb, "cat /home/kept; echo $FOO"); got != "kept\nbar\n" {
		t.Errorf("after resume: %q, want the file and the environment kept", got)
	}
	if o, _, code := Run(t, sb, "pgrep -x sleep"); code == 0 {
		t.Errorf("a process outlived a filesystem pause: %s", o)
	}
	// Its address is given back while paused and comes back with it: the
	// allocator starts from the sandbox's own slot (and a resume asks for
	// the old address first); only another sandbox of this host taking
	// exactly this /30 meanwhile could change it.
	if got.Network == nil || got.Network.Address != first.Network.Address {
		t.Errorf("address after resume %+v, before %+v; want the same", got.Network, first.Network)
	}
	if got.Labels["team"] != "a" {
		t.Errorf("labels after resume: %v", got.Labels)
	}
	pol, err := d.Client.NetworkPolicy(ctx, sb.ID)
	if err != nil || pol.Mode != "allow" || !slices.Contains(pol.Allow, "example.com") {
		t.Errorf("network policy after resume = %+v, %v; want the one it was created with", pol, err)
	}
	out, stderr, code = d.CLI(t, nil, "pause", sb.ID)
	if code != 0 || !strings.Contains(out, "filesystem") {
		t.Errorf("berth pause: %d %q %s", code, out, stderr)
	}
	types := eventTypes(t, d, sb.ID)
	if n := strings.Count(strings.Join(types, " "), client.EventPaused); n != 2 || !slices.Contains(types, client.EventResumed) {
		t.Errorf("events %v: want two paused and a resumed", types)
	}
	// A paused sandbox is destroyed without a trace (the cleanup checks).
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// TestPauseResumeSurviveKill9: a daemon SIGKILLed while a pause or a
// resume is under way leaves, after its restart, a sandbox that is paused
// (holding only its disk) or running (its files intact), never half of
// each. Where the kill lands varies from round to round; every landing
// point must satisfy the same check.
//
// On gVisor (a memory pause) the sandbox also runs a counter: whenever it
// is running again after a round whose pause kept memory, the counter is
// the one from before (its count not lower, its memory unchanged) and
// counts on, so no partial checkpoint was ever restored; a pause the kill
// cut short before its checkpoint was complete is a filesystem pause, said
// so, with the processes gone.
func TestPauseResumeSurviveKill9(t *testing.T) {
	forEachIsolation(t, testPauseResumeSurviveKill9)
}

func testPauseResumeSurviveKill9(t *testing.T, iso string) {
	d := StartDaemon(t)
	ctx := t.Context()
	gvisor := iso == client.IsolationGVisor
	req := client.CreateRequest{Timeout: "30m", Isolation: iso}
	if gvisor {
		req.Memory = "512M"
	}
	sb := d.Create(t, req)
	MustRun(t, sb, "echo kept > /home/kept")
	counting := gvisor
	if counting {
		startCounter(t, sb)
	}
	count := 0
	check := func(round string) string {
		t.Helper()
		got, err := d.Client.Get(ctx, sb.ID)
		if err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		switch got.State {
		case client.StatePaused:
			harness.AssertPausedClean(t, d, sb.ID)
			if got.Pause == client.PauseFilesystem && counting {
				t.Logf("%s: the kill cut the memory pause short: filesystem pause", round)
				counting = false
			}
		case client.StateReady:
			if got := MustRun(t, sb, "cat /home/kept"); got != "kept\n" {
				t.Errorf("%s: running with /home/kept = %q", round, got)
			}
			if counting {
				assertCounting(t, sb, count, round)
				count = readCount(t, sb)
			}
		default:
			t.Fatalf("%s: sandbox is %s (%s), want paused or ready", round, got.State, got.Reason)
		}
		t.Logf("%s: %s %s", round, got.State, got.Pause)
		return got.State
	}
	inFlight := func(op func(context.Context) error, states ...string) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = op(context.WithoutCancel(ctx)) // the daemon dies under it
		}()
		// Kill once the daemon has the operation on record (or done).
		waitFor(t, 60*time.Second, "the operation to start", func() bool {
			got, err := d.Client.Get(ctx, sb.ID)
			return err == nil && slices.Contains(states, got.State)
		})
		d.Kill9()
		<-done
		d.Start()
	}
	for i := range 3 {
		if check("before round "+itoa(i)) == client.StatePaused {
			if _, err := d.Client.Resume(ctx, sb.ID, 0); err != nil {
				t.Fatal(err)
			}
		}
		inFlight(func(ctx context.Context) error { _, err := d.Client.Pause(ctx, sb.ID); return err },
			client.StatePausing, client.StatePaused)
		if check("after a kill in pause "+itoa(i)) == client.StatePaused {
			inFlight(func(ctx context.Context) error { _, err := d.Client.Resume(ctx, sb.ID, 0); return err },
				client.StateResuming, client.StateReady)
		}
	}
	check("end")
	if got, _ := d.Client.Get(ctx, sb.ID); got.State == client.StatePaused {
		if _, err := d.Client.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := MustRun(t, sb, "cat /home/kept"); got != "kept\n" {
		t.Errorf("finally /home/kept = %q", got)
	}
}

// TestOnTimeoutPauseAutoResume: a sandbox created with --on-timeout pause
// is paused at its deadline, not destroyed, and with --auto-resume its
// next data-plane request resumes it and succeeds.
func TestOnTimeoutPauseAutoResume(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	out, stderr, code := d.CLI(t, nil, "create", "--template", "minimal", "--timeout", "3s", "--on-timeout", "pause", "--auto-resume", "-e", "KEPT=yes")
	if code != 0 {
		t.Fatalf("berth create: %d %s", code, stderr)
	}
	id := strings.TrimSpace(out)
	sb := d.Client.Sandbox(id)
	// Nothing is sent to it before the pause: a request would resume it.
	// Wait for the daemon to report the pause.
	paused := make(chan struct{})
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = d.Client.FollowEvents(fctx, id, func(e client.Event) error {
			if e.Type == client.EventPaused {
				close(paused)
				return errors.New("seen")
			}
			return nil
		})
	}()
	select {
	case <-paused:
	case <-time.After(60 * time.Second):
		t.Fatal("no paused event within 60s of a 3s deadline")
	}
	got, err := d.Client.Get(ctx, id)
	if err != nil || got.State != client.StatePaused || !got.AutoResume || got.OnTimeout != client.OnTimeoutPause {
		t.Fatalf("after the deadline: %+v, %v; want paused, auto-resume", got.Sandbox, err)
	}
	harness.AssertPausedClean(t, d, id)
	// The next request through the data plane resumes it.
	if got := MustRun(t, sb, "echo $KEPT"); got != "yes\n" {
		t.Errorf("auto-resumed exec: %q", got)
	}
	if got, _ := d.Client.Get(ctx, id); got.State != client.StateReady {
		t.Errorf("after the request: %s, want ready", got.State)
	}
	if _, _, code := d.CLI(t, nil, "create", "--on-timeout", "hibernate"); code == 0 {
		t.Error("create --on-timeout hibernate succeeded")
	}
}

// TestIdlePause: a sandbox created with --idle-pause is paused by the
// daemon once nothing uses it (no request, no stream, no CPU), and keeps
// running while a command streams.
func TestIdlePause(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	out, stderr, code := d.CLI(t, nil, "create", "--template", "minimal", "--idle-pause", "2s", "--timeout", "30m")
	if code != 0 {
		t.Fatalf("berth create: %d %s", code, stderr)
	}
	id := strings.TrimSpace(out)
	sb := d.Client.Sandbox(id)
	// A command that streams for longer than the idle time, without
	// using CPU, holds it: a pause would end it half way (a filesystem
	// pause ends every process).
	if got := MustRun(t, sb, "for i in 1 2 3 4 5; do echo $i; sleep 1; done"); got != "1\n2\n3\n4\n5\n" {
		t.Errorf("streamed %q", got)
	}
	waitFor(t, 60*time.Second, "the idle sandbox to be paused", func() bool {
		got, err := d.Client.Get(ctx, id)
		return err == nil && got.State == client.StatePaused
	})
	got, err := d.Client.Get(ctx, id)
	if err != nil || got.IdlePause != "2s" || got.Remaining == "" {
		t.Fatalf("paused: %+v, %v", got.Sandbox, err)
	}
	harness.AssertPausedClean(t, d, id)
	evs, err := d.Client.Events(ctx, id)
	if err != nil || evs[len(evs)-1].Type != client.EventPaused || !strings.Contains(evs[len(evs)-1].Message, "idle") {
		t.Errorf("events %+v, %v: want the last one paused, idle", evs, err)
	}
}

// eventTypes are the types of sandbox id's events so far, oldest first.
func eventTypes(t *testing.T, d *Daemon, id string) []string {
	t.Helper()
	evs, err := d.Client.Events(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	return types
}
