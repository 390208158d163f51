package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// TestAgentSessionEndsWithSandbox: a request bound to a sandbox ends,
// with the reason as its cause, when the sandbox is destroyed or dies
// (an OOM kill of the whole sandbox, as under gVisor, named as such), and
// a request after that is refused at once with the reason.
func TestAgentSessionEndsWithSandbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		ooms := map[string]int64{}
		f := newLifeFixture(t, func(d *Deps) {
			d.Runtime = statsRuntime{fakeRuntime: d.Runtime.(*fakeRuntime), stats: func(ctx context.Context, id string) (runtime.Stats, error) {
				mu.Lock()
				defer mu.Unlock()
				return runtime.Stats{OOMKills: ooms[id], MemoryLimit: 64 << 20}, nil
			}}
		})
		session := func(id string) (context.Context, context.CancelFunc) {
			t.Helper()
			ctx, ep, release, err := f.m.AgentSession(t.Context(), id)
			if err != nil {
				t.Fatalf("AgentSession(%s): %v", id, err)
			}
			if ep.Addr == "" || ep.Token == "" {
				t.Errorf("AgentSession(%s) = %+v, want an address and a token", id, ep)
			}
			return ctx, release
		}
		wantEnded := func(ctx context.Context, what, reason string) {
			t.Helper()
			synctest.Wait()
			cause := EndCause(ctx)
			if cause == nil || !errors.Is(cause, errdefs.ErrFailedPrecondition) || !strings.Contains(cause.Error(), reason) {
				t.Errorf("%s: request's end cause = %v (ctx %v), want failed_precondition naming %q", what, cause, ctx.Err(), reason)
			}
		}

		killed, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		oom, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctxK, releaseK := session(killed.ID)
		defer releaseK()
		ctxO, releaseO := session(oom.ID)
		defer releaseO()
		// A released request is the caller's end, not the sandbox's.
		ctxR, releaseR := session(oom.ID)
		releaseR()
		if c := EndCause(ctxR); c != nil || ctxR.Err() == nil {
			t.Errorf("released request: cause %v, err %v; want ended with no sandbox cause", c, ctxR.Err())
		}
		synctest.Wait()
		if ctxK.Err() != nil || ctxO.Err() != nil {
			t.Fatalf("requests to ready sandboxes ended: %v, %v", ctxK.Err(), ctxO.Err())
		}

		if err := f.m.Destroy(t.Context(), killed.ID, "killed through the API"); err != nil {
			t.Fatal(err)
		}
		wantEnded(ctxK, "destroyed sandbox", "killed through the API")

		// The whole sandbox dies at its memory limit: the monitor finds
		// it stopped with an OOM kill counted.
		mu.Lock()
		ooms[oom.ID] = 1
		mu.Unlock()
		f.rt.mu.Lock()
		f.rt.running[oom.ID] = runtime.StatusStopped
		f.rt.mu.Unlock()
		// Fake clock (synctest): moves time on by one monitor round,
		// whose sample then finds the sandbox stopped; wantEnded waits
		// for it with synctest.Wait.
		time.Sleep(f.m.cfg.MonitorInterval)
		wantEnded(ctxO, "OOM-killed sandbox", "out of memory")
		got, err := f.m.Get(t.Context(), oom.ID)
		if err != nil || State(got.State) != StateStopped || !strings.Contains(got.Reason, "out of memory") {
			t.Errorf("OOM-killed sandbox = %+v, %v; want stopped, out of memory", got.Sandbox, err)
		}
		if evs := f.st.types(oom.ID); !strings.Contains(strings.Join(evs, " "), EventOOM) {
			t.Errorf("events of the OOM-killed sandbox = %v, want %s", evs, EventOOM)
		}
		// New requests fail at once, saying why.
		_, _, _, err = f.m.AgentSession(t.Context(), oom.ID)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "out of memory") {
			t.Errorf("AgentSession after the OOM kill = %v, want failed_precondition naming out of memory", err)
		}
		f.assertNothingLeft(t)
	})
}

type ctxKey struct{}

// TestAgentSessionContext: a bound request's context carries its caller's
// values and deadline, ends with its caller (a caller's end, not the
// sandbox's), and ends synchronously with the sandbox's ready period,
// cause and all, in any context derived from it.
func TestAgentSessionContext(t *testing.T) {
	f := newLifeFixture(t, nil)
	sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	caller, cancelCaller := context.WithTimeout(context.WithValue(t.Context(), ctxKey{}, "v"), time.Hour)
	ctx, _, release, err := f.m.AgentSession(caller, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := ctx.Value(ctxKey{}); got != "v" {
		t.Errorf("bound context value = %v, want the caller's", got)
	}
	if d, ok := ctx.Deadline(); !ok || d.IsZero() {
		t.Errorf("bound context has no deadline, want the caller's")
	}
	child, cancelChild := context.WithCancel(context.WithValue(ctx, ctxKey{}, "w"))
	defer cancelChild()
	if err := f.m.Destroy(t.Context(), sb.ID, "killed through the API"); err != nil {
		t.Fatal(err)
	}
	// No wait: the destroy's publish ended the ready period, and its
	// children with it.
	if cause := EndCause(child); cause == nil || !strings.Contains(cause.Error(), "killed through the API") {
		t.Errorf("derived context after destroy: cause %v, err %v; want the destroy's reason", cause, child.Err())
	}

	other, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, _, release2, err := f.m.AgentSession(caller, other.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer release2()
	cancelCaller()
	<-ctx2.Done()
	if cause := EndCause(ctx2); cause != nil {
		t.Errorf("caller's end read as the sandbox's: %v", cause)
	}
	if err := f.m.Destroy(t.Context(), other.ID, "done"); err != nil {
		t.Fatal(err)
	}
}

// sessionOnNew creates a sandbox on f and returns it with the context of
// an agent session on it, released when the test ends.
func sessionOnNew(t *testing.T, f *lifeFixture) (Sandbox, context.Context) {
	t.Helper()
	sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, _, release, err := f.m.AgentSession(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return sb, ctx
}

// TestCheckRunning: a proxy whose agent connection broke asks at once; a
// sandbox whose init is gone is then ended with the reason, and the
// request's context says so without waiting for a monitor round.
func TestCheckRunning(t *testing.T) {
	f := newLifeFixture(t, nil)
	sb, ctx := sessionOnNew(t, f)
	f.m.CheckRunning(ctx, sb.ID)
	if ctx.Err() != nil {
		t.Fatalf("a running sandbox's request ended after CheckRunning: %v", context.Cause(ctx))
	}
	f.rt.mu.Lock()
	f.rt.running[sb.ID] = runtime.StatusStopped
	f.rt.mu.Unlock()
	f.m.CheckRunning(ctx, sb.ID)
	if cause := EndCause(ctx); cause == nil || !strings.Contains(cause.Error(), "init exited") {
		t.Errorf("after CheckRunning on a dead sandbox: cause %v, want init exited", cause)
	}
}

// dyingRuntime is a fakeRuntime whose sandboxes' init is still exiting
// when asked: still running to Inspect, and done once watched (the init
// of a PID namespace reaps the namespace's other processes before it is
// seen gone, its sockets already closed).
type dyingRuntime struct{ *fakeRuntime }

func (d dyingRuntime) InitExited(_ context.Context, id string) (<-chan struct{}, error) {
	d.mu.Lock()
	d.running[id] = runtime.StatusStopped
	d.mu.Unlock()
	done := make(chan struct{})
	close(done)
	return done, nil
}

func (dyingRuntime) AgentLogTail(string) string { return "" }

// TestCheckRunningAwaitsDyingInit: a proxy whose agent connection broke
// while the sandbox's init was still exiting hears the init's end, not a
// bare broken connection.
func TestCheckRunningAwaitsDyingInit(t *testing.T) {
	f := newLifeFixture(t, func(d *Deps) { d.Runtime = dyingRuntime{d.Runtime.(*fakeRuntime)} })
	sb, ctx := sessionOnNew(t, f)
	f.m.CheckRunning(ctx, sb.ID)
	if cause := EndCause(ctx); cause == nil || !strings.Contains(cause.Error(), "init exited") {
		t.Errorf("after CheckRunning on a dying sandbox: cause %v, want init exited", cause)
	}
}

// TestPauseEndsCallsFirst: a pause ends the calls bound to the sandbox
// and waits for them to let go (their connections are endpoints gVisor
// will not checkpoint) before it checkpoints; a call's end says paused.
func TestPauseEndsCallsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newCPRuntime()
		f := newPauseFixture(t, rt)
		sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, _, release, err := f.m.AgentSession(t.Context(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		paused := make(chan error, 1)
		go func() {
			_, err := f.m.Pause(t.Context(), sb.ID)
			paused <- err
		}()
		synctest.Wait()
		if cause := EndCause(ctx); cause == nil || !strings.Contains(cause.Error(), "pausing") {
			t.Errorf("bound call during the pause: cause %v, want pausing", cause)
		}
		select {
		case err := <-paused:
			t.Fatalf("Pause returned (%v) while a call still held the sandbox", err)
		default:
		}
		release()
		if err := <-paused; err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := f.m.AgentSession(t.Context(), sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("AgentSession on a paused sandbox = %v, want failed_precondition", err)
		}
	})
}
