package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestPauseGVisorOpenStream: a client attached to a long exec stream does
// not turn a gVisor memory pause into a filesystem one (runsc refuses to
// save a network stack with a connected endpoint, and a failed save ends
// the sandbox): the daemon closes its connections into the sandbox first,
// the stream ends with an error, the pause keeps memory, and a counter
// process counts on after resume.
func TestPauseGVisorOpenStream(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	ctx := t.Context()
	sb := d.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Memory: "512M", Timeout: "30m"})
	startCounter(t, sb)

	first := harness.NewFirstOutput()
	ended := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "while :; do echo tick; sleep 0.2; done"}, Stdout: first})
		ended <- err
	}()
	select {
	case <-first.C:
	case err := <-ended:
		t.Fatalf("the stream ended before its first output: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no output from the stream within a minute")
	}

	before := readCount(t, sb)
	p, err := d.Client.Pause(ctx, sb.ID)
	if err != nil {
		t.Fatalf("pause with a stream attached: %v\n%s", err, d.Logs())
	}
	if p.State != client.StatePaused || p.Pause != client.PauseMemory {
		t.Fatalf("Pause with a stream attached = %s/%q, want paused with memory\n%s", p.State, p.Pause, d.Logs())
	}
	if out, _, code := d.CLI(t, nil, "inspect", sb.ID); code != 0 || !strings.Contains(out, `"pause": "memory"`) {
		t.Errorf("berth inspect of the paused sandbox = %q, want \"pause\": \"memory\"", out)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Errorf("the stream into the paused sandbox ended without an error")
		} else {
			t.Logf("the stream ended with: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stream into the paused sandbox did not end")
	}

	if r, err := d.Client.Resume(ctx, sb.ID, 0); err != nil || r.State != client.StateReady {
		t.Fatalf("resume: %+v, %v\n%s", r, err, d.Logs())
	}
	assertCounting(t, sb, before, "after resume")
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}
