package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// loadRuntime is a cpRuntime whose restores go on loading memory after
// Restore returns (gVisor's background restore): WaitRestored of a
// sandbox with a channel in loads returns what is sent on it; asked
// again, it answers again. A sandbox with no channel has loaded at once.
type loadRuntime struct {
	*cpRuntime
	lmu   sync.Mutex
	loads map[string]chan error
	asks  map[string]int
	again error
}

func newLoadRuntime() *loadRuntime {
	return &loadRuntime{cpRuntime: newCPRuntime(), loads: map[string]chan error{}, asks: map[string]int{}}
}

func (r *loadRuntime) WaitRestored(ctx context.Context, id string) error {
	r.lmu.Lock()
	r.asks[id]++
	n, ch, again := r.asks[id], r.loads[id], r.again
	r.lmu.Unlock()
	if n > 1 {
		return again
	}
	if ch == nil {
		return nil
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loading makes the next restore of id load until the test sends on the
// returned channel (buffered: a send never waits for a watcher).
func (r *loadRuntime) loading(id string) chan error {
	ch := make(chan error, 1)
	r.lmu.Lock()
	defer r.lmu.Unlock()
	r.loads[id] = ch
	r.asks[id] = 0
	return ch
}

// gateProber is fakeProber whose WaitReady, while hold is set, waits
// until its context ends: an agent that does not answer.
type gateProber struct{ hold atomic.Bool }

func (p *gateProber) WaitReady(ctx context.Context, addr string) error {
	if p.hold.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// TestPageLoadFailure: a resume whose memory load goes on after the
// restore. A load that fails before the agent answers fails the resume
// at once (not at the agent's timeout) and leaves the sandbox paused with
// its checkpoint; one that fails after the resume destroys the sandbox
// with the load's error as its reason, once the runtime reports it
// stopped or reports the failure again (or when the monitor finds it
// dead first, which then waits for the load's outcome); an error the
// runtime does not confirm leaves a running sandbox alone.
func TestPageLoadFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newLoadRuntime()
		f := newPauseFixture(t, rt)
		prober := &gateProber{}
		f.restartWith(t, func() { f.deps.Prober, f.cfg.ReadyTimeout = prober, time.Hour })
		ctx := t.Context()
		state := func(id string) Sandbox {
			t.Helper()
			sb, err := f.m.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return sb
		}
		loadErr := errors.New("pages file: unexpected EOF")

		// Before the agent answers.
		a := f.paused(t)
		load := rt.loading(a)
		prober.hold.Store(true)
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := f.m.Resume(ctx, a, 0)
			done <- err
		}()
		synctest.Wait()
		load <- loadErr
		err := <-done
		prober.hold.Store(false)
		if err == nil || !strings.Contains(err.Error(), "memory image load failed") || !strings.Contains(err.Error(), loadErr.Error()) {
			t.Fatalf("resume with a failed load = %v; want the load's error", err)
		}
		if d := time.Since(start); d >= f.cfg.ReadyTimeout {
			t.Errorf("the resume waited %v for an agent whose load had failed", d)
		}
		if sb := state(a); State(sb.State) != StatePaused || !f.m.hasCheckpoint(a) {
			t.Errorf("after a failed load: %s, checkpoint kept %v; want paused with its checkpoint", sb.State, f.m.hasCheckpoint(a))
		}
		if st := f.status(a); st == runtime.StatusRunning {
			t.Errorf("runtime %s after the failed resume; want stopped", st)
		}

		// After the resume: the runtime killed the sandbox.
		b := f.paused(t)
		load = rt.loading(b)
		if _, err := f.m.Resume(ctx, b, 0); err != nil {
			t.Fatal(err)
		}
		if sb := state(b); State(sb.State) != StateReady {
			t.Fatalf("resumed sandbox is %s", sb.State)
		}
		f.rt.mu.Lock()
		f.rt.running[b] = runtime.StatusStopped
		f.rt.mu.Unlock()
		load <- loadErr
		synctest.Wait()
		sb := state(b)
		if State(sb.State) != StateStopped || !strings.Contains(sb.Reason, "memory image load failed after the resume") || !strings.Contains(sb.Reason, loadErr.Error()) {
			t.Errorf("after a load that failed after the resume: %s, reason %q; want stopped with the load's error", sb.State, sb.Reason)
		}

		// An error the runtime does not confirm (asked again, the load
		// has ended well) while the sandbox runs.
		c := f.paused(t)
		load = rt.loading(c)
		if _, err := f.m.Resume(ctx, c, 0); err != nil {
			t.Fatal(err)
		}
		load <- errors.New("runsc wait: connection reset")
		synctest.Wait()
		if sb := state(c); State(sb.State) != StateReady {
			t.Errorf("after an unconfirmed load error: %s (%s); want ready", sb.State, sb.Reason)
		}
		// Confirmed: asked again, it failed again.
		d := f.paused(t)
		load = rt.loading(d)
		if _, err := f.m.Resume(ctx, d, 0); err != nil {
			t.Fatal(err)
		}
		rt.lmu.Lock()
		rt.again = loadErr
		rt.lmu.Unlock()
		load <- loadErr
		synctest.Wait()
		if sb := state(d); State(sb.State) != StateStopped || !strings.Contains(sb.Reason, loadErr.Error()) {
			t.Errorf("after a confirmed load failure: %s, reason %q; want stopped with the load's error", sb.State, sb.Reason)
		}

		// The monitor finds the sandbox dead before the load's watch
		// has returned (the runtime killed it for the failed load): it
		// waits for the watch, and the reason is the load's.
		g := f.paused(t)
		load = rt.loading(g)
		if _, err := f.m.Resume(ctx, g, 0); err != nil {
			t.Fatal(err)
		}
		f.rt.mu.Lock()
		f.rt.running[g] = runtime.StatusStopped
		f.rt.mu.Unlock()
		// Inside the synctest bubble: the fake clock moves past the
		// monitor's next tick at once (no wall-clock wait), and
		// synctest.Wait returns once the monitor blocks on the load.
		time.Sleep(f.m.cfg.MonitorInterval + time.Millisecond)
		synctest.Wait()
		if sb := state(g); State(sb.State) != StateReady {
			t.Fatalf("sandbox found dead while its load's outcome is awaited: %s (%s); want still ready", sb.State, sb.Reason)
		}
		load <- loadErr
		synctest.Wait()
		if sb := state(g); State(sb.State) != StateStopped || !strings.Contains(sb.Reason, "memory image load failed after the resume: "+loadErr.Error()) {
			t.Errorf("sandbox found dead by the monitor while its load failed: %s, reason %q; want stopped with the load's error", sb.State, sb.Reason)
		}
	})
}

// TestAdoptedPageLoad: a daemon restarted while a resumed sandbox's
// memory was still loading follows the load of the sandbox it adopts
// (ready, or its resume finished at the start): a failure then stops it
// with the load's error as its reason, not as a sandbox found dead with
// none. A sandbox with nothing loading is adopted and stays ready.
func TestAdoptedPageLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newLoadRuntime()
		f := newPauseFixture(t, rt)
		ctx := t.Context()
		ids := []string{f.paused(t), f.paused(t), f.paused(t)}
		loading, loaded, resuming := ids[0], ids[1], ids[2]
		rt.loading(loading)
		for _, id := range ids {
			if _, err := f.m.Resume(ctx, id, 0); err != nil {
				t.Fatal(err)
			}
		}
		// The daemon stops mid-load (one sandbox's resume not yet on
		// record as done); the loads go on in the runtime and fail
		// after the restart.
		f.m.Close()
		setState(t, f, resuming, StateResuming, core.PauseMemory)
		writeCheckpoint(t, f, resuming)
		loads := map[string]chan error{loading: rt.loading(loading), resuming: rt.loading(resuming)}
		f.restart(t)
		for id, load := range loads {
			if sb, err := f.m.Get(ctx, id); err != nil || State(sb.State) != StateReady {
				t.Fatalf("adopted sandbox %s: %+v, %v; want ready while its load goes on", id, sb.State, err)
			}
			f.rt.mu.Lock()
			f.rt.running[id] = runtime.StatusStopped
			f.rt.mu.Unlock()
			load <- errors.New("pages file: unexpected EOF")
		}
		synctest.Wait()
		for id := range loads {
			sb, err := f.m.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if State(sb.State) != StateStopped || !strings.Contains(sb.Reason, "memory image load failed after the daemon restart: pages file: unexpected EOF") {
				t.Errorf("adopted sandbox %s whose load failed: %s, reason %q; want stopped with the load's error", id, sb.State, sb.Reason)
			}
		}
		if sb, err := f.m.Get(ctx, loaded); err != nil || State(sb.State) != StateReady {
			t.Errorf("adopted sandbox with nothing loading: %+v, %v; want ready", sb.State, err)
		}
	})
}
