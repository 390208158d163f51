package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// The lifecycle tests run in synctest bubbles: deadlines, the monitor's
// ticker and context timeouts run on the bubble's clock, which moves only
// when every goroutine in it is blocked, so no test sleeps for real.

func TestStateTransitions(t *testing.T) {
	all := []State{StateCreating, StateReady, StatePausing, StatePaused, StateResuming, StateStopping, StateStopped, StateFailed}
	allowed := map[State][]State{
		StateCreating: {StateReady, StateFailed},
		StateReady:    {StatePausing, StateStopping, StateStopped, StateFailed},
		StatePausing:  {StatePaused, StateReady, StateFailed},
		StatePaused:   {StateResuming, StateStopping, StateStopped, StateFailed},
		StateResuming: {StateReady, StatePaused, StateFailed},
		StateStopping: {StateStopped, StateFailed},
	}
	for _, from := range all {
		for _, to := range all {
			if got, want := from.next(to), slices.Contains(allowed[from], to); got != want {
				t.Errorf("%s.next(%s) = %v, want %v", from, to, got, want)
			}
		}
	}
	e := newEntry(core.Sandbox{ID: "x", State: string(StateStopped)}, nil)
	if err := e.moveTo(StateReady); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("moveTo(ready) from stopped = %v, want failed precondition", err)
	}
}

func TestDeadlineDestroys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newLifeFixture(t, nil)
		sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// A follower sees the whole life and returns at its end.
		followed := make(chan []string, 1)
		go func() {
			var types []string
			err := f.m.FollowEvents(t.Context(), sb.ID, func(e core.Event) error { types = append(types, e.Type); return nil })
			if err != nil {
				t.Errorf("FollowEvents = %v", err)
			}
			followed <- types
		}()
		// Inside a synctest bubble time.Sleep moves the fake clock at
		// once (no real wait); synctest.Wait then lets every timer that
		// fired run to a standstill before the assertion.
		time.Sleep(time.Minute - time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(t.Context(), sb.ID); State(got.State) != StateReady {
			t.Fatalf("a second before the deadline: %s, want ready", got.State)
		}
		if len(followed) != 0 {
			t.Fatal("FollowEvents returned before the deadline")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got, want := <-followed, []string{EventCreated, EventReady, EventDeadline, EventDestroyed}; !slices.Equal(got, want) {
			t.Errorf("followed events = %v, want %v", got, want)
		}
		got, err := f.m.Get(t.Context(), sb.ID)
		if err != nil || State(got.State) != StateStopped || got.Reason != "deadline reached" {
			t.Errorf("after the deadline: %+v, %v; want stopped, deadline reached", got.Sandbox, err)
		}
		if got, want := f.st.types(sb.ID), []string{EventCreated, EventReady, EventDeadline, EventDestroyed}; !slices.Equal(got, want) {
			t.Errorf("events = %v, want %v", got, want)
		}
		f.assertNothingLeft(t)
	})
}

func TestSetTimeoutExtends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newLifeFixture(t, nil)
		sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Second)
		got, err := f.m.SetTimeout(t.Context(), sb.ID, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if want := time.Now().UTC().Add(2 * time.Minute); !got.Deadline.Equal(want) {
			t.Errorf("SetTimeout deadline = %s, want %s", got.Deadline, want)
		}
		// Past the old deadline, short of the new one.
		time.Sleep(time.Minute + 59*time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(t.Context(), sb.ID); State(got.State) != StateReady {
			t.Fatalf("past the old deadline: %s, want ready", got.State)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(t.Context(), sb.ID); State(got.State) != StateStopped {
			t.Errorf("past the new deadline: %s, want stopped", got.State)
		}
		if got, want := f.st.types(sb.ID), []string{EventCreated, EventReady, EventTimeoutChanged, EventDeadline, EventDestroyed}; !slices.Equal(got, want) {
			t.Errorf("events = %v, want %v", got, want)
		}
		f.assertNothingLeft(t)
	})
}

// slowCreate starts a Create whose runtime blocks until release is closed
// (or the create's context ends), and returns the sandbox's ID once the
// create is inside the runtime, plus the create's result.
func slowCreate(t *testing.T, f *lifeFixture, req CreateRequest, release chan struct{}) (string, <-chan error) {
	t.Helper()
	ids := make(chan string, 1)
	f.rt.started = func(ctx context.Context, id string) error {
		ids <- id
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.m.Create(context.Background(), req)
		done <- err
	}()
	select {
	case id := <-ids:
		return id, done
	case err := <-done:
		t.Fatalf("create ended before its runtime step: %v", err)
		return "", nil
	}
}

// TestReadersDoNotWaitForCreate: while a create is stuck in its runtime,
// readers answer at once from the published status, and writers wait for
// the operation lock only as long as their context allows.
func TestReadersDoNotWaitForCreate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newLifeFixture(t, nil)
		release := make(chan struct{})
		id, done := slowCreate(t, f, CreateRequest{}, release)
		ctx := t.Context()

		// Each reader returns without the bubble's clock moving: none
		// waited on anything.
		start := time.Now()
		if got, err := f.m.Get(ctx, id); err != nil || State(got.State) != StateCreating || got.Network != nil {
			t.Errorf("Get during create = %+v, %v; want creating, no network", got, err)
		}
		if list, err := f.m.List(ctx, ListOptions{States: []string{string(StateCreating)}}); err != nil || len(list) != 1 || list[0].ID != id {
			t.Errorf("List(creating) during create = %+v, %v", list, err)
		}
		if _, _, err := f.m.Agent(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Agent during create = %v, want failed precondition", err)
		}
		if _, err := f.m.NetworkPolicy(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("NetworkPolicy during create = %v", err)
		}
		f.m.sample(ctx) // the monitor skips it
		if d := time.Since(start); d != 0 {
			t.Errorf("readers took %s of the bubble's clock, want 0", d)
		}

		// Writers wait for the lock, bounded by their context.
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := f.m.SetTimeout(tctx, id, time.Hour)
		cancel()
		if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
			t.Errorf("SetTimeout during create = %v, want deadline exceeded", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := f.m.SetNetworkPolicy(cctx, id, policy.Policy{Mode: policy.ModeNone}); !errors.Is(err, errdefs.ErrCanceled) {
			t.Errorf("SetNetworkPolicy(cancelled) during create = %v, want canceled", err)
		}

		close(release)
		if err := <-done; err != nil {
			t.Fatalf("create: %v", err)
		}
		if _, _, err := f.m.Agent(ctx, id); err != nil {
			t.Errorf("Agent after create = %v", err)
		}
		if got, err := f.m.Get(ctx, id); err != nil || State(got.State) != StateReady || got.Network == nil {
			t.Errorf("Get after create = %+v, %v; want ready with network", got, err)
		}
	})
}

// TestDestroyAbortsCreate: a destroy during a create aborts it at once,
// whether the create is in its runtime step or in a setup that would run
// for the sandbox's whole lifetime, and the create leaves nothing behind.
func TestDestroyAbortsCreate(t *testing.T) {
	for _, step := range []string{"runtime", "setup"} {
		t.Run(step, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newLifeFixture(t, nil)
				req := CreateRequest{Timeout: time.Hour}
				release := make(chan struct{})
				var id string
				var done <-chan error
				if step == "runtime" {
					id, done = slowCreate(t, f, req, release)
				} else {
					started := make(chan string, 1)
					req.Setup = func(ctx context.Context, h *SetupHandle) error {
						started <- h.ID()
						<-ctx.Done()
						return ctx.Err()
					}
					errc := make(chan error, 1)
					go func() {
						_, err := f.m.Create(context.Background(), req)
						errc <- err
					}()
					id, done = <-started, errc
				}
				start := time.Now()
				if err := f.m.Destroy(t.Context(), id, "killed"); err != nil {
					t.Errorf("Destroy during %s = %v", step, err)
				}
				if d := time.Since(start); d != 0 {
					t.Errorf("Destroy waited %s of the bubble's clock, want 0", d)
				}
				if err := <-done; err == nil || !strings.Contains(err.Error(), step) {
					t.Errorf("aborted create = %v, want a %s failure", err, step)
				}
				got, err := f.m.Get(t.Context(), id)
				if err != nil || State(got.State) != StateFailed || got.Reason == "" {
					t.Errorf("after abort: %+v, %v; want failed with a reason", got.Sandbox, err)
				}
				if got, want := f.st.types(id), []string{EventCreated, EventFailed}; !slices.Equal(got, want) {
					t.Errorf("events = %v, want %v", got, want)
				}
				f.assertNothingLeft(t)
			})
		})
	}
}

// TestCreateUndo fails a create at each step and checks the undo stack
// removed whatever the steps before (and the failing step itself) made.
func TestCreateUndo(t *testing.T) {
	for _, tc := range []struct {
		step  string
		setup func(f *lifeFixture, req *CreateRequest)
	}{
		{"runtime", func(f *lifeFixture, _ *CreateRequest) { f.rt.failOn = "create" }},
		{"network", func(f *lifeFixture, _ *CreateRequest) { f.net.failAttach = true }},
		{"runtime start", func(f *lifeFixture, _ *CreateRequest) { f.rt.failOn = "start" }},
		{"egress prepare", func(f *lifeFixture, _ *CreateRequest) { f.eg.failOn = "prepare" }},
		{"egress start", func(f *lifeFixture, _ *CreateRequest) { f.eg.failOn = "start" }},
		{"agent did not become ready", func(f *lifeFixture, _ *CreateRequest) { f.m.deps.Prober = fakeProber{fail: true} }},
		{"egress install", func(f *lifeFixture, _ *CreateRequest) { f.fs.failPath = resolvConfPath }},
		{"setup", func(_ *lifeFixture, req *CreateRequest) {
			req.Setup = func(context.Context, *SetupHandle) error { return errors.New("setup exploded") }
		}},
		{"persist", func(f *lifeFixture, _ *CreateRequest) {
			f.st.failPut = func(sb core.Sandbox) error {
				if State(sb.State) == StateReady {
					return errors.New("disk full")
				}
				return nil
			}
		}},
	} {
		t.Run(tc.step, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newLifeFixture(t, nil)
				var req CreateRequest
				tc.setup(f, &req)
				sb, err := f.m.Create(t.Context(), req)
				if err == nil {
					t.Fatal("Create succeeded")
				}
				if State(sb.State) != StateFailed || sb.Reason != err.Error() {
					t.Errorf("failed Create = %+v, want failed with the error as reason", sb.Sandbox)
				}
				stored, gerr := f.st.GetSandbox(t.Context(), sb.ID)
				if gerr != nil || State(stored.State) != StateFailed {
					t.Errorf("stored record = %+v, %v; want failed", stored, gerr)
				}
				if got := f.st.types(sb.ID); len(got) == 0 || got[len(got)-1] != EventFailed {
					t.Errorf("events = %v, want failed last", got)
				}
				f.assertNothingLeft(t)
			})
		})
	}
}

// TestMonitor: one round samples every ready sandbox at once (bounded by
// monitorParallel), turns an OOM kill into an event, and tears down a
// sandbox whose init died.
func TestMonitor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu       sync.Mutex
			inFlight int
			peak     int
			ooms     = map[string]int64{}
			gate     chan struct{}
		)
		stats := func(ctx context.Context, id string) (runtime.Stats, error) {
			mu.Lock()
			g := gate
			inFlight++
			peak = max(peak, inFlight)
			n := ooms[id]
			mu.Unlock()
			if g != nil {
				<-g
			}
			mu.Lock()
			inFlight--
			mu.Unlock()
			return runtime.Stats{OOMKills: n, MemoryLimit: 256 << 20}, nil
		}
		f := newLifeFixture(t, func(d *Deps) {
			d.Runtime = statsRuntime{fakeRuntime: d.Runtime.(*fakeRuntime), stats: stats}
		})
		const n = monitorParallel + 2
		var ids []string
		for range n {
			sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}

		// Hold every sample: a round has monitorParallel in flight.
		mu.Lock()
		gate = make(chan struct{})
		mu.Unlock()
		time.Sleep(f.m.cfg.MonitorInterval)
		synctest.Wait()
		mu.Lock()
		got := inFlight
		mu.Unlock()
		if got != monitorParallel {
			t.Errorf("samples in flight = %d, want %d (of %d sandboxes)", got, monitorParallel, n)
		}
		mu.Lock()
		close(gate)
		gate = nil
		mu.Unlock()
		synctest.Wait()

		// An OOM kill in one, init gone in another.
		mu.Lock()
		ooms[ids[0]] = 2
		mu.Unlock()
		f.rt.mu.Lock()
		f.rt.running[ids[1]] = runtime.StatusStopped
		f.rt.mu.Unlock()
		time.Sleep(f.m.cfg.MonitorInterval)
		synctest.Wait()
		if got := f.st.types(ids[0]); !slices.Contains(got, EventOOM) {
			t.Errorf("events after an OOM kill = %v, want %s", got, EventOOM)
		}
		got1, err := f.m.Get(t.Context(), ids[1])
		if err != nil || State(got1.State) != StateStopped || !strings.Contains(got1.Reason, "init exited") {
			t.Errorf("sandbox whose init died = %+v, %v; want stopped, init exited", got1.Sandbox, err)
		}
		// One OOM event per kill, not per round.
		time.Sleep(f.m.cfg.MonitorInterval)
		synctest.Wait()
		if got := f.st.types(ids[0]); len(slices.DeleteFunc(got, func(s string) bool { return s != EventOOM })) != 1 {
			t.Errorf("events = %v, want one %s", got, EventOOM)
		}
		for _, id := range ids {
			f.m.Destroy(t.Context(), id, "done")
		}
		f.assertNothingLeft(t)
	})
}

// TestMonitorGVisorOOMSampledBeforeExit: a gVisor sandbox dies whole when
// the host's OOM killer takes its sentry, and the monitor's sampling may
// count that kill (and report it) while the dying sentry still looks
// running: the exit that follows is still put down to memory. A runc
// sandbox, where an OOM kill takes one process and init lives on, keeps
// the plain reason.
func TestMonitorGVisorOOMSampledBeforeExit(t *testing.T) {
	for _, iso := range []string{core.IsolationGVisor, core.IsolationRunc} {
		t.Run(iso, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu   sync.Mutex
					ooms = map[string]int64{}
				)
				stats := func(ctx context.Context, id string) (runtime.Stats, error) {
					mu.Lock()
					defer mu.Unlock()
					return runtime.Stats{OOMKills: ooms[id], MemoryLimit: 64 << 20}, nil
				}
				f := newLifeFixture(t, func(d *Deps) {
					rt := statsRuntime{fakeRuntime: d.Runtime.(*fakeRuntime), stats: stats}
					d.Runtime = rt
					d.Runtimes = map[string]Runtime{core.IsolationRunc: rt, core.IsolationGVisor: rt}
				})
				sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: time.Hour, Isolation: iso})
				if err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				ooms[sb.ID] = 1
				mu.Unlock()
				// synctest bubble: the sleep moves the fake clock one
				// monitor round on; Wait lets that round finish.
				time.Sleep(f.m.cfg.MonitorInterval)
				synctest.Wait()
				if got := f.st.types(sb.ID); !slices.Contains(got, EventOOM) {
					t.Fatalf("events after an OOM kill = %v, want %s", got, EventOOM)
				}
				f.rt.mu.Lock()
				f.rt.running[sb.ID] = runtime.StatusStopped
				f.rt.mu.Unlock()
				// synctest bubble: the sleep moves the fake clock one
				// monitor round on; Wait lets that round finish.
				time.Sleep(f.m.cfg.MonitorInterval)
				synctest.Wait()
				got, err := f.m.Get(t.Context(), sb.ID)
				if err != nil || State(got.State) != StateStopped {
					t.Fatalf("sandbox whose init died = %+v, %v; want stopped", got.Sandbox, err)
				}
				if oom := strings.Contains(got.Reason, "out of memory"); oom != (iso == core.IsolationGVisor) {
					t.Errorf("reason = %q; out of memory named: %v, want %v", got.Reason, oom, iso == core.IsolationGVisor)
				}
				if evs := f.st.types(sb.ID); len(slices.DeleteFunc(evs, func(s string) bool { return s != EventOOM })) != 1 {
					t.Errorf("events = %v, want one %s", evs, EventOOM)
				}
				f.assertNothingLeft(t)
			})
		})
	}
}

// exitedRuntime is a fakeRuntime whose sandboxes' init has exited, with
// last words in its agent's log.
type exitedRuntime struct{ *fakeRuntime }

func (exitedRuntime) InitExited(context.Context, string) (<-chan struct{}, error) {
	done := make(chan struct{})
	close(done)
	return done, nil
}

func (exitedRuntime) AgentLogTail(string) string { return "agent: listen: address in use" }

// blockingProber never sees the agent answer.
type blockingProber struct{}

func (blockingProber) WaitReady(ctx context.Context, _ string) error {
	<-ctx.Done()
	return fmt.Errorf("agent: %w", errdefs.ErrUnavailable)
}

// TestCreateFailsWhenInitExits: a create whose sandbox's init dies before
// its agent answers fails then, with the agent's last words, not at the
// ready timeout; and leaves nothing behind.
func TestCreateFailsWhenInitExits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newLifeFixture(t, func(d *Deps) {
			d.Prober = blockingProber{}
			d.Runtime = exitedRuntime{d.Runtime.(*fakeRuntime)}
		})
		start := time.Now()
		_, err := f.m.Create(t.Context(), CreateRequest{})
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) ||
			!strings.Contains(err.Error(), "sandbox init exited before its agent answered") ||
			!strings.Contains(err.Error(), "address in use") {
			t.Fatalf("Create = %v; want unavailable naming the exit and the agent's last words", err)
		}
		// The fake clock: the create ended at the watch's delay, far
		// short of the ready timeout.
		if waited := time.Since(start); waited >= f.m.cfg.ReadyTimeout {
			t.Errorf("create failed after %v, the ready timeout (%v)", waited, f.m.cfg.ReadyTimeout)
		}
		f.assertNothingLeft(t)
	})
}
