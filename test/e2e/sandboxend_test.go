package e2e

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// streamingExec starts a command that prints until stopped, and returns
// once its first output has arrived; the channel gets Exec's result.
func streamingExec(t *testing.T, sb *client.Sandbox) (<-chan error, *syncBuffer) {
	t.Helper()
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(context.WithoutCancel(t.Context()), client.ExecRequest{
			Cmd: "/bin/sh", Args: []string{"-c", "while :; do echo tick; sleep 0.2; done"}, Stdout: &out,
		})
		done <- err
	}()
	waitFor(t, 2*time.Minute, "the streaming exec's first output", func() bool {
		return strings.Contains(out.String(), "tick")
	})
	return done, &out
}

// waitEnded waits for the daemon to report sandbox id's end (a destroyed
// or failed event), then for the streaming exec to return, bounded by a
// generous limit, and checks it failed saying the sandbox is not running
// and why.
func waitEnded(t *testing.T, d *Daemon, id string, done <-chan error, reason string) {
	t.Helper()
	waitFor(t, 2*time.Minute, "the sandbox's destroyed or failed event", func() bool {
		evs, _ := d.Client.Events(t.Context(), id)
		for _, e := range evs {
			if e.Type == client.EventDestroyed || e.Type == client.EventFailed {
				return true
			}
		}
		return false
	})
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), reason) {
			t.Errorf("streaming exec into the ended sandbox = %v, want failed_precondition naming %q", err, reason)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the streaming exec still runs after the sandbox ended (daemon log:\n%s)", d.Logs())
	}
	// A new call fails at once, saying why.
	sb := d.Client.Sandbox(id)
	if _, err := sb.Exec(t.Context(), client.ExecRequest{Cmd: "true"}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), reason) {
		t.Errorf("exec into the ended sandbox = %v, want failed_precondition naming %q", err, reason)
	}
}

// TestExecEndsWithSandbox: an exec streaming output from a sandbox that
// is killed with `berth kill`, or whose init (runc) or sentry (gVisor)
// dies, ends promptly with the reason instead of hanging; under gVisor
// the sandbox's network stack dies with the sentry and never resets the
// daemon's connection, so only the daemon can end the call.
func TestExecEndsWithSandbox(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		t.Run("kill", func(t *testing.T) {
			sb := d.Create(t, client.CreateRequest{Isolation: iso})
			done, _ := streamingExec(t, sb)
			if out, errOut, code := d.CLI(t, nil, "kill", sb.ID); code != 0 {
				t.Fatalf("berth kill: %d %s %s", code, out, errOut)
			}
			waitEnded(t, d, sb.ID, done, "killed through the API")
		})
		t.Run("init-dies", func(t *testing.T) {
			sb := d.Create(t, client.CreateRequest{Isolation: iso})
			done, _ := streamingExec(t, sb)
			p, err := os.FindProcess(sandboxInitPid(t, d, iso, sb.ID))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			waitEnded(t, d, sb.ID, done, "init exited")
		})
		AssertNoLeaks(t, d)
	})
}
