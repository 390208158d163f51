package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/template"
)

// Pause and resume.
//
// A pause keeps what the sandbox's runtime can keep, and the record says
// which (core.Sandbox.Pause): with a Checkpointer that can (gVisor), every
// process and its memory (PauseMemory); otherwise, with a Stopper (runc),
// the writable layer: processes end and resume starts the agent again
// (PauseFilesystem). Either way the environment, labels, token, egress
// policy and CA, and the deadline's remaining time are kept, and the
// sandbox's CPU, memory, cgroup, mounts, network attachment and egress
// services are released. What a paused sandbox holds on the host: its
// runtime state dir (disk image, uid range claim), its egress state dir
// (policy, CA) and, for a memory pause, its checkpoint under
// Config.CheckpointDir.
//
// Both directions are written to the store before they start (pausing,
// resuming), so a daemon killed half way finds the sandbox's intent at
// restart and finishes or reverts it (adoptPausing, adoptResuming): the
// sandbox ends paused, running or failed with a reason. A checkpoint is
// written to a temporary directory and renamed into place once complete;
// only a renamed one is ever restored.

// Lifecycle events of pause and resume.
const (
	EventPaused      = "paused"
	EventResumed     = "resumed"
	EventPauseFailed = "pause_failed"
)

// Stopper is the optional ability to end a sandbox's processes keeping
// its disk (its writable layer), and to start its agent again on it.
// Stop releases everything else the runtime holds for it (container,
// cgroups, mounts) and is idempotent; Start wants the spec Create got.
type Stopper interface {
	Stop(ctx context.Context, id string) error
	Start(ctx context.Context, spec runtime.Spec) error
}

// reattacher is the Network's optional ability to attach a sandbox at
// the address it had (hostnet.Network.AttachToAt), when that is free.
type reattacher interface {
	AttachToAt(ctx context.Context, id, nsPath string, addr netip.Addr) (Attachment, error)
}

// connCloser is the Prober's optional ability to close every connection
// it has to one sandbox (by IP address), idle or in use, before the call
// returns (agentlink.Link).
type connCloser interface{ CloseTo(host string) }

// quiescer is the Prober's optional ability to have a sandbox's agent
// close every connection it holds and confirm it (agentlink.Link).
type quiescer interface {
	Quiesce(ctx context.Context, addr, token string) error
}

// idleCloser is the Prober's optional ability to drop its idle
// connections to agents.
type idleCloser interface{ CloseIdle() }

// checkpointDir is where a memory pause keeps sandbox id's checkpoint.
func (m *Manager) checkpointDir(id string) string { return filepath.Join(m.cfg.CheckpointDir, id) }

// partialDir is where a checkpoint is written before it is complete.
func (m *Manager) partialDir(id string) string { return m.checkpointDir(id) + ".partial" }

// spentDir is where a resumed sandbox's checkpoint waits to be removed
// (discardCheckpoint).
func (m *Manager) spentDir(id string) string { return m.checkpointDir(id) + ".spent" }

// removeCheckpoint deletes a sandbox's checkpoint, complete or not.
func (m *Manager) removeCheckpoint(id string) error {
	if m.cfg.CheckpointDir == "" {
		return nil
	}
	m.takeFlush(id).end()
	return errors.Join(os.RemoveAll(m.partialDir(id)), os.RemoveAll(m.checkpointDir(id)), os.RemoveAll(m.spentDir(id)))
}

// discardCheckpoint deletes a resumed sandbox's checkpoint without making
// the resume wait for it: unlinking its pages, hundreds of MiB in the page
// cache, takes tens of milliseconds (60–90 ms for 290 MiB here). The
// checkpoint is renamed out of the way at once, so a next pause finds no
// old one, and removed in the background; whatever a daemon stop leaves
// of it is an orphan its next start removes (removeOrphanCheckpoints),
// and a destroy removes it too (removeCheckpoint).
func (m *Manager) discardCheckpoint(id string) error {
	if m.cfg.CheckpointDir == "" {
		return nil
	}
	if err := os.RemoveAll(m.partialDir(id)); err != nil {
		return err
	}
	spent := m.spentDir(id)
	if err := os.Rename(m.checkpointDir(id), spent); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		// The last one's removal still running, say: here and now.
		return m.removeCheckpoint(id)
	}
	// The renamed checkpoint's flush, if still pending, ends before the
	// removal (syncCheckpointAsync).
	f := m.takeFlush(id)
	if !m.track() {
		f.end()
		return os.RemoveAll(spent)
	}
	go func() {
		defer m.wg.Done()
		f.end()
		if err := os.RemoveAll(spent); err != nil {
			m.log.Warn("remove_checkpoint", "sandbox_id", id, "err", err)
		}
	}()
	return nil
}

// hasCheckpoint reports whether a complete checkpoint of id exists.
func (m *Manager) hasCheckpoint(id string) bool {
	if m.cfg.CheckpointDir == "" {
		return false
	}
	fi, err := os.Stat(m.checkpointDir(id))
	return err == nil && fi.IsDir()
}

// liveEntry returns a live sandbox's entry, or why there is none.
func (m *Manager) liveEntry(ctx context.Context, id string) (*entry, error) {
	e, ok := m.lookup(id)
	if !ok {
		if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	return e, nil
}

// Pause pauses a ready sandbox (see above). Pausing a paused one changes
// nothing.
func (m *Manager) Pause(ctx context.Context, id string) (Sandbox, error) {
	e, done, err := m.lockToggle(ctx, id, StateReady, StatePaused)
	if err != nil {
		return Sandbox{}, err
	}
	defer e.unlock()
	if done {
		return Sandbox{Sandbox: e.rec}, nil
	}
	remaining := max(time.Until(e.rec.Deadline), 0)
	if err := m.pause(ctx, e, remaining, "paused", false); err != nil {
		return Sandbox{Sandbox: e.rec}, err
	}
	return Sandbox{Sandbox: e.rec}, nil
}

// pause moves a ready sandbox to paused; the caller holds its op lock.
// remaining is what its deadline keeps. On an error the sandbox is ready
// again (nothing was lost) or failed with the reason (it could not be
// kept). keepDisk: where its memory image has no room on the disk
// (room.go), pause it keeping its files only rather than not at all.
func (m *Manager) pause(ctx context.Context, e *entry, remaining time.Duration, why string, keepDisk bool) error {
	ctx = context.WithoutCancel(ctx)
	id := e.id
	rt := m.runtimeOf(e.rec)
	stopper, canStop := rt.(Stopper)
	cp, canCheckpoint := rt.(Checkpointer)
	canCheckpoint = canCheckpoint && m.cfg.CheckpointDir != ""
	if !canStop && !canCheckpoint {
		return fmt.Errorf("pause sandbox %s: its runtime cannot stop or checkpoint a sandbox: %w", id, errdefs.ErrNotImplemented)
	}
	kind, note := "", ""
	if canCheckpoint && savesMemory(rt) {
		// Room for its memory first, before anything is touched (the
		// directory made here is where checkpoint writes).
		if err := os.MkdirAll(m.cfg.CheckpointDir, 0o700); err != nil {
			return fmt.Errorf("pause sandbox %s: %w", id, err)
		}
		release, err := m.claimImageRoom(ctx, e, m.cfg.CheckpointDir)
		switch {
		case err == nil:
			defer release()
		case errors.Is(err, errNoImageRoom) && keepDisk && canStop:
			canCheckpoint, note = false, "; "+err.Error()
			m.log.Warn("checkpoint_no_room", "sandbox_id", id, "err", err)
		default:
			return fmt.Errorf("pause sandbox %s: %w", id, err)
		}
	}
	start := time.Now()
	e.stopTimer()
	deadline := e.rec.Deadline
	if err := e.moveTo(StatePausing); err != nil {
		m.arm(e)
		return err
	}
	e.rec.Remaining = remaining
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		e.rec.State, e.rec.Remaining = string(StateReady), 0
		m.arm(e)
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	run := e.cur.Load().run
	e.publish()
	if run != nil {
		// Publishing pausing ended the calls into it (session.go): their
		// connections are connected endpoints in the sandbox's network
		// stack, which gVisor will not checkpoint, so they go first.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		run.wait(wctx)
		cancel()
	}
	// back returns the sandbox to ready when the pause failed before
	// anything was lost.
	back := func(err error) error {
		if merr := e.moveTo(StateReady); merr != nil {
			return errors.Join(err, merr)
		}
		e.rec.Remaining, e.rec.Deadline = 0, deadline
		if perr := m.deps.Store.PutSandbox(ctx, e.rec); perr != nil {
			m.log.Error("persist_pause_rollback", "sandbox_id", id, "err", perr)
		}
		e.publish()
		m.arm(e)
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	if canCheckpoint {
		err := m.checkpoint(ctx, cp, e)
		switch {
		case err == nil:
			kind = core.PauseMemory
		case errors.Is(err, errdefs.ErrNotImplemented):
			// This runtime keeps files only.
		default:
			if st, ierr := rt.Inspect(ctx, id); ierr == nil && st.Status == runtime.StatusRunning {
				return back(err)
			}
			// The checkpoint failed and took the processes with it:
			// what is left to keep is the disk.
			note = "; checkpoint failed, processes lost: " + err.Error()
			m.log.Warn("checkpoint_failed", "sandbox_id", id, "err", err)
		}
	}
	if kind == "" && !canStop {
		return back(fmt.Errorf("its runtime cannot checkpoint it and has no filesystem pause: %w", errdefs.ErrNotImplemented))
	}
	checkpointed := time.Now()
	// The network and egress services go while the runtime stops: neither
	// needs the other (a filesystem pause's processes may see their
	// network go just before they end), and the two are each tens of
	// milliseconds of kernel work (a link's deletion, a mount's).
	released := make(chan error, 1)
	go func() { released <- m.release(ctx, id) }()
	var stopErr error
	if canStop {
		stopErr = stopper.Stop(ctx, id)
	}
	stopped := time.Now()
	relErr := <-released
	if stopErr != nil {
		return m.failLive(ctx, e, "pause failed: stop: "+stopErr.Error())
	}
	if relErr != nil {
		return m.failLive(ctx, e, "pause failed: "+relErr.Error())
	}
	if kind == "" {
		kind = core.PauseFilesystem
	}
	m.log.Debug("pause_phases", "sandbox_id", id, "checkpoint", checkpointed.Sub(start), "stop", stopped.Sub(checkpointed), "released", time.Since(checkpointed))
	if err := m.finishPause(ctx, e, kind, why+" ("+kind+")"+note, start); err != nil {
		return err
	}
	if kind == core.PauseMemory {
		m.syncCheckpointAsync(rt, id)
		m.readyResumeAsync(e)
	}
	return nil
}

// pauseAtDeadline pauses a sandbox whose deadline passed and that asked
// for a pause then; false when the pause failed and left it running, for
// the caller to destroy it as at any deadline.
func (m *Manager) pauseAtDeadline(e *entry) bool {
	if err := e.lock(m.life); err != nil {
		return true // the daemon is closing: the next start sees the deadline
	}
	defer e.unlock()
	if e.closed || e.state() != StateReady {
		return true // destroyed or paused meanwhile
	}
	m.event(m.life, e.id, EventDeadline, "deadline reached: pausing")
	err := m.pause(m.life, e, 0, "paused at its deadline", true)
	if err != nil && !e.closed {
		m.log.Warn("pause_at_deadline", "sandbox_id", e.id, "err", err)
		return false
	}
	return true
}

// checkpoint saves sandbox e into its checkpoint dir: written under a
// temporary name and renamed once complete.
func (m *Manager) checkpoint(ctx context.Context, cp Checkpointer, e *entry) error {
	id := e.id
	start := time.Now()
	// A spent one is left to its removal (discardCheckpoint).
	if err := errors.Join(os.RemoveAll(m.partialDir(id)), os.RemoveAll(m.checkpointDir(id))); err != nil {
		return err
	}
	// The daemon's connections into the sandbox (to its agent, or
	// proxied to its ports) are connected endpoints in its network
	// stack, which gVisor will not save (and a failed save ends the
	// sandbox): all of them go first, idle ones and those carrying an
	// attached stream or a call (which then end; the sandbox is pausing,
	// so no new one starts), each with a reset (see agentlink).
	if cc, ok := m.deps.Prober.(connCloser); ok {
		cc.CloseTo(e.att.SandboxIP.String())
	} else if ic, ok := m.deps.Prober.(idleCloser); ok {
		ic.CloseIdle()
	}
	// A reset endpoint the agent has not closed yet is refused too (it
	// still has waiters), and when the agent notices the reset is a race
	// with the checkpoint: the agent closes what is left and says so.
	if q, ok := m.deps.Prober.(quiescer); ok {
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := q.Quiesce(qctx, agentAddr(e.att), e.rec.Token)
		cancel()
		if err != nil {
			m.log.Warn("quiesce", "sandbox_id", id, "err", err)
		}
	}
	tmp := m.partialDir(id)
	quiesced := time.Now()
	if err := cp.Checkpoint(ctx, id, tmp); err != nil {
		_ = os.RemoveAll(tmp) // never restored; err says why
		return err
	}
	saved := time.Now()
	// Complete: the boot it was made in, then its name. The flush that
	// makes it outlive a host restart follows the pause
	// (syncCheckpointAsync); a daemon restart needs none.
	if err := m.stampBoot(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("checkpoint of %s: %w", id, err)
	}
	if err := os.Rename(tmp, m.checkpointDir(id)); err != nil {
		return fmt.Errorf("checkpoint of %s: %w", id, err)
	}
	m.log.Debug("checkpoint_phases", "sandbox_id", id, "quiesce", quiesced.Sub(start), "save", saved.Sub(quiesced))
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// release drops a stopped sandbox's network attachment and egress
// services; its egress state (policy, CA) stays for resume.
func (m *Manager) release(ctx context.Context, id string) error {
	var errs []error
	if err := m.deps.Network.Detach(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	if m.deps.Egress != nil {
		m.deps.Egress.Stop(id)
	}
	return errors.Join(errs...)
}

// finishPause records a sandbox whose runtime and network are released
// as paused.
func (m *Manager) finishPause(ctx context.Context, e *entry, kind, msg string, start time.Time) error {
	if e.att.SandboxIP.IsValid() {
		e.lastIP, e.lastHost = e.att.SandboxIP, e.att.HostIP
	}
	e.att = Attachment{}
	e.rec.Pause = kind
	e.rec.Deadline = time.Time{}
	if err := e.moveTo(StatePaused); err != nil {
		return err
	}
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		m.log.Error("persist_paused_state", "sandbox_id", e.id, "err", err)
	}
	e.publish()
	m.event(ctx, e.id, EventPaused, msg)
	m.log.Info("sandbox_paused", "sandbox_id", e.id, "pause", kind, "elapsed_ms", time.Since(start).Milliseconds())
	return nil
}

// failLive ends a live sandbox that could not be kept: everything it has
// on the host is removed and it is recorded failed with reason. The
// caller holds its op lock. The returned error carries the reason.
func (m *Manager) failLive(ctx context.Context, e *entry, reason string) error {
	if err := m.teardown(ctx, e); err != nil {
		reason += "; teardown: " + err.Error()
	}
	e.closed = true
	if err := e.moveTo(StateFailed); err != nil {
		m.log.Error("fail_sandbox", "sandbox_id", e.id, "err", err)
		e.rec.State = string(StateFailed)
	}
	e.rec.Reason = reason
	e.rec.EndedAt = time.Now().UTC()
	e.publish()
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		m.log.Error("persist_failed_state", "sandbox_id", e.id, "err", err)
	}
	m.event(ctx, e.id, EventFailed, reason)
	m.forget(e.id)
	return fmt.Errorf("sandbox %s failed: %s: %w", e.id, reason, errdefs.ErrUnavailable)
}

// Resume brings a paused sandbox back and returns once its agent answers.
// timeout, when positive, sets its deadline from now; otherwise it gets
// the time it had left when paused (the default timeout if none). Resuming
// a ready sandbox changes nothing.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	if timeout != 0 && (timeout < time.Second || timeout > m.cfg.MaxTimeout) {
		return Sandbox{}, &FieldError{Field: "timeout", Err: fmt.Errorf("timeout %s is out of range [1s, %s]: %w", timeout, m.cfg.MaxTimeout, errdefs.ErrInvalidArgument)}
	}
	e, done, err := m.lockToggle(ctx, id, StatePaused, StateReady)
	if err != nil {
		return Sandbox{}, err
	}
	defer e.unlock()
	if done {
		return Sandbox{Sandbox: e.rec}, nil
	}
	if err := m.resume(ctx, e, timeout, "resumed"); err != nil {
		return Sandbox{Sandbox: e.rec}, err
	}
	return Sandbox{Sandbox: e.rec}, nil
}

// resume brings a paused sandbox back; the caller holds its op lock. On
// an error it is paused again, with what it kept, or failed when even
// that could not be kept.
func (m *Manager) resume(ctx context.Context, e *entry, timeout time.Duration, why string) error {
	ctx = context.WithoutCancel(ctx)
	id := e.id
	start := time.Now()
	rt := m.runtimeOf(e.rec)
	admitted, err := m.admitResume(ctx, e)
	if err != nil {
		return err
	}
	defer admitted()
	// Its ready resume, if it has one, is the Restore's to use or clear.
	m.dropReady(id)
	if err := e.moveTo(StateResuming); err != nil {
		return err
	}
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		e.rec.State = string(StatePaused)
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	e.publish()
	var undoErr error
	load, err := m.bringBack(ctx, e, rt, &undoErr)
	if err != nil {
		err = fmt.Errorf("resume sandbox %s: %w", id, err)
		if undoErr != nil {
			return errors.Join(err, m.failLive(ctx, e, "resume failed and could not be undone: "+err.Error()+"; undo: "+undoErr.Error()))
		}
		return m.backToPaused(ctx, e, err)
	}
	d := timeout
	if d <= 0 {
		d = e.rec.Remaining
	}
	if d < time.Second {
		d = m.cfg.DefaultTimeout
	}
	m.finishResume(ctx, e, d, why, start)
	m.guardPageLoad(e, load, "resume")
	return nil
}

// bringBack starts a paused sandbox's runtime, network and egress
// services and waits for its agent; on an error it has undone its part,
// and says in *undoErr if that failed. load is the sandbox's memory load
// where it goes on after the restore (nil otherwise): one that fails
// before the agent answers fails the resume, which leaves the sandbox
// paused with its checkpoint.
func (m *Manager) bringBack(ctx context.Context, e *entry, rt Runtime, undoErr *error) (load *pageLoad, err error) {
	id := e.id
	var u undo
	defer func() {
		if err != nil {
			*undoErr = u.unwind(ctx)
			e.att = Attachment{}
		}
	}()
	tpl, err := m.deps.Templates.Get(ctx, e.rec.Template)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", e.rec.Template, err)
	}
	p, err := m.keptPolicy(e)
	if err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	var prep *egressPrep
	spec := m.resumeSpec(e, tpl)
	spec.BeforeStart = func(bctx context.Context, pid int) error {
		u.push("network", func(ctx context.Context) error { return m.deps.Network.Detach(ctx, id) })
		nsPath := "/proc/" + strconv.Itoa(pid) + "/ns/net"
		var att Attachment
		var err error
		if ra, ok := m.deps.Network.(reattacher); ok && e.lastIP.IsValid() {
			// The same address again, if nobody took it meanwhile.
			att, err = ra.AttachToAt(bctx, id, nsPath, e.lastIP)
		} else {
			att, err = m.deps.Network.AttachTo(bctx, id, nsPath)
		}
		if err != nil {
			return fmt.Errorf("network: %w", err)
		}
		e.att = att
		// The egress services need the attachment, not the
		// agent: they come up while the runtime brings the
		// sandbox back, as at create.
		u.push("egress", func(context.Context) error {
			_, _ = prep.wait() // never stopped under its feet; its error was the resume's
			if m.deps.Egress != nil {
				m.deps.Egress.Stop(id)
			}
			return nil
		})
		prep = m.prepareEgressAsync(ctx, e, p)
		return nil
	}
	mounts, release, err := m.mountVolumes(ctx, e.rec)
	if err != nil {
		return nil, err
	}
	defer release() // bound into the sandbox by then
	spec.Mounts = mounts
	switch e.rec.Pause {
	case core.PauseMemory:
		cp, ok := rt.(Checkpointer)
		if !ok || !m.hasCheckpoint(id) {
			return nil, fmt.Errorf("no checkpoint to restore: %w", errdefs.ErrFailedPrecondition)
		}
		u.push("runtime", func(ctx context.Context) error { return m.stopRuntime(ctx, rt, id) })
		if err := cp.Restore(ctx, spec, m.checkpointDir(id)); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		load = m.watchPageLoad(rt, id)
	default:
		st, ok := rt.(Stopper)
		if !ok {
			return nil, fmt.Errorf("runtime cannot start a stopped sandbox: %w", errdefs.ErrNotImplemented)
		}
		u.push("runtime", func(ctx context.Context) error { return st.Stop(ctx, id) })
		if err := st.Start(ctx, spec); err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
	}
	started := time.Now()
	rctx, cancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
	load.cancelOnFailure(rctx, cancel)
	err = m.deps.Prober.WaitReady(rctx, agentAddr(e.att))
	cancel()
	ready := time.Now()
	ca, eerr := prep.wait()
	if lerr := load.loadFailure(); lerr != nil {
		return nil, lerr
	}
	if err != nil {
		return nil, fmt.Errorf("agent did not become ready: %w", err)
	}
	if eerr != nil {
		return nil, fmt.Errorf("network policy: %w", eerr)
	}
	defer func() {
		m.log.Debug("resume_phases", "sandbox_id", id, "ready", ready.Sub(started), "egress", time.Since(ready))
	}()
	if m.newGateway(e) {
		if err := m.installEgress(ctx, e, ca); err != nil {
			return nil, fmt.Errorf("network policy: %w", err)
		}
	}
	return load, nil
}

// resumeSpec is the runtime spec paused sandbox e comes back with, as
// provision made it (a runtime that keeps the sandbox's disk uses the
// layers the sandbox was created with, tpl's), without its network hook
// and volumes.
func (m *Manager) resumeSpec(e *entry, tpl template.Template) runtime.Spec {
	return runtime.Spec{
		ID:           e.id,
		Layers:       tpl.Layers,
		DiskBytes:    e.rec.DiskBytes,
		CPUMillis:    e.rec.CPUMillis,
		MemoryBytes:  e.rec.MemoryBytes,
		PidsLimit:    e.rec.PidsLimit,
		Hostname:     "berth-" + e.id[:12],
		AgentPath:    m.cfg.AgentPath,
		AgentArgs:    agentArgs(e.rec),
		AgentEnv:     m.egressEnv(agentEnv(e.rec)),
		AgentSecret:  agentSecret(e.rec),
		AgentPids:    agentPids(e.rec),
		WorkloadPids: workloadPids(e.rec),
		AllowSetuid:  e.rec.AllowSudo,
	}
}

// keptPolicy is the egress policy a paused sandbox kept (none if it kept
// none).
func (m *Manager) keptPolicy(e *entry) (policy.Policy, error) {
	if m.deps.Egress == nil {
		return policy.Policy{}, nil
	}
	p, err := m.deps.Egress.LoadPolicy(e.id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return policy.Policy{Mode: policy.ModeNone}, nil
	}
	return p, err
}

// newGateway reports whether a resumed sandbox's gateway differs from the
// one it had. Its resolver settings and CA are on its disk, which a pause
// keeps; they name the gateway, so only a new one needs them written
// again (a round trip to the agent saved on most resumes).
func (m *Manager) newGateway(e *entry) bool {
	return !e.lastHost.IsValid() || e.lastHost != e.att.HostIP
}

// restartEgress starts a resumed sandbox's resolver and proxy with its
// kept policy and CA, on its (new) attachment, and writes its resolver
// and CA into it again if its gateway changed.
func (m *Manager) restartEgress(ctx context.Context, e *entry) error {
	if m.deps.Egress == nil {
		return nil
	}
	p, err := m.keptPolicy(e)
	if err != nil {
		return err
	}
	return m.startEgress(ctx, e, p, m.newGateway(e))
}

// stopRuntime stops a restored sandbox that did not come back whole,
// keeping its disk where the runtime can.
func (m *Manager) stopRuntime(ctx context.Context, rt Runtime, id string) error {
	if st, ok := rt.(Stopper); ok {
		return st.Stop(ctx, id)
	}
	return nil
}

// backToPaused records a resume that failed and was undone: the sandbox
// is paused as before.
func (m *Manager) backToPaused(ctx context.Context, e *entry, err error) error {
	e.att = Attachment{}
	if merr := e.moveTo(StatePaused); merr != nil {
		return errors.Join(err, merr)
	}
	if perr := m.deps.Store.PutSandbox(ctx, e.rec); perr != nil {
		m.log.Error("persist_paused_state", "sandbox_id", e.id, "err", perr)
	}
	e.publish()
	m.log.Warn("resume_failed", "sandbox_id", e.id, "err", err)
	return err
}

// finishResume records a sandbox that answers again as ready with
// deadline now+d, and drops its checkpoint.
func (m *Manager) finishResume(ctx context.Context, e *entry, d time.Duration, why string, start time.Time) {
	if err := e.moveTo(StateReady); err != nil {
		m.log.Error("resume", "sandbox_id", e.id, "err", err)
		e.rec.State = string(StateReady)
	}
	kind := e.rec.Pause
	e.rec.Pause, e.rec.Remaining = "", 0
	e.rec.Deadline = time.Now().UTC().Add(d)
	if err := m.deps.Store.PutSandbox(ctx, e.rec); err != nil {
		m.log.Error("persist_resumed_state", "sandbox_id", e.id, "err", err)
	}
	e.publish()
	m.arm(e)
	// Only once ready is on record: a restart before this still finds
	// the checkpoint, and removes it when it adopts the ready sandbox. A
	// runtime still loading memory from it (gVisor's background restore)
	// reads from the files it holds open: removing the names is safe, and
	// the disk space comes back when it closes them.
	if err := m.discardCheckpoint(e.id); err != nil {
		m.log.Warn("remove_checkpoint", "sandbox_id", e.id, "err", err)
	}
	m.event(ctx, e.id, EventResumed, fmt.Sprintf("%s (%s); deadline %s", why, kind, e.rec.Deadline.Format(time.RFC3339)))
	m.log.Info("sandbox_resumed", "sandbox_id", e.id, "pause", kind, "elapsed_ms", time.Since(start).Milliseconds())
}

// lockToggle takes live sandbox id's op lock for a move between ready and
// paused: from is the state it must be in, to the one it moves to. done
// reports that it is at to already (nothing to do). On success the caller
// holds the lock and must unlock it.
func (m *Manager) lockToggle(ctx context.Context, id string, from, to State) (e *entry, done bool, err error) {
	e, err = m.liveEntry(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if err := e.lock(ctx); err != nil {
		return nil, false, err
	}
	switch st := e.state(); {
	case e.closed:
		err = fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	case st == to:
		return e, true, nil
	case st != from:
		err = fmt.Errorf("sandbox %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		e.unlock()
		return nil, false, err
	}
	return e, false, nil
}
