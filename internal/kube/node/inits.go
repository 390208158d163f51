package node

import (
	"context"
	"fmt"
	"time"
)

// Init containers run as the kubelet runs them: one at a time, in order,
// each in the pod's sandbox as a process of its own (with its env, working
// directory and volume mounts), and each must exit 0 before the next
// starts. The pod is Pending and not Initialized meanwhile, its containers
// waiting with PodInitializing. One that fails is started again after the
// restart back-off unless the pod's restartPolicy is Never, which fails
// the pod. Only once every one succeeded do the containers start.
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

// runInits runs the pod's init containers to completion, running is the
// pids of processes already running in the sandbox by tag (a restarted
// node's, or a snapshot's). It reports whether they all succeeded: false
// when the pod failed or ctx ended.
func (p *Pods) runInits(ctx context.Context, ps *podState, running map[string]uint32) bool {
	for _, c := range ps.plan.inits {
		if !p.runInit(ctx, ps, c, running[processTag(c.name)]) {
			return false
		}
	}
	p.mu.Lock()
	ps.initialized = true
	p.mu.Unlock()
	p.changed(ps)
	return true
}

// runInit runs init container c until it exits 0, from pid when its
// process already runs.
func (p *Pods) runInit(ctx context.Context, ps *podState, c containerPlan, pid uint32) bool {
	id := ps.sandboxID
	restart := 0
	// ended: a run ended before this node took the pod (its restart
	// policy applies to code without a run of its own).
	ended, code := false, 0
	if pid == 0 && !p.neverStarted(ctx, id, c.name) {
		cs := &containerState{}
		p.recoverRuns(ctx, id, c.name, cs)
		var at time.Time
		var err error
		if code, at, err = p.readExit(ctx, id, c.name, ""); err != nil {
			p.fail(ps, "BerthContainerLost", fmt.Sprintf("init container %s ended without an exit code: %v", c.name, err))
			return false
		}
		cs.exited, cs.exitCode, cs.finishedAt = true, code, at
		p.setContainer(ps, c.name, func(s *containerState) { *s = *cs })
		ended, restart = true, cs.restarts
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
				p.fail(ps, "BerthContainerLost", "init container "+c.name+" ended without an exit code")
				return false
			}
		}
		if code == 0 {
			return true
		}
		wait, next, ok := p.nextRun(ps, c.name, code)
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
	// last one's exit code is 0.
	last := ps.plan.inits[len(ps.plan.inits)-1]
	code, _, err := p.readExit(ctx, id, last.name, "")
	return err == nil && code == 0 && running[processTag(last.name)] == 0
}

// recoverInits reads back the runs of a pod's init containers, which all
// succeeded, from what they left in sandbox id.
func (p *Pods) recoverInits(ctx context.Context, ps *podState, id string) {
	for _, c := range ps.plan.inits {
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
