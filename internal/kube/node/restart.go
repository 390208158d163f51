package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/crilog"
)

// The kubelet's back-off for restarting a container that exited: the
// first restart is at once, each one after waits twice as long as the
// last (from DefaultRestartBackOff up to DefaultRestartBackOffMax), and a
// run that lasted restartBackOffReset starts the count again.
const (
	DefaultRestartBackOff    = 10 * time.Second
	DefaultRestartBackOffMax = 5 * time.Minute
	restartBackOffReset      = 10 * time.Minute
)

// Reasons the container statuses carry, as the kubelet's.
const (
	reasonCompleted        = "Completed"
	reasonError            = "Error"
	reasonCrashLoopBackOff = "CrashLoopBackOff"
	reasonCreating         = "ContainerCreating"
)

// backOff is how long a container waits before each restart.
type backOff struct {
	initial, max time.Duration
	// reset: a run that lasted this long resets the count.
	reset time.Duration
}

// newBackOff is the kubelet's back-off, or one with another initial wait
// and cap (zero: the kubelet's). The count resets after twice the cap, as
// the kubelet's does (restartBackOffReset for DefaultRestartBackOffMax).
func newBackOff(initial, maxWait time.Duration) backOff {
	if initial <= 0 {
		initial = DefaultRestartBackOff
	}
	if maxWait <= 0 {
		maxWait = DefaultRestartBackOffMax
	}
	maxWait = max(maxWait, initial)
	return backOff{initial: initial, max: maxWait, reset: 2 * maxWait}
}

// delay is the wait before a restart, given the restarts since the count
// was last reset: none before the first, then initial, doubling, capped.
func (b backOff) delay(steps int) time.Duration {
	if steps <= 0 {
		return 0
	}
	d := b.initial
	for i := 1; i < steps && d < b.max; i++ {
		d *= 2
	}
	return min(d, b.max)
}

// sleepCtx waits d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// restartsOn says whether a container that exited with code is started
// again under the pod's restart policy (empty is Always, the default).
func restartsOn(policy corev1.RestartPolicy, code int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// containerRun is one run of a container that ended.
type containerRun struct {
	exitCode              int
	startedAt, finishedAt time.Time
}

func (r containerRun) terminated(containerID string) *corev1.ContainerStateTerminated {
	reason := reasonCompleted
	if r.exitCode != 0 {
		reason = reasonError
	}
	return &corev1.ContainerStateTerminated{ExitCode: int32(r.exitCode), Reason: reason,
		StartedAt: metav1.NewTime(r.startedAt), FinishedAt: metav1.NewTime(r.finishedAt), ContainerID: containerID}
}

// containerStatus is a container's status as the kubelet reports it:
// its current run (waiting, running or terminated), the run before it and
// how many restarts there were. failure, when set, is the pod's: every
// container it did not see end ends with it.
func containerStatus(name, image, id string, cs *containerState, failure, message, pod string) corev1.ContainerStatus {
	s := corev1.ContainerStatus{Name: name, Image: image, ContainerID: id}
	if cs == nil {
		cs = &containerState{}
	}
	s.RestartCount = int32(cs.restarts)
	if cs.last != nil {
		s.LastTerminationState.Terminated = cs.last.terminated(id)
	}
	cur := containerRun{exitCode: cs.exitCode, startedAt: cs.startedAt, finishedAt: cs.finishedAt}
	switch {
	case cs.waitReason != "" && failure == "":
		// Its next run waits for its configuration (awaitConfig).
		if cs.exited {
			s.LastTerminationState.Terminated = cur.terminated(id)
		}
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: cs.waitReason, Message: cs.waitMessage}
	case cs.backOff > 0 && cs.exited && failure == "":
		// The run that ended is the last state while the next waits.
		s.LastTerminationState.Terminated = cur.terminated(id)
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reasonCrashLoopBackOff,
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", cs.backOff, name, pod)}
	case cs.exited:
		s.State.Terminated = cur.terminated(id)
	case failure != "":
		s.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 137, Reason: failure, Message: message, FinishedAt: metav1.Now()}
	case cs.running:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(cs.startedAt)}
		s.Ready, s.Started = !cs.unstarted && !cs.unready, ptr.To(!cs.unstarted)
	default:
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reasonCreating}
	}
	return s
}

// podPhase is the kubelet's rule for a pod's phase from its containers'
// statuses: Pending while one has never run, Running while one runs or
// may run again under the restart policy, then Succeeded when every one
// exited 0 and Failed otherwise.
func podPhase(policy corev1.RestartPolicy, statuses []corev1.ContainerStatus) corev1.PodPhase {
	var waiting, running, stopped, succeeded int
	for _, s := range statuses {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.LastTerminationState.Terminated != nil:
			// Waiting to be started again.
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case len(statuses) == 0 || waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case policy != corev1.RestartPolicyNever && policy != corev1.RestartPolicyOnFailure:
		// Always: every container is being restarted.
		return corev1.PodRunning
	case stopped == succeeded:
		return corev1.PodSucceeded
	case policy == corev1.RestartPolicyNever:
		return corev1.PodFailed
	}
	// OnFailure, and the failed ones are being restarted.
	return corev1.PodRunning
}

// readRun reads the run record a container's wrapper left (suffix
// crilog.Previous: its previous run's).
func (p *Pods) readRun(ctx context.Context, id, name, suffix string) (crilog.Run, error) {
	var buf bytes.Buffer
	if err := p.sb.ReadFile(ctx, id, runPath(name)+suffix, &limitWriter{w: &buf, n: 64}); err != nil {
		return crilog.Run{}, err
	}
	r, err := crilog.ParseRun(buf.Bytes())
	if err != nil {
		// The sandbox wrote it.
		return crilog.Run{}, fmt.Errorf("run file %q: %w: %w", buf.String(), err, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// readExit reads the exit code a container's wrapper left (suffix
// crilog.Previous: its previous run's) and when it was written.
func (p *Pods) readExit(ctx context.Context, id, name, suffix string) (int, time.Time, error) {
	var buf bytes.Buffer
	if err := p.sb.ReadFile(ctx, id, exitPath(name)+suffix, &limitWriter{w: &buf, n: 32}); err != nil {
		return 0, time.Time{}, err
	}
	// The sandbox wrote it: parse strictly.
	code, err := strconv.Atoi(strings.TrimSpace(buf.String()))
	if err != nil || code < 0 || code > 255 {
		return 0, time.Time{}, fmt.Errorf("exit file %q: %w", buf.String(), errdefs.ErrInvalidArgument)
	}
	at := time.Now()
	if st, err := p.sb.Stat(ctx, id, exitPath(name)+suffix); err == nil && !st.ModTime.IsZero() {
		at = st.ModTime
	}
	return code, at, nil
}

// recoverRuns reads back, after a restart of the node, a container's
// restart count and start time and the run before the current one, from
// the files its wrapper left. A container started by an older node has
// no run files: it never restarted.
func (p *Pods) recoverRuns(ctx context.Context, id, name string, cs *containerState) {
	cur, err := p.readRun(ctx, id, name, "")
	if err != nil {
		return
	}
	cs.restarts, cs.startedAt = cur.Restart, cur.Started
	if cur.Restart == 0 {
		return
	}
	prev, err := p.readRun(ctx, id, name, crilog.Previous)
	if err != nil {
		return
	}
	code, at, err := p.readExit(ctx, id, name, crilog.Previous)
	if err != nil {
		return
	}
	cs.last = &containerRun{exitCode: code, startedAt: prev.Started, finishedAt: at}
}

// ranHere says whether container name of the pod has run in its sandbox:
// this node started a run of it, or a run left a trace there
// (neverStarted). The node's own record counts first: a pause right
// after a start can end the run's wrapper before it wrote any file, and
// that run was reported running all the same.
func (p *Pods) ranHere(ctx context.Context, ps *podState, name string) bool {
	p.mu.Lock()
	cs := ps.containers[name]
	started := cs != nil && !cs.startedAt.IsZero()
	p.mu.Unlock()
	return started || !p.neverStarted(ctx, ps.sandboxID, name)
}

// neverStarted says whether a container without a process left no trace
// of a run in its sandbox: no log, no run record, no exit code.
func (p *Pods) neverStarted(ctx context.Context, id, name string) bool {
	for _, f := range []string{logPath(name), runPath(name), exitPath(name)} {
		if _, err := p.sb.Stat(ctx, id, f); !errors.Is(err, errdefs.ErrNotFound) {
			return false
		}
	}
	return true
}

// startContainer starts run restart of a container (0: its first) and
// records it running. Before a restart the last run's files are kept as
// the previous run's, and that is done before the restart is reported:
// whoever sees the new restart count finds the previous log in place.
func (p *Pods) startContainer(ctx context.Context, ps *podState, c containerPlan, restart int) (uint32, error) {
	var env map[string]string
	var argv []string
	err := p.awaitConfig(ctx, ps, []string{c.name}, reasonConfigError, func() error {
		var err error
		env, argv, err = p.containerEnv(ctx, ps, c)
		return err
	})
	if err != nil {
		return 0, err
	}
	if restart > 0 {
		cmd, args := rotateArgv(c.name)
		var stderr bytes.Buffer
		code, err := p.sb.Exec(ctx, ps.sandboxID, client.ExecRequest{Cmd: cmd, Args: args, Stderr: &limitWriter{w: &stderr, n: 4096}})
		if err == nil && code != 0 {
			err = fmt.Errorf("keep the previous log: exit %d: %s", code, strings.TrimSpace(stderr.String()))
		}
		if err != nil {
			return 0, err
		}
	}
	cmd, args := wrapArgv(c, restart, argv)
	pid, err := p.sb.Start(ctx, ps.sandboxID, client.ExecRequest{Cmd: cmd, Args: args, Env: env, Cwd: c.cwd, Tag: processTag(c.name)})
	if err != nil {
		return 0, err
	}
	p.setContainer(ps, c.name, func(cs *containerState) {
		if restart > 0 {
			cs.last = &containerRun{exitCode: cs.exitCode, startedAt: cs.startedAt, finishedAt: cs.finishedAt}
		}
		cs.restarts = restart
		cs.running, cs.exited, cs.backOff, cs.startedAt = true, false, 0, time.Now()
		cs.waitReason, cs.waitMessage = "", ""
		cs.unstarted, cs.unready = c.probes.startup != nil, c.probes.readiness != nil
	})
	return pid, nil
}

// follow owns a container's process from pid on (0: it ended already):
// it waits for the process to end, reads its exit code, and starts the
// container again while the pod's restart policy asks, after the back-off.
func (p *Pods) follow(ctx context.Context, ps *podState, c containerPlan, pid uint32) {
	p.wg.Add(1)
	ps.fwg.Add(1)
	go func() {
		defer p.wg.Done()
		defer ps.fwg.Done()
		for {
			if pid != 0 {
				// The run's probes run while it does.
				pctx, pcancel := context.WithCancel(ctx)
				var probes sync.WaitGroup
				probes.Go(func() { p.probeRun(pctx, ps, c, pid) })
				if c.sidecar {
					probes.Go(func() { p.stopWhenAsked(pctx, ps, c, pid) })
				}
				_, _ = p.sb.Attach(ctx, ps.sandboxID, pid)
				pcancel()
				probes.Wait()
			}
			if ctx.Err() != nil {
				return
			}
			code, ok := p.collectExit(ctx, ps, c.name)
			if !ok {
				if pid == 0 {
					p.fail(ps, "BerthContainerLost", "container "+c.name+" ended without an exit code")
				}
				return
			}
			wait, restart, ok := p.nextRun(ps, c, code)
			if !ok {
				if !c.sidecar {
					p.stopSidecars(ctx, ps)
				}
				return
			}
			if !sleepCtx(ctx, wait) {
				return
			}
			var err error
			if pid, err = p.startContainer(ctx, ps, c, restart); err != nil {
				if ctx.Err() == nil {
					p.fail(ps, "BerthStartFailed", fmt.Sprintf("container %s: %v", c.name, err))
				}
				return
			}
		}
	}()
}

// nextRun decides, once a container exited with code, whether it starts
// again: ok, after wait, as run restart. A wait puts it in
// CrashLoopBackOff until then.
func (p *Pods) nextRun(ps *podState, c containerPlan, code int) (wait time.Duration, restart int, ok bool) {
	name := c.name
	p.mu.Lock()
	cs := ps.containers[name]
	if cs == nil || ps.reason != "" || ps.deleted || !restartsOn(c.restartPolicy(ps.pod.Spec.RestartPolicy), code) ||
		(c.sidecar && ps.sidecarStopped(name)) {
		p.mu.Unlock()
		return 0, 0, false
	}
	if cs.finishedAt.Sub(cs.startedAt) >= p.backOff.reset {
		cs.steps = 0
	}
	wait = p.backOff.delay(cs.steps)
	cs.steps++
	cs.backOff = wait
	restart = cs.restarts + 1
	p.mu.Unlock()
	if wait > 0 {
		p.log.Info("container_back_off", "pod", key(ps.pod.Namespace, ps.pod.Name), "container", name, "exit_code", code, "wait", wait)
		p.changed(ps)
	}
	return wait, restart, true
}
