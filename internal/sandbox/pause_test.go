package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
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

// stopRuntime is fakeRuntime with a filesystem pause (runc's Stop and
// Start): a stopped sandbox keeps its disk (its entry, status stopped).
type stopRuntime struct {
	*fakeRuntime
	mu     sync.Mutex
	starts int
}

func (r *stopRuntime) Stop(ctx context.Context, id string) error {
	r.fakeRuntime.mu.Lock()
	defer r.fakeRuntime.mu.Unlock()
	if _, ok := r.running[id]; !ok {
		return errdefs.ErrNotFound
	}
	r.running[id] = runtime.StatusStopped
	return nil
}

func (r *stopRuntime) Start(ctx context.Context, spec runtime.Spec) error {
	r.fakeRuntime.mu.Lock()
	st, ok := r.running[spec.ID]
	r.fakeRuntime.mu.Unlock()
	if !ok || st != runtime.StatusStopped {
		return errdefs.ErrFailedPrecondition
	}
	return r.boot(ctx, spec, &r.starts)
}

// boot runs spec's BeforeStart hook, counts the boot in n and marks the
// sandbox running: what Start and Restore share.
func (r *stopRuntime) boot(ctx context.Context, spec runtime.Spec, n *int) error {
	if err := spec.BeforeStart(ctx, 4242); err != nil {
		return err
	}
	r.mu.Lock()
	*n++
	r.mu.Unlock()
	r.fakeRuntime.mu.Lock()
	r.running[spec.ID] = runtime.StatusRunning
	r.fakeRuntime.mu.Unlock()
	return nil
}

// cpRuntime adds checkpoints to stopRuntime. checkpointErr, when set,
// fails Checkpoint (after stopping the sandbox when lose is set); a nil
// one writes an image file, as runsc does.
type cpRuntime struct {
	*stopRuntime
	checkpointErr error
	lose          bool
	restores      int
	// onCheckpoint and onRestore, when set, are called as Checkpoint
	// and Restore begin.
	onCheckpoint, onRestore func()
	// diskSyncs counts SyncDisk calls per sandbox (under stopRuntime.mu).
	diskSyncs map[string]int
	// onSyncDisk, when set, is called as SyncDisk begins.
	onSyncDisk func()
}

func (r *cpRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	if r.onCheckpoint != nil {
		r.onCheckpoint()
	}
	if r.checkpointErr != nil {
		if r.lose {
			_ = r.Stop(ctx, id)
		}
		return r.checkpointErr
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("memory"), 0o600); err != nil {
		return err
	}
	return r.Stop(ctx, id)
}

// SyncDisk records the flush of a stopped sandbox's writable layer
// (DiskSyncer).
func (r *cpRuntime) SyncDisk(ctx context.Context, id string) error {
	if r.onSyncDisk != nil {
		r.onSyncDisk()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.diskSyncs == nil {
		r.diskSyncs = map[string]int{}
	}
	r.diskSyncs[id]++
	return nil
}

func (r *cpRuntime) diskSynced(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.diskSyncs[id]
}

func (r *cpRuntime) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	if r.onRestore != nil {
		r.onRestore()
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return errdefs.ErrNotFound
	}
	return r.boot(ctx, spec, &r.restores)
}

// pauseFixture is a lifeFixture whose Manager keeps checkpoints in a
// directory of its own, and can be restarted over the same fakes.
type pauseFixture struct {
	*lifeFixture
	deps Deps
	cfg  Config
	// bootID is the host's boot ID as the Manager sees it (Config.BootID);
	// a test changes it to play a host restart.
	bootID string
}

// testBootID is the boot a pauseFixture starts in.
const testBootID = "0b3c2a51-boot-one"

func newPauseFixture(t *testing.T, rt Runtime) *pauseFixture {
	t.Helper()
	f := &pauseFixture{bootID: testBootID, lifeFixture: &lifeFixture{
		rt:  fakeOf(rt),
		net: &fakeNet{ids: map[string]bool{}},
		st:  newMemStore(),
		eg:  &fakeEgress{ids: map[string]policy.Policy{}},
		fs:  &fakeFiles{files: map[string]string{}},
	}}
	f.deps = Deps{Runtime: rt, Network: f.net, Templates: fakeTemplates{}, Store: f.st, Prober: fakeProber{}, Egress: f.eg, Files: f.fs}
	f.cfg = Config{
		AgentPath: "/agent", DefaultTemplate: "minimal",
		Defaults:      Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
		Max:           Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, PidsLimit: 1000},
		CheckpointDir: filepath.Join(t.TempDir(), "checkpoints"),
		Logger:        slog.New(slog.DiscardHandler),
	}
	f.cfg.BootID = func() (string, error) { return f.bootID, nil }
	f.start(t)
	return f
}

func fakeOf(rt Runtime) *fakeRuntime {
	switch r := rt.(type) {
	case *cpRuntime:
		return r.fakeRuntime
	case *readyRuntime:
		return r.fakeRuntime
	case *loadRuntime:
		return r.fakeRuntime
	case *roomRuntime:
		return r.fakeRuntime
	case *stopRuntime:
		return r.fakeRuntime
	}
	panic("unknown fake runtime")
}

func (f *pauseFixture) start(t *testing.T) {
	t.Helper()
	m, err := New(f.cfg, f.deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	f.m = m
}

// restart is a daemon restart: the old Manager stops (its sandboxes stay
// as they are), a new one reconciles.
func (f *pauseFixture) restart(t *testing.T) {
	t.Helper()
	f.restartWith(t, func() {})
}

// restartWith is restart with the config or dependencies change sets
// (f.cfg, f.deps) in between.
func (f *pauseFixture) restartWith(t *testing.T, change func()) {
	t.Helper()
	f.m.Close()
	change()
	f.start(t)
}

// paused makes a sandbox (ten minutes' timeout) and pauses it.
func (f *pauseFixture) paused(t *testing.T) string {
	t.Helper()
	sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func (f *pauseFixture) status(id string) runtime.Status {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	return f.rt.running[id]
}

func (f *pauseFixture) attached(id string) bool {
	f.net.mu.Lock()
	defer f.net.mu.Unlock()
	return f.net.ids[id]
}

func (f *pauseFixture) egressKept(id string) bool {
	f.eg.mu.Lock()
	defer f.eg.mu.Unlock()
	_, ok := f.eg.ids[id]
	return ok
}

func newCPRuntime() *cpRuntime {
	return &cpRuntime{stopRuntime: &stopRuntime{fakeRuntime: &fakeRuntime{running: map[string]runtime.Status{}}}}
}

// TestPauseMemory: with a runtime that checkpoints, a pause keeps memory
// (a complete checkpoint, nothing partial), releases the runtime and the
// network, keeps the egress state, and stops the clock: an hour paused
// costs the deadline nothing, and resume restores and re-arms it with the
// time that was left.
func TestPauseMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newCPRuntime()
		f := newPauseFixture(t, rt)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: 10 * time.Minute, Network: &policy.Policy{Mode: policy.ModeOpen}})
		if err != nil {
			t.Fatal(err)
		}
		// synctest bubble: the sleep moves the fake clock, no real wait.
		time.Sleep(4 * time.Minute)
		got, err := f.m.Pause(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if State(got.State) != StatePaused || got.Pause != core.PauseMemory || !got.Deadline.IsZero() || got.Remaining != 6*time.Minute {
			t.Fatalf("Pause = %+v; want paused, memory, no deadline, 6m remaining", got.Sandbox)
		}
		if _, err := os.Stat(filepath.Join(f.cfg.CheckpointDir, sb.ID, "checkpoint.img")); err != nil {
			t.Errorf("checkpoint: %v", err)
		}
		if _, err := os.Stat(filepath.Join(f.cfg.CheckpointDir, sb.ID+".partial")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("partial checkpoint left: %v", err)
		}
		// The flush follows the pause after a moment: then the
		// checkpoint is marked and the writable layer was synced once.
		synctest.Wait()
		if f.m.checkpointSynced(sb.ID) {
			t.Error("checkpoint flushed at once, not after Config.CheckpointFlushDelay")
		}
		// Virtual time (synctest): the flush starts when its delay's
		// timer fires; the sleep moves the bubble's clock there, and
		// synctest.Wait is the event that the flush has run.
		time.Sleep(f.m.cfg.CheckpointFlushDelay)
		synctest.Wait()
		if b, err := os.ReadFile(filepath.Join(f.cfg.CheckpointDir, sb.ID, bootIDFile)); err != nil || string(b) != testBootID+"\n" {
			t.Errorf("boot id in the checkpoint: %q, %v; want %q", b, err, testBootID)
		}
		if !f.m.checkpointSynced(sb.ID) || rt.diskSynced(sb.ID) != 1 {
			t.Errorf("after the flush: synced %v, writable layer synced %d times; want marked, once", f.m.checkpointSynced(sb.ID), rt.diskSynced(sb.ID))
		}
		if f.status(sb.ID) != runtime.StatusStopped || f.attached(sb.ID) || !f.egressKept(sb.ID) {
			t.Errorf("paused: runtime %s, attached %v, egress kept %v; want stopped, detached, kept", f.status(sb.ID), f.attached(sb.ID), f.egressKept(sb.ID))
		}
		if rec, _ := f.st.GetSandbox(ctx, sb.ID); State(rec.State) != StatePaused || rec.Pause != core.PauseMemory {
			t.Errorf("stored %+v, want paused memory", rec)
		}
		if _, _, err := f.m.Agent(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Agent of a paused sandbox = %v, want failed precondition", err)
		}
		// synctest bubble: the sleep moves the fake clock, no real wait.
		time.Sleep(time.Hour)
		synctest.Wait()
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StatePaused {
			t.Fatalf("an hour paused: %s, want paused", got.State)
		}
		got, err = f.m.Resume(ctx, sb.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := time.Now().UTC().Add(6 * time.Minute); State(got.State) != StateReady || !got.Deadline.Equal(want) || got.Pause != "" || got.Remaining != 0 {
			t.Errorf("Resume = %+v; want ready, deadline %s", got.Sandbox, want)
		}
		if rt.restores != 1 || rt.starts != 0 {
			t.Errorf("restores %d, starts %d; want 1 restore", rt.restores, rt.starts)
		}
		if !f.attached(sb.ID) || f.status(sb.ID) != runtime.StatusRunning {
			t.Errorf("resumed: attached %v, runtime %s", f.attached(sb.ID), f.status(sb.ID))
		}
		if _, err := os.Stat(filepath.Join(f.cfg.CheckpointDir, sb.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("checkpoint kept after resume: %v", err)
		}
		// Its removal runs behind the resume (discardCheckpoint).
		synctest.Wait()
		if ents, err := os.ReadDir(f.cfg.CheckpointDir); err != nil || len(ents) != 0 {
			t.Errorf("checkpoint dir after resume: %v, %v; want empty", ents, err)
		}
		if _, _, err := f.m.Agent(ctx, sb.ID); err != nil {
			t.Errorf("Agent after resume = %v", err)
		}
		// synctest bubble: the sleep moves the fake clock, no real wait.
		time.Sleep(6*time.Minute - time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StateReady {
			t.Fatalf("a second before the deadline: %s, want ready", got.State)
		}
		// Fake clock (synctest): advances at once.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StateStopped {
			t.Errorf("past the deadline: %s, want stopped", got.State)
		}
		if got, want := f.st.types(sb.ID), []string{EventCreated, EventReady, EventPaused, EventResumed, EventDeadline, EventDestroyed}; !slices.Equal(got, want) {
			t.Errorf("events = %v, want %v", got, want)
		}
		f.assertNothingLeft(t)
	})
}

// TestPauseFilesystem: a runtime whose Checkpoint is not implemented
// (runc) pauses by stopping, and resumes by starting the agent again.
// A paused sandbox is destroyed without a trace.
func TestPauseFilesystem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newCPRuntime()
		rt.checkpointErr = errdefs.ErrNotImplemented
		f := newPauseFixture(t, rt)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.m.Pause(ctx, sb.ID)
		if err != nil || got.Pause != core.PauseFilesystem || f.status(sb.ID) != runtime.StatusStopped {
			t.Fatalf("Pause = %+v, %v; runtime %s; want filesystem, stopped", got.Sandbox, err, f.status(sb.ID))
		}
		if again, err := f.m.Pause(ctx, sb.ID); err != nil || State(again.State) != StatePaused {
			t.Errorf("second Pause = %+v, %v; want paused, no error", again.Sandbox, err)
		}
		if _, err := f.m.Resume(ctx, sb.ID, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if rt.starts != 1 || rt.restores != 0 {
			t.Errorf("starts %d, restores %d; want 1 start", rt.starts, rt.restores)
		}
		if got, _ := f.m.Get(ctx, sb.ID); !got.Deadline.Equal(time.Now().UTC().Add(30 * time.Second)) {
			t.Errorf("deadline after Resume(30s) = %s", got.Deadline)
		}
		if _, err := f.m.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := f.m.Destroy(ctx, sb.ID, "done"); err != nil {
			t.Fatal(err)
		}
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StateStopped {
			t.Errorf("destroyed paused sandbox is %s", got.State)
		}
		f.assertNothingLeft(t)
	})
}

// TestPauseCheckpointFails: a checkpoint that fails with the sandbox
// still running leaves it ready, with its deadline still armed; one that
// took the processes with it falls back to what the disk keeps, and says
// so.
func TestPauseCheckpointFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newCPRuntime()
		rt.checkpointErr = errors.New("checkpoint exploded")
		f := newPauseFixture(t, rt)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.Pause(ctx, sb.ID); err == nil {
			t.Fatal("Pause with a failing checkpoint succeeded")
		}
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StateReady || got.Remaining != 0 {
			t.Fatalf("after a failed pause: %+v; want ready", got.Sandbox)
		}
		if _, err := os.Stat(filepath.Join(f.cfg.CheckpointDir, sb.ID+".partial")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("partial checkpoint left: %v", err)
		}
		rt.lose = true
		got, err := f.m.Pause(ctx, sb.ID)
		if err != nil || got.Pause != core.PauseFilesystem {
			t.Fatalf("Pause losing processes = %+v, %v; want a filesystem pause", got.Sandbox, err)
		}
		if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StateStopped {
			t.Errorf("past the deadline: %s, want stopped", got.State)
		}
		f.assertNothingLeft(t)
	})
}

// TestOnTimeoutPauseAndAutoResume: a sandbox asking for it is paused at
// its deadline instead of destroyed, and with auto-resume the next data
// plane request (Agent) resumes it, with the default timeout since no
// time was left.
func TestOnTimeoutPauseAndAutoResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPauseFixture(t, newCPRuntime())
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Minute, OnTimeout: core.OnTimeoutPause, AutoResume: true})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		got, _ := f.m.Get(ctx, sb.ID)
		if State(got.State) != StatePaused || got.Pause != core.PauseMemory {
			t.Fatalf("past the deadline: %+v; want paused", got.Sandbox)
		}
		if _, _, err := f.m.Agent(ctx, sb.ID); err != nil {
			t.Fatalf("Agent of an auto-resume sandbox = %v", err)
		}
		got, _ = f.m.Get(ctx, sb.ID)
		if want := time.Now().UTC().Add(f.m.cfg.DefaultTimeout); State(got.State) != StateReady || !got.Deadline.Equal(want) {
			t.Errorf("after Agent: %+v; want ready, deadline %s", got.Sandbox, want)
		}
		if got, want := f.st.types(sb.ID), []string{EventCreated, EventReady, EventDeadline, EventPaused, EventResumed}; !slices.Equal(got, want) {
			t.Errorf("events = %v, want %v", got, want)
		}
		if _, err := f.m.Create(ctx, CreateRequest{OnTimeout: "hibernate"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(on_timeout hibernate) = %v, want invalid argument", err)
		}
	})
}

// TestSetTimeoutWhilePaused: a paused sandbox's timeout sets what it
// will have once resumed.
func TestSetTimeoutWhilePaused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPauseFixture(t, newCPRuntime())
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if got, err := f.m.SetTimeout(ctx, sb.ID, time.Hour); err != nil || got.Remaining != time.Hour || !got.Deadline.IsZero() {
			t.Fatalf("SetTimeout while paused = %+v, %v", got.Sandbox, err)
		}
		got, err := f.m.Resume(ctx, sb.ID, 0)
		if err != nil || !got.Deadline.Equal(time.Now().UTC().Add(time.Hour)) {
			t.Errorf("Resume = %+v, %v; want deadline in an hour", got.Sandbox, err)
		}
	})
}

// TestAdoptPauseStates: a daemon killed at any point of a pause or a
// resume finds, at its next start, a sandbox that is paused or running,
// never half of each; a partial checkpoint is never used.
func TestAdoptPauseStates(t *testing.T) {
	cases := []struct {
		name string
		// crash turns a ready sandbox into what a kill left.
		crash     func(t *testing.T, f *pauseFixture, id string)
		wantState State
		wantPause string
	}{
		{"pausing before the checkpoint", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePausing, "")
		}, StateReady, ""},
		// The runtime may still be saving and stop the sandbox once done:
		// it is stopped, its processes are lost, and it says so.
		{"pausing with a checkpoint under way, still running", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePausing, "")
			writeCheckpoint(t, f, id+".partial")
		}, StatePaused, core.PauseFilesystem},
		{"pausing with the checkpoint complete", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePausing, "")
			writeCheckpoint(t, f, id)
			f.rt.running[id] = runtime.StatusStopped
		}, StatePaused, core.PauseMemory},
		{"pausing with a partial checkpoint, processes gone", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePausing, "")
			writeCheckpoint(t, f, id+".partial")
			f.rt.running[id] = runtime.StatusStopped
		}, StatePaused, core.PauseFilesystem},
		// A runtime that does not answer is stopped, which needs no
		// answer: what the pause kept on disk decides what it is.
		{"pausing, runtime unresponsive, no checkpoint", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePausing, "")
			writeCheckpoint(t, f, id+".partial")
			f.rt.running[id] = statusUnresponsive
		}, StatePaused, core.PauseFilesystem},
		{"pausing, runtime unresponsive, checkpoint complete", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePausing, "")
			writeCheckpoint(t, f, id)
			f.rt.running[id] = statusUnresponsive
		}, StatePaused, core.PauseMemory},
		{"resuming, runtime unresponsive", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StateResuming, core.PauseMemory)
			writeCheckpoint(t, f, id)
			f.rt.running[id] = statusUnresponsive
		}, StatePaused, core.PauseMemory},
		{"resuming before the runtime ran", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StateResuming, core.PauseMemory)
			writeCheckpoint(t, f, id)
			f.rt.running[id] = runtime.StatusStopped
			delete(f.net.ids, id)
		}, StatePaused, core.PauseMemory},
		{"resuming with the runtime running", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StateResuming, core.PauseMemory)
			writeCheckpoint(t, f, id)
		}, StateReady, ""},
		// Resumed, its spent checkpoint's removal cut short.
		{"resumed, spent checkpoint left", func(t *testing.T, f *pauseFixture, id string) {
			writeCheckpoint(t, f, id+".spent")
		}, StateReady, ""},
		{"paused", func(t *testing.T, f *pauseFixture, id string) {
			setState(t, f, id, StatePaused, core.PauseFilesystem)
			f.rt.running[id] = runtime.StatusStopped
			delete(f.net.ids, id)
		}, StatePaused, core.PauseFilesystem},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newPauseFixture(t, newCPRuntime())
				ctx := t.Context()
				sb, err := f.m.Create(ctx, CreateRequest{Timeout: 10 * time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				f.m.Close()
				f.rt.mu.Lock()
				c.crash(t, f, sb.ID)
				f.rt.mu.Unlock()
				f.restart(t)
				got, err := f.m.Get(ctx, sb.ID)
				if err != nil || State(got.State) != c.wantState || got.Pause != c.wantPause {
					t.Fatalf("after restart: %+v, %v; want %s %q", got.Sandbox, err, c.wantState, c.wantPause)
				}
				for _, left := range []string{".partial", ".spent"} {
					if _, err := os.Stat(filepath.Join(f.cfg.CheckpointDir, sb.ID+left)); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s checkpoint left: %v", left, err)
					}
				}
				_, ckErr := os.Stat(filepath.Join(f.cfg.CheckpointDir, sb.ID))
				switch State(got.State) {
				case StatePaused:
					if f.status(sb.ID) != runtime.StatusStopped || f.attached(sb.ID) {
						t.Errorf("paused after restart: runtime %s, attached %v", f.status(sb.ID), f.attached(sb.ID))
					}
					if (got.Pause == core.PauseMemory) != (ckErr == nil) {
						t.Errorf("pause %s with checkpoint stat %v", got.Pause, ckErr)
					}
					if got.Remaining <= 0 || !got.Deadline.IsZero() {
						t.Errorf("paused record %+v: want time remaining and no deadline", got.Sandbox)
					}
					// And it resumes.
					if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
						t.Fatalf("Resume after restart = %v", err)
					}
				case StateReady:
					if f.status(sb.ID) != runtime.StatusRunning || !f.attached(sb.ID) || !got.Deadline.After(time.Now()) {
						t.Errorf("ready after restart: runtime %s, attached %v, deadline %s", f.status(sb.ID), f.attached(sb.ID), got.Deadline)
					}
					if ckErr == nil {
						t.Error("checkpoint kept by a ready sandbox")
					}
				}
				if err := f.m.Destroy(ctx, sb.ID, "done"); err != nil {
					t.Fatal(err)
				}
				f.assertNothingLeft(t)
			})
		})
	}
}

// setState writes what a daemon killed in state s had on record.
func setState(t *testing.T, f *pauseFixture, id string, s State, pause string) {
	t.Helper()
	rec, err := f.st.GetSandbox(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	rec.State, rec.Pause, rec.Remaining = string(s), pause, 5*time.Minute
	if s != StatePausing {
		rec.Deadline = time.Time{}
	}
	if err := f.st.PutSandbox(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
}

func writeCheckpoint(t *testing.T, f *pauseFixture, name string) {
	t.Helper()
	dir := filepath.Join(f.cfg.CheckpointDir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("memory"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// gatedRuntime holds the first Inspect until released: the monitor has
// sampled the sandbox as ready and asks the runtime while a pause runs.
type gatedRuntime struct {
	*cpRuntime
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (r *gatedRuntime) Inspect(ctx context.Context, id string) (runtime.State, error) {
	first := false
	r.once.Do(func() { first = true })
	if first {
		close(r.entered)
		<-r.release
	}
	return r.cpRuntime.Inspect(ctx, id)
}

// TestMonitorLeavesPausedSandbox: the monitor, which found a sandbox ready
// and then its runtime stopped because a pause ran in between, does not
// take that for an exited init: the sandbox stays paused.
func TestMonitorLeavesPausedSandbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &gatedRuntime{cpRuntime: newCPRuntime(), entered: make(chan struct{}), release: make(chan struct{})}
		f := &pauseFixture{lifeFixture: &lifeFixture{
			rt: rt.fakeRuntime, net: &fakeNet{ids: map[string]bool{}}, st: newMemStore(),
			eg: &fakeEgress{ids: map[string]policy.Policy{}}, fs: &fakeFiles{files: map[string]string{}},
		}}
		f.deps = Deps{Runtime: rt, Network: f.net, Templates: fakeTemplates{}, Store: f.st, Prober: fakeProber{}, Egress: f.eg, Files: f.fs}
		f.cfg = Config{AgentPath: "/agent", DefaultTemplate: "minimal", CheckpointDir: filepath.Join(t.TempDir(), "cp"),
			Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
			Logger:   slog.New(slog.DiscardHandler)}
		f.start(t)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		<-rt.entered // the monitor's sample is in the runtime
		if _, err := f.m.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		close(rt.release)
		time.Sleep(3 * time.Second) // further monitor rounds
		synctest.Wait()
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StatePaused {
			t.Errorf("after the monitor's round: %s (%s), want paused", got.State, got.Reason)
		}
	})
}

// addrNet is fakeNet that can attach at an address asked for.
type addrNet struct {
	*fakeNet
	asked []netip.Addr
}

func (n *addrNet) AttachToAt(ctx context.Context, id, nsPath string, addr netip.Addr) (Attachment, error) {
	n.asked = append(n.asked, addr)
	return n.AttachTo(ctx, id, nsPath)
}

// TestResumeAsksForTheSameAddress: a resumed sandbox asks the network for
// the address it had before the pause.
func TestResumeAsksForTheSameAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPauseFixture(t, newCPRuntime())
		an := &addrNet{fakeNet: f.net}
		f.deps.Network = an
		f.restart(t)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		before, _ := f.m.Get(ctx, sb.ID)
		if _, err := f.m.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatal(err)
		}
		if len(an.asked) != 1 || before.Network == nil || an.asked[0] != before.Network.Address {
			t.Errorf("resume asked for %v; want the address it had, %v", an.asked, before.Network)
		}
	})
}

// busyRuntime is cpRuntime with usage: while busy, its sandboxes use half
// a core.
type busyRuntime struct {
	*cpRuntime
	mu   sync.Mutex
	busy bool
	cpu  time.Duration
	at   time.Time
}

func (r *busyRuntime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.busy && !r.at.IsZero() {
		r.cpu += now.Sub(r.at) / 2
	}
	r.at = now
	return runtime.Stats{CPUUsage: r.cpu}, nil
}

func (r *busyRuntime) setBusy(b bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.busy = b
}

// TestIdlePause: a sandbox with IdlePause is paused once it has had no
// request, no request in flight and under 1 % of a core for that long;
// a request, an open stream or CPU use keeps it running; its deadline
// keeps the time it had left.
func TestIdlePause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &busyRuntime{cpRuntime: newCPRuntime()}
		f := &pauseFixture{lifeFixture: &lifeFixture{
			rt: rt.fakeRuntime, net: &fakeNet{ids: map[string]bool{}}, st: newMemStore(),
			eg: &fakeEgress{ids: map[string]policy.Policy{}}, fs: &fakeFiles{files: map[string]string{}},
		}}
		f.deps = Deps{Runtime: rt, Network: f.net, Templates: fakeTemplates{}, Store: f.st, Prober: fakeProber{}, Egress: f.eg, Files: f.fs}
		f.cfg = Config{AgentPath: "/agent", DefaultTemplate: "minimal", CheckpointDir: filepath.Join(t.TempDir(), "cp"),
			Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
			Logger:   slog.New(slog.DiscardHandler)}
		f.start(t)
		ctx := t.Context()
		state := func(id string) State {
			got, _ := f.m.Get(ctx, id)
			return State(got.State)
		}
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour, IdlePause: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// A request at 30 s restarts the idle clock (synctest's fake
		// clock: the sleep advances it, nothing waits in real time).
		time.Sleep(30 * time.Second)
		req, done := context.WithCancel(ctx)
		if _, _, err := f.m.Agent(req, sb.ID); err != nil {
			t.Fatal(err)
		}
		done()
		time.Sleep(58 * time.Second)
		synctest.Wait()
		if state(sb.ID) != StateReady {
			t.Fatalf("58 s after a request: %s, want ready", state(sb.ID))
		}
		// An open stream holds it however long it lasts.
		stream, end := context.WithCancel(ctx)
		if _, _, err := f.m.Agent(stream, sb.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		if state(sb.ID) != StateReady {
			t.Fatalf("with a stream open: %s, want ready", state(sb.ID))
		}
		end()
		// So does using CPU.
		rt.setBusy(true)
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		if state(sb.ID) != StateReady {
			t.Fatalf("while busy: %s, want ready", state(sb.ID))
		}
		rt.setBusy(false)
		time.Sleep(time.Minute + 3*time.Second)
		synctest.Wait()
		got, _ := f.m.Get(ctx, sb.ID)
		if State(got.State) != StatePaused {
			t.Fatalf("idle for a minute: %s, want paused", got.State)
		}
		// Created at 0, paused about 7.5 min in: the rest of the hour is kept.
		if got.Remaining < 50*time.Minute || got.Remaining > 53*time.Minute {
			t.Errorf("remaining %s, want the rest of the hour", got.Remaining)
		}
		if _, err := f.m.Create(ctx, CreateRequest{IdlePause: time.Millisecond}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(idle pause 1ms) = %v, want invalid argument", err)
		}
	})
}

// callLog is the calls a pause makes into a sandbox, in order.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(c string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

func (l *callLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// quiesceProber is a Prober that closes connections and quiesces agents
// (as agentlink.Link does), recording both; Quiesce fails with err.
type quiesceProber struct {
	fakeProber
	log *callLog
	err error
}

func (p quiesceProber) CloseTo(host string) { p.log.add("close") }

func (p quiesceProber) Quiesce(ctx context.Context, addr, token string) error {
	p.log.add("quiesce " + token)
	return p.err
}

// TestPauseQuiescesBeforeCheckpoint: a memory pause closes the daemon's
// connections into the sandbox, then has the agent close its own (with
// the sandbox's token), and only then checkpoints; an agent that cannot
// quiesce (an older one) does not stop the pause.
func TestPauseQuiescesBeforeCheckpoint(t *testing.T) {
	for _, qerr := range []error{nil, errdefs.ErrNotImplemented} {
		t.Run(fmt.Sprint(qerr), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := &callLog{}
				rt := newCPRuntime()
				rt.onCheckpoint = func() { log.add("checkpoint") }
				f := newPauseFixture(t, rt)
				f.deps.Prober = quiesceProber{log: log, err: qerr}
				f.m.Close()
				f.start(t)
				ctx := t.Context()
				sb, err := f.m.Create(ctx, CreateRequest{Timeout: 10 * time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				got, err := f.m.Pause(ctx, sb.ID)
				if err != nil || got.Pause != core.PauseMemory {
					t.Fatalf("Pause = %+v, %v; want paused with memory", got.Sandbox, err)
				}
				if want := []string{"close", "quiesce " + sb.Token, "checkpoint"}; !slices.Equal(log.list(), want) {
					t.Errorf("calls = %q, want %q", log.list(), want)
				}
			})
		})
	}
}

// TestCheckpointFlushAndHostRestart: a memory pause returns before its
// checkpoint is flushed, and a daemon start decides from the flush's mark
// and the boot the checkpoint was made in whether to keep it: a flushed
// one, or one from this boot (the page cache still has it), is kept and
// resumes; an unflushed one from an earlier boot (the host went down
// before the flush ended) is refused, the sandbox failed with the reason
// and nothing left; one from a daemon before the flush (no boot recorded)
// is kept as that daemon synced it. A kept unflushed one is flushed again.
func TestCheckpointFlushAndHostRestart(t *testing.T) {
	cases := []struct {
		name string
		// after changes the paused sandbox's checkpoint and the boot
		// before the daemon starts again.
		after    func(t *testing.T, f *pauseFixture, dir string)
		wantKept bool
	}{
		{"flushed, host restarted", func(t *testing.T, f *pauseFixture, dir string) {
			f.bootID = "boot-two"
		}, true},
		{"flush cut short, daemon restarted", func(t *testing.T, f *pauseFixture, dir string) {
			removeFile(t, filepath.Join(dir, syncedFile))
		}, true},
		{"flush cut short, host restarted", func(t *testing.T, f *pauseFixture, dir string) {
			removeFile(t, filepath.Join(dir, syncedFile))
			f.bootID = "boot-two"
		}, false},
		// The boot ID's bytes lost with the crash read as another boot.
		{"flush cut short, boot id lost", func(t *testing.T, f *pauseFixture, dir string) {
			removeFile(t, filepath.Join(dir, syncedFile))
			if err := os.WriteFile(filepath.Join(dir, bootIDFile), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"made by an older daemon", func(t *testing.T, f *pauseFixture, dir string) {
			removeFile(t, filepath.Join(dir, syncedFile))
			removeFile(t, filepath.Join(dir, bootIDFile))
			f.bootID = "boot-two"
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f, sb := newPausedSandbox(t)
				ctx := t.Context()
				// Virtual time (synctest): to the flush's timer, then
				// synctest.Wait for the flush to have run.
				time.Sleep(f.m.cfg.CheckpointFlushDelay)
				synctest.Wait()
				if !f.m.checkpointSynced(sb.ID) {
					t.Fatal("checkpoint not marked synced after the flush")
				}
				f.m.Close()
				dir := filepath.Join(f.cfg.CheckpointDir, sb.ID)
				c.after(t, f, dir)
				f.restart(t)
				// Virtual time, as above: the flush a start queues.
				time.Sleep(f.m.cfg.CheckpointFlushDelay)
				synctest.Wait()
				got, err := f.m.Get(ctx, sb.ID)
				if err != nil {
					t.Fatal(err)
				}
				if !c.wantKept {
					if State(got.State) != StateFailed || !strings.Contains(got.Reason, "checkpoint") {
						t.Fatalf("after restart: %s %q; want failed, the checkpoint named", got.State, got.Reason)
					}
					if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("refused checkpoint left: %v", err)
					}
					f.assertNothingLeft(t)
					return
				}
				if State(got.State) != StatePaused || got.Pause != core.PauseMemory {
					t.Fatalf("after restart: %s %s %q; want paused with memory", got.State, got.Pause, got.Reason)
				}
				// A kept one is flushed again if it was not (the older
				// daemon's too: it is not known how it was synced).
				if !f.m.checkpointSynced(sb.ID) {
					t.Error("kept checkpoint not flushed after the restart")
				}
				if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
					t.Fatalf("Resume = %v", err)
				}
				if err := f.m.Destroy(ctx, sb.ID, "done"); err != nil {
					t.Fatal(err)
				}
				f.assertNothingLeft(t)
			})
		})
	}
}

// newPausedSandbox is a pauseFixture over a cpRuntime with one sandbox,
// paused with its memory.
func newPausedSandbox(t *testing.T) (*pauseFixture, Sandbox) {
	t.Helper()
	f := newPauseFixture(t, newCPRuntime())
	sb, err := f.m.Create(t.Context(), CreateRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	return f, sb
}

func removeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointFlushFollowsItsCheckpoint: a checkpoint resumed from
// before its flush began is not flushed, and the flush of one checkpoint
// never marks the next one made at the same path (pause, resume, pause
// within the flush's delay): only the second is flushed, once, and marked.
func TestCheckpointFlushFollowsItsCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, sb := newPausedSandbox(t)
		rt := f.deps.Runtime.(*cpRuntime)
		ctx := t.Context()
		if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatal(err)
		}
		// Virtual time (synctest) throughout: each sleep moves the
		// bubble's clock to a point between or past the two flushes'
		// timers; synctest.Wait is the event that what fired has run.
		time.Sleep(f.m.cfg.CheckpointFlushDelay / 2)
		if _, err := f.m.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(f.m.cfg.CheckpointFlushDelay / 2)
		synctest.Wait()
		if f.m.checkpointSynced(sb.ID) || rt.diskSynced(sb.ID) != 0 {
			t.Fatalf("the first checkpoint's flush acted on the second: marked %v, writable layer synced %d times", f.m.checkpointSynced(sb.ID), rt.diskSynced(sb.ID))
		}
		time.Sleep(f.m.cfg.CheckpointFlushDelay / 2)
		synctest.Wait()
		if !f.m.checkpointSynced(sb.ID) || rt.diskSynced(sb.ID) != 1 {
			t.Fatalf("second checkpoint: marked %v, writable layer synced %d times; want marked, once", f.m.checkpointSynced(sb.ID), rt.diskSynced(sb.ID))
		}
		if err := f.m.Destroy(ctx, sb.ID, "done"); err != nil {
			t.Fatal(err)
		}
		f.assertNothingLeft(t)
	})
}

// TestResumeWaitsForFlushingCheckpoint: a checkpoint resumed from while
// its flush is under way is removed only once the flush has returned
// (its mark made), and then whole. Before, the removal ran beside it, and
// a mark made in the renamed directory during the removal left it behind
// ("directory not empty", TestPauseResumeMany under a CPU hog).
func TestResumeWaitsForFlushingCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, sb := newPausedSandbox(t)
		rt := f.deps.Runtime.(*cpRuntime)
		ctx := t.Context()
		flushing, release := make(chan struct{}), make(chan struct{})
		rt.onSyncDisk = func() {
			close(flushing)
			<-release
		}
		// Inside the synctest bubble: the fake clock moves past the
		// flush's delay at once (no wall-clock wait); the flush reaching
		// the runtime's disk sync is the event waited on.
		time.Sleep(f.m.cfg.CheckpointFlushDelay)
		<-flushing
		if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		spent := f.m.spentDir(sb.ID)
		if _, err := os.Stat(spent); err != nil {
			t.Errorf("the spent checkpoint while its flush is under way: %v; want it kept until the flush returns", err)
		}
		close(release)
		synctest.Wait()
		if _, err := os.Stat(spent); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the spent checkpoint after its flush returned: %v; want it removed", err)
		}
		if err := f.m.Destroy(ctx, sb.ID, "done"); err != nil {
			t.Fatal(err)
		}
		f.assertNothingLeft(t)
	})
}
