package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// adoptPause takes back, at a daemon start, a sandbox on record as
// paused, pausing or resuming (pause.go). done is false when a pause had
// not taken and the sandbox still runs: its record says ready again and
// adopt carries on with it. Otherwise live says whether it is live again
// (paused or ready); fail records why not.
func (m *Manager) adoptPause(ctx context.Context, e *entry, fail func(string) bool) (live, done bool) {
	id := e.id
	rt := m.runtimeOf(e.rec)
	st, err := rt.Inspect(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrUnavailable):
		// Alive but not answering (a gVisor sentry frozen or wedged by
		// the kill): not running as far as a pause is concerned. It is
		// stopped below like any sandbox a pause had under way, which
		// needs no answer from it.
		m.log.Warn("runtime_unresponsive_at_restart", "sandbox_id", id, "err", err)
		st = runtime.State{ID: id, Status: runtime.StatusUnknown}
	case err != nil:
		return fail("sandbox disk not found by the runtime after a daemon restart: " + err.Error()), true
	}
	running := st.Status == runtime.StatusRunning
	switch e.state() {
	case StatePausing:
		// A partial checkpoint means one was under way: the sandbox's
		// runtime may still be saving it and stop the sandbox when done,
		// so it is not known to keep running. It is stopped below and
		// its processes are lost (said so); only without one was nothing
		// lost.
		_, perr := os.Stat(m.partialDir(id))
		inFlight := perr == nil
		if running && !m.hasCheckpoint(id) && !inFlight {
			// Killed before the pause took: nothing was lost.
			if err := e.moveTo(StateReady); err != nil {
				return fail(err.Error()), true
			}
			e.rec.Remaining = 0
			if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
				return fail("persist: " + err.Error()), true
			}
			m.log.Info("pause_undone_at_restart", "sandbox_id", id)
			return false, false
		}
		kind, note := core.PauseMemory, ""
		if !m.hasCheckpoint(id) {
			kind, note = core.PauseFilesystem, "; the daemon stopped before the checkpoint was complete: processes lost"
		}
		if err := m.stopKept(ctx, rt, id); err != nil {
			return fail("daemon restarted while the sandbox was being paused; stop: " + err.Error()), true
		}
		// Stopped, nothing writes it any more: an incomplete checkpoint
		// is never used.
		_ = os.RemoveAll(m.partialDir(id))
		if err := m.release(ctx, id); err != nil {
			return fail("daemon restarted while the sandbox was being paused; " + err.Error()), true
		}
		if err := m.finishPause(ctx, e, kind, "paused ("+kind+"), finished after a daemon restart"+note, time.Now()); err != nil {
			return fail(err.Error()), true
		}
	case StateResuming:
		if running {
			err := m.completeResume(ctx, e)
			if err == nil {
				m.publishAdopted(ctx, e)
				m.guardAdoptedLoad(e, rt)
				return true, true
			}
			m.log.Warn("resume_not_completed_at_restart", "sandbox_id", id, "err", err)
		}
		// Back to what it was: paused, with what it kept.
		if err := m.stopKept(ctx, rt, id); err != nil {
			return fail("daemon restarted while the sandbox was being resumed; stop: " + err.Error()), true
		}
		if err := m.release(ctx, id); err != nil {
			return fail("daemon restarted while the sandbox was being resumed; " + err.Error()), true
		}
		e.att = Attachment{}
		if err := e.moveTo(StatePaused); err != nil {
			return fail(err.Error()), true
		}
		if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
			return fail("persist: " + err.Error()), true
		}
		m.event(ctx, id, EventPaused, "the daemon restarted while the sandbox was being resumed: paused again")
	default: // paused
		if err := m.stopKept(ctx, rt, id); err != nil {
			return fail("paused sandbox not kept after a daemon restart: " + err.Error()), true
		}
		if err := m.release(ctx, id); err != nil {
			return fail("paused sandbox not kept after a daemon restart: " + err.Error()), true
		}
	}
	if e.rec.Pause == core.PauseMemory {
		if !m.hasCheckpoint(id) {
			return fail("paused sandbox's checkpoint is missing after a daemon restart"), true
		}
		if why := m.untrustedCheckpoint(id); why != "" {
			return fail(why), true
		}
		if !m.checkpointSynced(id) {
			// The daemon stopped before the flush ended (or before it
			// began, in a pause it finished above).
			m.syncCheckpointAsync(rt, id)
		}
	}
	m.publishAdopted(ctx, e)
	return true, true
}

// stopKept makes sure a paused sandbox's runtime holds only its disk
// (Stop is idempotent), whatever a crash left running.
func (m *Manager) stopKept(ctx context.Context, rt Runtime, id string) error {
	if s, ok := rt.(Stopper); ok {
		return s.Stop(ctx, id)
	}
	return nil
}

// completeResume finishes a resume a daemon restart interrupted once the
// runtime ran again: network, agent and egress, then ready.
func (m *Manager) completeResume(ctx context.Context, e *entry) error {
	att, err := m.deps.Network.Lookup(ctx, e.id)
	if err != nil {
		return err
	}
	e.att = att
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = m.deps.Prober.WaitReady(rctx, agentAddr(att))
	cancel()
	if err != nil {
		return err
	}
	if err := m.restartEgress(ctx, e); err != nil {
		return err
	}
	d := e.rec.Remaining
	if d < time.Second {
		d = m.cfg.DefaultTimeout
	}
	m.finishResume(ctx, e, d, "resume finished after a daemon restart", time.Now())
	return nil
}

// publishAdopted makes an adopted entry live (its timer, if ready, is
// armed by whoever made it ready).
func (m *Manager) publishAdopted(ctx context.Context, e *entry) {
	e.publish()
	m.mu.Lock()
	m.live[e.id] = e
	m.mu.Unlock()
	m.event(ctx, e.id, EventAdopted, "re-adopted after a daemon restart ("+e.rec.State+")")
	m.log.Info("sandbox_adopted", "sandbox_id", e.id, "state", e.rec.State)
}

// removeOrphanCheckpoints deletes checkpoints of sandboxes that are not
// live after a start.
func (m *Manager) removeOrphanCheckpoints(owned map[string]bool) {
	if m.cfg.CheckpointDir == "" {
		return
	}
	ents, err := os.ReadDir(m.cfg.CheckpointDir)
	if err != nil {
		return
	}
	for _, d := range ents {
		id := strings.TrimSuffix(d.Name(), ".partial")
		if owned[id] {
			continue
		}
		// A resumed sandbox's spent checkpoint goes whoever owns it.
		id = strings.TrimSuffix(id, ".spent")
		m.log.Warn("remove_orphan", "sandbox_id", id, "layer", "checkpoint")
		if err := os.RemoveAll(filepath.Join(m.cfg.CheckpointDir, d.Name())); err != nil {
			m.log.Error("remove_orphan", "sandbox_id", id, "err", err)
		}
	}
}
