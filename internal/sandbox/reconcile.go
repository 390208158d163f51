package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// reconcile makes the host match the store after a start: sandboxes that
// still run are re-adopted, half-made or broken ones are cleaned up and
// marked failed with a reason, and leftovers nobody owns are removed.
func (m *Manager) reconcile(ctx context.Context) error {
	recs, err := m.deps.Store.ListSandboxes(ctx, string(StateCreating), string(StateReady), string(StatePaused), string(StateStopping),
		string(StatePausing), string(StateResuming))
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	owned := map[string]bool{}
	for _, rec := range recs {
		if m.adopt(ctx, rec) {
			owned[rec.ID] = true
		}
	}
	// Anything else on the host that carries this daemon's names is a
	// leftover, at every isolation level: each runtime removes its own.
	for iso, rt := range m.rts {
		rids, err := rt.List(ctx)
		if err != nil {
			return fmt.Errorf("reconcile: list %s runtime: %w", iso, err)
		}
		for _, id := range rids {
			if !owned[id] {
				m.log.Warn("remove_orphan", "sandbox_id", id, "layer", "runtime", "isolation", iso)
				if err := rt.Destroy(ctx, id); err != nil {
					m.log.Error("remove_orphan", "sandbox_id", id, "err", err)
				}
			}
		}
	}
	nids, err := m.deps.Network.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list network: %w", err)
	}
	for _, id := range nids {
		if !owned[id] {
			m.log.Warn("remove_orphan", "sandbox_id", id, "layer", "network")
			if err := m.deps.Network.Detach(ctx, id); err != nil {
				m.log.Error("remove_orphan", "sandbox_id", id, "err", err)
			}
		}
	}
	m.removeOrphanCheckpoints(owned)
	if m.deps.Egress != nil {
		eids, err := m.deps.Egress.List()
		if err != nil {
			return fmt.Errorf("reconcile: list egress state: %w", err)
		}
		for _, id := range eids {
			if !owned[id] {
				m.log.Warn("remove_orphan", "sandbox_id", id, "layer", "egress")
				if err := m.deps.Egress.Remove(id); err != nil {
					m.log.Error("remove_orphan", "sandbox_id", id, "err", err)
				}
			}
		}
	}
	return nil
}

// adopt re-attaches a sandbox that was live when the daemon stopped, or
// cleans it up. It reports whether the sandbox is live again.
func (m *Manager) adopt(ctx context.Context, rec core.Sandbox) bool {
	// Not published to m.live until adopted: nobody else sees e, so
	// adopt changes it without the op lock.
	e := newEntry(rec, nil)
	fail := func(reason string) bool {
		if err := m.teardown(ctx, e); err != nil {
			reason += "; teardown: " + err.Error()
		}
		if err := e.moveTo(StateFailed); err != nil {
			m.log.Error("adopt", "sandbox_id", rec.ID, "err", err)
			e.rec.State = string(StateFailed)
		}
		e.rec.Reason = reason
		e.rec.EndedAt = time.Now().UTC()
		if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
			m.log.Error("persist_failed_state", "sandbox_id", rec.ID, "err", err)
		}
		m.event(ctx, rec.ID, EventFailed, reason)
		m.log.Warn("sandbox_not_adopted", "sandbox_id", rec.ID, "reason", reason)
		return false
	}
	switch State(rec.State) {
	case StateCreating:
		return fail("daemon restarted while the sandbox was being created")
	case StateStopping:
		// It was being destroyed: finish the job.
		if err := m.teardown(ctx, e); err != nil {
			return fail("daemon restarted while the sandbox was being destroyed; teardown: " + err.Error())
		}
		m.stopAdopted(ctx, e, "destroyed")
		m.event(ctx, rec.ID, EventDestroyed, e.rec.Reason)
		return false
	case StatePaused, StatePausing, StateResuming:
		// Paused, or on its way (pause.go): finish or undo. A pause that
		// had not taken yet leaves a running sandbox, adopted below.
		if live, done := m.adoptPause(ctx, e, fail); done {
			return live
		}
	}
	if !e.rec.Deadline.After(time.Now()) {
		reason := "deadline reached while the daemon was down"
		if err := m.teardown(ctx, e); err != nil {
			return fail(reason + "; teardown: " + err.Error())
		}
		e.rec.Reason = reason
		m.stopAdopted(ctx, e, reason)
		m.event(ctx, rec.ID, EventDeadline, e.rec.Reason)
		m.event(ctx, rec.ID, EventDestroyed, e.rec.Reason)
		return false
	}
	rt := m.runtimeOf(rec)
	st, err := rt.Inspect(ctx, rec.ID)
	if errors.Is(err, errdefs.ErrUnavailable) {
		// Alive, but its runtime did not say how it is (a gVisor sentry
		// busy or wedged): whether it serves is the agent's to say, below;
		// if it does not, the sandbox is failed and torn down like any
		// other whose agent is gone.
		m.log.Warn("runtime_unresponsive_at_restart", "sandbox_id", rec.ID, "err", err)
		st, err = runtime.State{ID: rec.ID, Status: runtime.StatusRunning}, nil
	}
	if err != nil {
		return fail("sandbox not found by the runtime after a daemon restart: " + err.Error())
	}
	if st.Status != runtime.StatusRunning && st.Status != runtime.StatusPaused {
		// Its processes ended while no daemon watched: killed, out of
		// memory, or a host (or container) reboot, which ends them all.
		return fail(fmt.Sprintf("sandbox's processes ended while the daemon was down (the runtime says %s; a reboot of the host ends every sandbox)", st.Status))
	}
	if st.Status == runtime.StatusPaused {
		// The daemon freezes a ready sandbox only while a snapshot
		// copies its files (snapshot.go): one killed meanwhile left it
		// frozen, and its half-written snapshot is never used
		// (reconcileSnapshots).
		p, ok := rt.(pauser)
		if !ok {
			return fail("sandbox was frozen after a daemon restart and its runtime cannot thaw it")
		}
		if err := p.Resume(ctx, rec.ID); err != nil {
			return fail("sandbox was frozen by a snapshot cut short by a daemon restart; thaw: " + err.Error())
		}
		m.event(ctx, rec.ID, EventSnapshot, "thawed after a daemon restart: a snapshot was under way and is not kept")
	}
	att, err := m.deps.Network.Lookup(ctx, rec.ID)
	if err != nil {
		return fail("sandbox network missing after a daemon restart: " + err.Error())
	}
	e.att = att
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = m.deps.Prober.WaitReady(rctx, agentAddr(att))
	cancel()
	if err != nil {
		return fail("agent did not answer after a daemon restart: " + err.Error())
	}
	if err := m.readoptEgress(ctx, e); err != nil {
		return fail("egress policy not re-applied after a daemon restart: " + err.Error())
	}
	if sr, ok := rt.(StatsReader); ok {
		if stats, err := sr.Stats(ctx, rec.ID); err == nil {
			e.ooms.Store(stats.OOMKills)
		}
	}
	// A resume that had put ready on record before the daemon stopped
	// may have left the checkpoint it came from.
	if err := m.removeCheckpoint(rec.ID); err != nil {
		m.log.Warn("remove_checkpoint", "sandbox_id", rec.ID, "err", err)
	}
	e.publish()
	m.mu.Lock()
	m.live[rec.ID] = e
	m.mu.Unlock()
	m.arm(e)
	m.event(ctx, rec.ID, EventAdopted, "re-adopted after a daemon restart")
	m.log.Info("sandbox_adopted", "sandbox_id", rec.ID)
	m.guardAdoptedLoad(e, rt)
	return true
}

// stopAdopted records a sandbox found at restart as stopped, torn down
// already, with reason unless it has one.
func (m *Manager) stopAdopted(ctx context.Context, e *entry, reason string) {
	if err := e.moveTo(StateStopped); err != nil {
		m.log.Error("adopt", "sandbox_id", e.id, "err", err)
		e.rec.State = string(StateStopped)
	}
	e.rec.EndedAt = time.Now().UTC()
	if e.rec.Reason == "" {
		e.rec.Reason = reason
	}
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		m.log.Error("persist_stopped_state", "sandbox_id", e.id, "err", err)
	}
}
