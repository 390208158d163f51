package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// Init containers run as the kubelet runs them: one at a time, in order,
// each in the pod's sandbox as a process of its own (with its env, working
// directory and volume mounts), and each must exit 0 before the next
// starts. The pod is Pending and not Initialized meanwhile, its containers
// waiting with PodInitializing. One that fails is started again after the
// restart back-off unless the pod's restartPolicy is Never, which fails
// the pod. Only once every one succeeded do the containers start.
//
// A sidecar (an init container with restartPolicy Always) is not waited
// for to end: the next one starts once it started (its startup probe
// passed, where it has one). It runs beside the containers, restarted
// whenever it ends whatever the pod's policy, its readiness counting
// toward the pod's, and once every container ended for good (a pod whose
// policy is Never or OnFailure) the sidecars are stopped, the last first,
// each with SIGTERM and the pod's termination grace period.
//
// Each run leaves its exit code in the sandbox like a container's does, so
// an init container that already succeeded there is not run again: after
// the node restarted, or in a sandbox made from a snapshot of the pod
// (which carries its files).

// reasonPodInitializing is what the containers wait with while the init
// containers run, as the kubelet's.
const reasonPodInitializing = "PodInitializing"

// reasonInitFailed fails a pod (restartPolicy Never) whose init container
// exited non-zero.
const reasonInitFailed = "InitContainerFailed"

// runInits runs the pod's init containers to completion and starts its
// sidecars, all under ctx (its followers'); running is the pids of
// processes already running in the sandbox by tag (a restarted node's, a
// snapshot's, or a resumed sandbox's), pausedAt when a filesystem pause
// ended those that ran (zero: none did). It reports whether they all
// succeeded: false when the pod failed or ctx ended (a pause).
func (p *Pods) runInits(ctx context.Context, ps *podState, running map[string]uint32, pausedAt time.Time) bool {
	for _, c := range ps.plan.inits {
		run := p.runInit
		if c.sidecar {
			run = p.startSidecar
		}
		if !run(ctx, ps, c, running[processTag(c.name)], pausedAt) {
			return false
		}
	}
	p.mu.Lock()
	ps.initialized = true
	p.mu.Unlock()
	p.changed(ps)
	return true
}

// startSidecar starts sidecar c, or follows its process pid when it
// already runs (or its run that ended while the node was away, or that a
// filesystem pause ended at pausedAt), and waits until it started: false
// when the pod failed or ctx ended first.
func (p *Pods) startSidecar(ctx context.Context, ps *podState, c containerPlan, pid uint32, pausedAt time.Time) bool {
	id := ps.sandboxID
	var err error
	switch {
	case pid == 0 && !p.ranHere(ctx, ps, c.name):
		pid, err = p.startContainer(ctx, ps, c, 0)
	case pid == 0 && !pausedAt.IsZero():
		pid, err = p.restartPaused(ctx, ps, c, pausedAt)
	default:
		// Running, or ended, since before this node took the pod: its
		// exit code is read back and it starts again.
		cs := &containerState{running: true, startedAt: time.Now()}
		p.recoverRuns(ctx, id, c.name, cs)
		p.setContainer(ps, c.name, func(s *containerState) { *s = *cs })
	}
	if err != nil {
		if ctx.Err() == nil {
			p.fail(ps, "BerthStartFailed", fmt.Sprintf("sidecar %s: %v", c.name, err))
		}
		return false
	}
	p.follow(ctx, ps, c, pid)
	return p.await(ctx, ps, func() bool {
		cs := ps.containers[c.name]
		return cs != nil && cs.running && !cs.unstarted
	})
}

// await waits until cond, checked with p.mu held at each change of the
// pod, holds: false when the pod failed or was deleted, or ctx ended,
// first.
func (p *Pods) await(ctx context.Context, ps *podState, cond func() bool) bool {
	for {
		p.mu.Lock()
		if cond() && ps.reason == "" && !ps.deleted {
			p.mu.Unlock()
			return true
		}
		tick, ok := p.nextChangeLocked(ps)
		p.mu.Unlock()
		if !ok {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick:
		}
	}
}

// nextChangeLocked is the channel closed at the pod's next change
// (changed); false when the pod failed or was deleted. p.mu is held.
func (p *Pods) nextChangeLocked(ps *podState) (<-chan struct{}, bool) {
	if ps.reason != "" || ps.deleted {
		return nil, false
	}
	if ps.tick == nil {
		ps.tick = make(chan struct{})
	}
	return ps.tick, true
}

// sidecarStop is the channel closed to stop sidecar name; call with p.mu
// held.
func (ps *podState) sidecarStop(name string) chan struct{} {
	if ps.sideStop == nil {
		ps.sideStop = map[string]chan struct{}{}
	}
	ch := ps.sideStop[name]
	if ch == nil {
		ch = make(chan struct{})
		ps.sideStop[name] = ch
	}
	return ch
}

// sidecarStopped says whether sidecar name was stopped; call with p.mu
// held.
func (ps *podState) sidecarStopped(name string) bool {
	select {
	case <-ps.sidecarStop(name):
		return true
	default:
		return false
	}
}

// stopWhenAsked terminates sidecar c's run pid when the pod's sidecars
// are stopped, until ctx (the run) ends.
func (p *Pods) stopWhenAsked(ctx context.Context, ps *podState, c containerPlan, pid uint32) {
	p.mu.Lock()
	stop, id := ps.sidecarStop(c.name), ps.sandboxID
	p.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-stop:
		p.log.Info("sidecar_stop", "pod", key(ps.pod.Namespace, ps.pod.Name), "container", c.name)
		p.terminate(ctx, ps, id, pid, c.name, podGrace(ps.pod.Spec))
	}
}

// containersDone says whether every container of the pod ended and will
// not start again, so its sidecars are to stop; call with p.mu held.
func (p *Pods) containersDone(ps *podState) bool {
	if ps.reason != "" || ps.deleted {
		return false
	}
	for _, c := range ps.plan.containers {
		cs := ps.containers[c.name]
		if len(c.argv) == 0 || cs == nil || !cs.exited || restartsOn(ps.pod.Spec.RestartPolicy, cs.exitCode) {
			return false
		}
	}
	return true
}

// stopSidecars stops the pod's sidecars once its containers are done: the
// last first, each waited for (until ctx ends) before the one before it.
func (p *Pods) stopSidecars(ctx context.Context, ps *podState) {
	p.mu.Lock()
	done := p.containersDone(ps)
	p.mu.Unlock()
	if !done {
		return
	}
	for i := len(ps.plan.inits) - 1; i >= 0; i-- {
		c := ps.plan.inits[i]
		if !c.sidecar {
			continue
		}
		p.mu.Lock()
		stopped := ps.sidecarStopped(c.name)
		if !stopped {
			close(ps.sidecarStop(c.name))
		}
		p.mu.Unlock()
		if stopped {
			continue
		}
		if !p.await(ctx, ps, func() bool {
			cs := ps.containers[c.name]
			return cs == nil || !cs.running
		}) {
			return
		}
	}
}

// runInit runs init container c until it exits 0, from pid when its
// process already runs, under ctx (its followers': a pause ends it, and
// refollow starts it again at resume with pausedAt, when the pause ended
// its run).
func (p *Pods) runInit(ctx context.Context, ps *podState, c containerPlan, pid uint32, pausedAt time.Time) bool {
	id := ps.sandboxID
	restart := 0
	// ended: a run ended before this node took the pod (its restart
	// policy applies to code without a run of its own).
	ended, code := false, 0
	if pid == 0 && p.ranHere(ctx, ps, c.name) {
		// What this node knows of it, if anything, unless its files
		// say more (a node that restarted knows nothing).
		cs := &containerState{}
		p.mu.Lock()
		if known := ps.containers[c.name]; known != nil {
			*cs = *known
		}
		p.mu.Unlock()
		cs.running = false
		p.recoverRuns(ctx, id, c.name, cs)
		var at time.Time
		var err error
		code, at, err = p.readExit(ctx, id, c.name, "")
		switch {
		case err == nil:
			cs.exited, cs.exitCode, cs.finishedAt = true, code, at
			ended, restart = true, cs.restarts
			p.setContainer(ps, c.name, func(s *containerState) { *s = *cs })
		case errors.Is(err, errdefs.ErrNotFound) && !pausedAt.IsZero():
			// A filesystem pause ended it: it runs again, as its next
			// restart. That end is not reported on its own: the API
			// server refuses an init container that ran again once
			// reported terminated (restartPolicy Never), so the next
			// run's status is the first to show it, as its last state.
			cs.exited, cs.exitCode, cs.finishedAt = true, 137, pausedAt
			restart = cs.restarts + 1
			p.mu.Lock()
			ps.containers[c.name] = cs
			p.mu.Unlock()
		default:
			if ctx.Err() == nil {
				p.fail(ps, "BerthContainerLost", fmt.Sprintf("init container %s ended without an exit code: %v", c.name, err))
			}
			return false
		}
	}
	for {
		if !ended {
			var err error
			switch {
			case pid == 0:
				if pid, err = p.startContainer(ctx, ps, c, restart); err != nil {
					if ctx.Err() == nil {
						p.fail(ps, "BerthStartFailed", fmt.Sprintf("init container %s: %v", c.name, err))
					}
					return false
				}
			default:
				// Running since before this node took the pod.
				cs := &containerState{running: true, startedAt: time.Now()}
				p.recoverRuns(ctx, id, c.name, cs)
				p.setContainer(ps, c.name, func(s *containerState) { *s = *cs })
			}
			_, _ = p.sb.Attach(ctx, id, pid)
			if ctx.Err() != nil {
				return false
			}
			var ok bool
			if code, ok = p.collectExit(ctx, ps, c.name); !ok {
				if !p.pausing(ctx, id) {
					p.fail(ps, "BerthContainerLost", "init container "+c.name+" ended without an exit code")
				}
				return false
			}
		}
		if code == 0 {
			return true
		}
		wait, next, ok := p.nextRun(ps, c, code)
		switch {
		case ctx.Err() != nil:
			return false
		case !ok:
			p.fail(ps, reasonInitFailed, fmt.Sprintf("init container %s exited with %d and the pod's restartPolicy is Never", c.name, code))
			return false
		case !sleepCtx(ctx, wait):
			return false
		}
		ended, pid, restart = false, 0, next
	}
}

// pausing says whether sandbox id is being paused, or was, or is ending:
// a process of it that ended without an exit code ended with it, and
// what follows (a resume, or the pod failing) is the sandbox watch's.
func (p *Pods) pausing(ctx context.Context, id string) bool {
	sb, err := p.sb.Get(ctx, id)
	if err != nil {
		return ctx.Err() != nil
	}
	switch sb.State {
	case client.StatePausing, client.StatePaused, client.StateStopping, client.StateStopped, client.StateFailed:
		return true
	}
	return false
}

// containersBegan says whether any of the pod's containers with a process
// of its own runs or ran in sandbox id: its init containers are then
// done.
func (p *Pods) containersBegan(ctx context.Context, ps *podState, id string, running map[string]uint32) bool {
	for _, c := range ps.plan.containers {
		if len(c.argv) == 0 {
			continue
		}
		if running[processTag(c.name)] != 0 || !p.neverStarted(ctx, id, c.name) {
			return true
		}
	}
	// Containers without processes only: the inits are done when the
	// last one that is not a sidecar exited 0, or, with sidecars only,
	// once the last sidecar runs or ran.
	var last *containerPlan
	for i := range ps.plan.inits {
		if !ps.plan.inits[i].sidecar {
			last = &ps.plan.inits[i]
		}
	}
	if last == nil {
		last = &ps.plan.inits[len(ps.plan.inits)-1]
		return running[processTag(last.name)] != 0 || !p.neverStarted(ctx, id, last.name)
	}
	code, _, err := p.readExit(ctx, id, last.name, "")
	return err == nil && code == 0 && running[processTag(last.name)] == 0
}

// recoverInits reads back the runs of a pod's init containers, which all
// succeeded, from what they left in sandbox id (its sidecars are followed
// as its containers are).
func (p *Pods) recoverInits(ctx context.Context, ps *podState, id string) {
	for _, c := range ps.plan.inits {
		if c.sidecar {
			continue
		}
		cs := &containerState{exited: true}
		p.recoverRuns(ctx, id, c.name, cs)
		if code, at, err := p.readExit(ctx, id, c.name, ""); err == nil {
			cs.exitCode, cs.finishedAt = code, at
		}
		p.mu.Lock()
		ps.containers[c.name] = cs
		p.mu.Unlock()
	}
	p.mu.Lock()
	ps.initialized = true
	p.mu.Unlock()
}
