package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Ready to resume: the Config.ResumeReady most recently paused sandboxes
// with their memory have the runtime sandbox their resume restores into
// made ahead (gVisor: `runsc create`, its gofer and its sentry started
// and waiting, its root filesystem mounted), so the resume only attaches
// the network and loads the memory: about a third less for a 256 MiB
// sandbox (README). Each holds that sandbox (tens of MiB, in its cgroup;
// the loop device of its root filesystem) while it waits; the oldest is
// given back when another is made. A resume, a destroy or a daemon
// restart ends it (the runtime's Stop of a paused sandbox releases it).
// Sandboxes with volumes are not made ready: their volumes are bound at
// the resume.

// EventResumeReady: a paused sandbox's resume is made ready.
const EventResumeReady = "resume_ready"

// RestorePreparer is a Checkpointer's optional ability to make, ahead of
// a Restore from dir, the sandbox spec.ID is restored into (runc.Runtime
// under gVisor); the Restore then uses it. ErrNotImplemented: this one
// cannot.
type RestorePreparer interface {
	PrepareRestore(ctx context.Context, spec runtime.Spec, dir string) error
}

// readyState is the paused sandboxes whose resume is made ready, under
// Manager.mu: by ID, the order in which they were made (seq counts).
type readyState struct {
	seq uint64
	ids map[string]uint64
}

// readyResumeAsync makes paused sandbox e's resume ready in the
// background, if the Manager keeps any and its runtime can.
func (m *Manager) readyResumeAsync(e *entry) {
	if m.cfg.ResumeReady <= 0 || len(e.rec.Volumes) > 0 {
		return
	}
	rp, ok := m.runtimeOf(e.rec).(RestorePreparer)
	if !ok || !m.track() {
		return
	}
	go func() {
		defer m.wg.Done()
		m.readyResume(e, rp)
	}()
}

// readyResume makes e's resume ready under its op lock, if it is paused
// with its memory still, and gives back the oldest ready one beyond the
// bound.
func (m *Manager) readyResume(e *entry, rp RestorePreparer) {
	ctx := m.life
	if err := e.lock(ctx); err != nil {
		return
	}
	if e.closed || e.state() != StatePaused || e.rec.Pause != core.PauseMemory || !m.hasCheckpoint(e.id) {
		e.unlock()
		return
	}
	start := time.Now()
	tpl, err := m.deps.Templates.Get(ctx, e.rec.Template)
	if err == nil {
		err = rp.PrepareRestore(ctx, m.resumeSpec(e, tpl), m.checkpointDir(e.id))
	}
	var oldest string
	var seq uint64
	if err == nil {
		oldest, seq = m.markReady(e.id)
	}
	e.unlock()
	switch {
	case errors.Is(err, errdefs.ErrNotImplemented):
		return
	case err != nil:
		// Nothing is left of it (PrepareRestore undoes its part): the
		// resume makes all of it, as without.
		m.log.Warn("resume_ready_failed", "sandbox_id", e.id, "err", err)
		return
	}
	// The oldest given back first: once the event is out, no more than
	// the bound are ready.
	if oldest != "" {
		m.unready(oldest, seq)
	}
	m.event(ctx, e.id, EventResumeReady, "ready to resume: its runtime sandbox is made and waits for the memory image")
	m.log.Debug("resume_ready", "sandbox_id", e.id, "elapsed", time.Since(start))
}

// markReady records id's resume as ready, and returns the oldest ready
// one beyond Config.ResumeReady ("" when within it) with its seq.
func (m *Manager) markReady(id string) (string, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ready.seq++
	m.ready.ids[id] = m.ready.seq
	if len(m.ready.ids) <= m.cfg.ResumeReady {
		return "", 0
	}
	oldest, at := "", uint64(0)
	for other, seq := range m.ready.ids {
		if oldest == "" || seq < at {
			oldest, at = other, seq
		}
	}
	return oldest, at
}

// dropReady forgets id's ready resume: it is being resumed (the runtime's
// Restore uses what was made) or destroyed.
func (m *Manager) dropReady(id string) {
	m.mu.Lock()
	delete(m.ready.ids, id)
	m.mu.Unlock()
}

// unready gives back what sandbox id's ready resume holds (its runtime
// sandbox is stopped), if it is still the one made at seq: a sandbox
// resumed and paused again meanwhile has a new one, which stays.
func (m *Manager) unready(id string, seq uint64) {
	e, ok := m.lookup(id)
	if !ok {
		m.dropReady(id)
		return
	}
	if err := e.lock(m.life); err != nil {
		return
	}
	defer e.unlock()
	m.mu.Lock()
	cur, ok := m.ready.ids[id]
	if ok && cur == seq {
		delete(m.ready.ids, id)
	}
	m.mu.Unlock()
	if !ok || cur != seq || e.closed || e.state() != StatePaused {
		return
	}
	if err := m.stopRuntime(m.life, m.runtimeOf(e.rec), id); err != nil {
		// Its resume clears what is left before it restores.
		m.log.Warn("resume_unready_failed", "sandbox_id", id, "err", err)
		return
	}
	m.log.Debug("resume_unready", "sandbox_id", id)
}
