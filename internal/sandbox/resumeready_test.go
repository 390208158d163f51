package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// readyRuntime is a cpRuntime that can make a restore ready: prepared
// holds the sandboxes whose restore it made ready (a Stop or a Destroy
// ends it, a Restore uses it), used the sandboxes a Restore restored
// into a prepared one, in order.
type readyRuntime struct {
	*cpRuntime
	rmu        sync.Mutex
	prepared   map[string]bool
	used       []string
	prepareErr error
}

func newReadyRuntime() *readyRuntime {
	return &readyRuntime{cpRuntime: newCPRuntime(), prepared: map[string]bool{}}
}

func (r *readyRuntime) PrepareRestore(ctx context.Context, spec runtime.Spec, dir string) error {
	if spec.BeforeStart != nil || len(spec.Mounts) > 0 {
		return errors.New("a ready resume is made without a network hook or volumes")
	}
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.prepareErr != nil {
		return r.prepareErr
	}
	r.prepared[spec.ID] = true
	return nil
}

func (r *readyRuntime) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	r.rmu.Lock()
	if r.prepared[spec.ID] {
		r.used = append(r.used, spec.ID)
	}
	delete(r.prepared, spec.ID)
	r.rmu.Unlock()
	return r.cpRuntime.Restore(ctx, spec, dir)
}

func (r *readyRuntime) Stop(ctx context.Context, id string) error {
	r.rmu.Lock()
	delete(r.prepared, id)
	r.rmu.Unlock()
	return r.cpRuntime.Stop(ctx, id)
}

func (r *readyRuntime) Destroy(ctx context.Context, id string) error {
	r.rmu.Lock()
	delete(r.prepared, id)
	r.rmu.Unlock()
	return r.cpRuntime.Destroy(ctx, id)
}

// readyIDs lists the sandboxes whose restore the runtime holds ready.
func (r *readyRuntime) readyIDs() []string {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	var out []string
	for id := range r.prepared {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// readyEvents counts sandbox id's resume_ready events.
func readyEvents(t *testing.T, f *pauseFixture, id string) int {
	t.Helper()
	evs, err := f.st.Events(t.Context(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Type == EventResumeReady {
			n++
		}
	}
	return n
}

// TestResumeReady: with ResumeReady 2, each memory pause makes its
// sandbox's resume ready after it (a resume_ready event), the two most
// recent are kept and the oldest given back (stopped) when a third is
// made; a resume restores into the ready sandbox, a destroy ends one.
// A prepare that fails leaves the resume as without.
func TestResumeReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newReadyRuntime()
		f := newPauseFixture(t, rt)
		f.restartWith(t, func() { f.cfg.ResumeReady = 2 })
		ctx := t.Context()
		var ids []string
		for range 3 {
			sb, err := f.m.Create(ctx, CreateRequest{Timeout: 10 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}
		pause := func(id string) {
			t.Helper()
			if _, err := f.m.Pause(ctx, id); err != nil {
				t.Fatal(err)
			}
			// The prepare runs after the pause, in the background.
			synctest.Wait()
		}
		want := func(ready ...string) {
			t.Helper()
			slices.Sort(ready)
			if got := rt.readyIDs(); !slices.Equal(got, ready) {
				t.Errorf("ready %v, want %v", got, ready)
			}
		}
		a, b, c := ids[0], ids[1], ids[2]
		pause(a)
		want(a)
		if n := readyEvents(t, f, a); n != 1 {
			t.Errorf("%d resume_ready events, want 1", n)
		}
		pause(b)
		want(a, b)
		pause(c)
		want(b, c)
		if st := f.status(a); st != runtime.StatusStopped {
			t.Errorf("the oldest ready sandbox is %s, want stopped again", st)
		}
		if _, err := f.m.Resume(ctx, b, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.Resume(ctx, a, 0); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(rt.used, []string{b}) {
			t.Errorf("restored into a ready sandbox: %v, want only %s (a was given back)", rt.used, b)
		}
		want(c)
		if err := f.m.Destroy(ctx, c, "killed by the test"); err != nil {
			t.Fatal(err)
		}
		want()
		f.m.mu.Lock()
		left := len(f.m.ready.ids)
		f.m.mu.Unlock()
		if left != 0 {
			t.Errorf("the Manager still counts %d ready resumes", left)
		}
		// a, paused again, ready again; b resumed and paused again
		// after it: a is the oldest, so a third ready one (none here)
		// would give a back, not b.
		pause(a)
		pause(b)
		want(a, b)
		if n := readyEvents(t, f, a); n != 2 {
			t.Errorf("%d resume_ready events for a paused twice, want 2", n)
		}

		// A prepare that fails: nothing ready, the resume as without.
		rt.rmu.Lock()
		rt.prepareErr = errors.New("runsc create: no")
		rt.rmu.Unlock()
		if _, err := f.m.Resume(ctx, a, 0); err != nil {
			t.Fatal(err)
		}
		pause(a)
		want(b)
		if _, err := f.m.Resume(ctx, a, 0); err != nil {
			t.Fatalf("resume after a failed prepare: %v", err)
		}
		// A runtime that cannot: no event, nothing recorded.
		rt.rmu.Lock()
		rt.prepareErr = errdefs.ErrNotImplemented
		rt.rmu.Unlock()
		pause(a)
		if n := readyEvents(t, f, a); n != 2 {
			t.Errorf("%d resume_ready events after refused prepares, want still 2", n)
		}
	})
}

// TestResumeReadyOff: without ResumeReady no resume is made ready.
func TestResumeReadyOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newReadyRuntime()
		f := newPauseFixture(t, rt)
		sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.Pause(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := rt.readyIDs(); len(got) != 0 || readyEvents(t, f, sb.ID) != 0 {
			t.Errorf("ready %v with ResumeReady 0", got)
		}
	})
}
