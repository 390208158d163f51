package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// Pause and resume of a pod's sandbox.
//
// A pod's sandbox is paused while its AnnotationPaused is set, and runs
// while it is not: the node pauses or resumes the sandbox through its
// daemon each time the annotation changes (and after a node restart), and
// reports the outcome in the pod's ConditionPaused. So `kubectl annotate
// pod X berth.dev/paused=…` pauses a sandbox as the gateway's POST
// …/pause does, and a pause holds while no gateway runs.
//
// What a pause keeps is the daemon's (internal/sandbox/pause.go): on
// gVisor every process and its memory, so the containers' processes are
// followed again after the resume; on runc the sandbox's files, so a
// container whose process the pause ended starts again at resume, as a
// restart (its previous run ended with 137), whatever the pod's restart
// policy: a resumed pod runs what it ran before. While paused, the pod
// stays Running, its containers wait with reason ReasonPaused and it is
// not Ready.

// ConditionPaused is the pod condition that reports whether the sandbox
// is paused as its pod's AnnotationPaused states: True while paused (or
// a resume is pending or was refused), False while running.
const ConditionPaused corev1.PodConditionType = "berth.dev/Paused"

// Reasons of ConditionPaused; the messages name the annotation value
// they are about by NetworkHash, as ConditionNetwork does.
const (
	// PauseRunning: the sandbox runs ("running").
	PauseRunning = "Running"
	// PausePaused: the sandbox is paused ("pause <hash> applied:
	// memory|filesystem").
	PausePaused = "Paused"
	// PausePausing: the annotation asks for a pause not done yet.
	PausePausing = "Pausing"
	// PauseResuming: the annotation is gone and the resume is not done
	// yet.
	PauseResuming = "Resuming"
	// PauseRefused: the daemon refused the pause ("pause <hash> refused:
	// <code>: <message>"); the sandbox runs on.
	PauseRefused = "PauseRefused"
	// ResumeRefused: the daemon could not resume the sandbox ("resume
	// refused: <code>: <message>"); it is paused still, or failed (the
	// pod then fails).
	ResumeRefused = "ResumeRefused"
)

// ReasonPaused is the waiting reason of a paused pod's containers.
const ReasonPaused = "SandboxPaused"

// pauseState is what the node knows of a sandbox's pause against its
// pod's AnnotationPaused; guarded by Pods.mu.
type pauseState struct {
	paused bool
	// value is the annotation value of the pause, kind what it kept,
	// at when it was done.
	value, kind string
	at          time.Time
	// failed is the annotation value ("" for a resume) the daemon last
	// refused, and why.
	failed    string
	failedErr error
	// runsUnknown: the node restarted while the sandbox was paused, so
	// its containers' restart counts are read back at resume.
	runsUnknown bool
	// byDaemon: the daemon paused it on its own (at its deadline under
	// AnnotationOnTimeout pause, or idle under AnnotationIdlePause), not
	// the annotation; why is the daemon's word, at when it did;
	// deadline is the AnnotationDeadline value then, and a moved one
	// resumes it.
	byDaemon bool
	why      string
	deadline string
	// resuming: the resume was given the node's room (room.go) and is
	// under way. noRoom: the last resume found no room (failedErr says
	// why); it is tried again as pods of the node change.
	resuming, noRoom bool
}

// clearNoRoom forgets a resume that waited for room; the caller holds
// p.mu.
func (st *pauseState) clearNoRoom() {
	if st.noRoom {
		st.noRoom, st.failed, st.failedErr = false, "", nil
	}
}

// PauseStatus reads ConditionPaused of a pod for the annotation value
// want ("" asks for a running sandbox): done once the node did it (err
// nil) or the daemon refused it (err of the daemon's class, with its
// words).
func PauseStatus(pod *corev1.Pod, want string) (done bool, err error) {
	for _, c := range pod.Status.Conditions {
		if c.Type != ConditionPaused {
			continue
		}
		prefix := "pause " + NetworkHash(want)
		switch {
		case want == "" && c.Reason == PauseRunning:
			return true, nil
		case want == "" && c.Reason == ResumeRefused:
			return true, conditionErr(strings.TrimPrefix(c.Message, "resume refused: "))
		case want != "" && c.Reason == PausePaused && strings.HasPrefix(c.Message, prefix+" "):
			return true, nil
		case want != "" && c.Reason == PauseRefused && strings.HasPrefix(c.Message, prefix+" "):
			return true, conditionErr(strings.TrimPrefix(c.Message, prefix+" refused: "))
		}
	}
	return false, nil
}

// conditionErr is the error a condition's "<code>: <message>" states.
func conditionErr(s string) error {
	code, msg, _ := strings.Cut(s, ": ")
	return fmt.Errorf("%s: %w", msg, errdefs.FromCode(code))
}

// PausedByDaemon reads from a pod's ConditionPaused when its daemon paused
// its sandbox on its own (its deadline, or idle); ok is false for a pause
// the annotation asked for, or none.
func PausedByDaemon(pod *corev1.Pod) (at time.Time, ok bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type != ConditionPaused || c.Reason != PausePaused {
			continue
		}
		rest, found := strings.CutPrefix(c.Message, "pause by the daemon at ")
		if !found {
			return time.Time{}, false
		}
		ts, _, _ := strings.Cut(rest, " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		return t, err == nil
	}
	return time.Time{}, false
}

// Paused reads a pod's pause from ConditionPaused: its state in the API's
// terms ("paused", "pausing", "resuming"; "" when it runs or the node has
// not said) and, once paused, what the pause kept.
func Paused(pod *corev1.Pod) (state, kind string) {
	for _, c := range pod.Status.Conditions {
		if c.Type != ConditionPaused {
			continue
		}
		switch c.Reason {
		case PausePaused:
			_, kind, _ = strings.Cut(c.Message, " applied: ")
			return "paused", kind
		case ResumeRefused:
			return "paused", ""
		case PausePausing:
			return "pausing", ""
		case PauseResuming:
			return "resuming", ""
		}
	}
	return "", ""
}

// applyPause pauses or resumes the sandbox when its pod's AnnotationPaused
// says otherwise than it is, once its containers were started. A value
// the daemon refused is not tried again until the annotation changes.
func (p *Pods) applyPause(ctx context.Context, ps *podState) {
	ps.dmu.Lock()
	defer ps.dmu.Unlock()
	p.mu.Lock()
	pod, id, over, up, st := ps.pod, ps.sandboxID, ps.reason != "" || ps.deleted, ps.up, ps.pz
	p.mu.Unlock()
	want := pod.Annotations[AnnotationPaused]
	k := key(pod.Namespace, pod.Name)
	if st.byDaemon {
		switch {
		case want != "":
			// The annotation now holds it paused: removing it resumes.
			p.mu.Lock()
			ps.pz.byDaemon, ps.pz.value = false, want
			ps.pz.clearNoRoom()
			p.mu.Unlock()
			p.changed(ps)
			return
		case pod.Annotations[AnnotationDeadline] == st.deadline:
			return
		}
		// A new deadline: it resumes (and applyDeadline sets it next).
	} else if (want != "") == st.paused {
		if want != "" && st.noRoom {
			// Paused again while its resume waited for room: it
			// waits no more.
			p.mu.Lock()
			ps.pz.value = want
			ps.pz.clearNoRoom()
			p.mu.Unlock()
			p.changed(ps)
		}
		return
	}
	// A pause waits for the sandbox to be made (start); a resume does
	// not. A refused one is not tried again until the annotation
	// changes, but one that found no room is, each time.
	if id == "" || over || (!up && want != "") || (want == st.failed && st.failedErr != nil && !st.noRoom) {
		return
	}
	if want != "" {
		p.stopFollowers(ps)
		sb, err := p.sb.Pause(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("sandbox_pause_refused", "pod", k, "sandbox_id", id, "err", err)
			p.mu.Lock()
			ps.pz.failed, ps.pz.failedErr = want, err
			p.mu.Unlock()
			// The daemon leaves a sandbox it could not pause running (or
			// fails it, and the pod with it).
			if err := p.refollow(ps, id, time.Now()); err != nil {
				p.log.Warn("pod_refollow_failed", "pod", k, "sandbox_id", id, "err", err)
			}
			p.changed(ps)
			return
		}
		p.mu.Lock()
		ps.pz = pauseState{paused: true, value: want, kind: sb.Pause, at: time.Now()}
		p.mu.Unlock()
		p.log.Info("sandbox_paused", "pod", k, "sandbox_id", id, "pause", sb.Pause)
		p.changed(ps)
		return
	}
	if err := p.admitResume(ps); err != nil {
		p.mu.Lock()
		same := st.noRoom && st.failedErr != nil && st.failedErr.Error() == err.Error()
		ps.pz.failed, ps.pz.failedErr, ps.pz.noRoom = "", err, true
		p.mu.Unlock()
		if !same {
			p.log.Warn("sandbox_resume_waits_for_room", "pod", k, "sandbox_id", id, "err", err)
			p.changed(ps)
		}
		return
	}
	if err := p.sb.Resume(ctx, id); err != nil {
		p.mu.Lock()
		ps.pz.resuming = false
		p.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("sandbox_resume_refused", "pod", k, "sandbox_id", id, "err", err)
		p.mu.Lock()
		ps.pz.failed, ps.pz.failedErr, ps.pz.noRoom = "", err, false
		p.mu.Unlock()
		p.changed(ps)
		return
	}
	p.mu.Lock()
	at, unknown := st.at, st.runsUnknown
	ps.pz = pauseState{}
	p.mu.Unlock()
	p.log.Info("sandbox_resumed", "pod", k, "sandbox_id", id)
	if unknown {
		p.recoverAllRuns(ps, id)
	}
	if err := p.refollow(ps, id, at); err != nil {
		p.fail(ps, "BerthResumeFailed", fmt.Sprintf("follow the containers again: %v", err))
		return
	}
	p.changed(ps)
}

// pausedByDaemon takes the daemon's word (ev) that it paused the sandbox
// on its own (a pause the node did not ask for: its deadline under
// AnnotationOnTimeout pause, or idle under AnnotationIdlePause), so the
// node neither resumes it at once nor follows its containers until it is
// resumed.
func (p *Pods) pausedByDaemon(ctx context.Context, ps *podState, id string, ev client.Event) {
	ps.dmu.Lock()
	defer ps.dmu.Unlock()
	p.mu.Lock()
	skip := ps.pz.paused || ps.pod.Annotations[AnnotationPaused] != "" || ps.reason != "" || ps.deleted
	deadline := ps.pod.Annotations[AnnotationDeadline]
	p.mu.Unlock()
	if skip {
		return
	}
	sb, err := p.sb.Get(ctx, id)
	if err != nil || sb.State != client.StatePaused {
		return // resumed or ended meanwhile: nothing to record
	}
	p.stopFollowers(ps)
	p.mu.Lock()
	ps.pz = pauseState{paused: true, kind: sb.Pause, at: ev.Time, byDaemon: true, why: ev.Message, deadline: deadline}
	p.mu.Unlock()
	p.log.Info("sandbox_paused_by_daemon", "pod", key(ps.pod.Namespace, ps.pod.Name), "sandbox_id", id, "pause", sb.Pause, "why", ev.Message)
	p.changed(ps)
}

// newFollowers starts a new generation of the pod's container followers
// and returns their context; stopFollowers ends it and waits for them.
func (p *Pods) newFollowers(ps *podState) context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	parent := ps.ctx
	if parent == nil {
		parent = p.ctx
	}
	ctx, cancel := context.WithCancel(parent)
	ps.fcancel = cancel
	return ctx
}

func (p *Pods) stopFollowers(ps *podState) {
	p.mu.Lock()
	cancel := ps.fcancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	ps.fwg.Wait()
}

// recoverAllRuns reads back every container's restart count and previous
// run from the sandbox (a node that restarted while it was paused could
// not).
func (p *Pods) recoverAllRuns(ps *podState, id string) {
	if len(ps.plan.inits) > 0 {
		// Unread (an error), no process counts as running: the files
		// decide.
		running, _ := p.runningByTag(ps.ctx, id)
		if !p.containersBegan(ps.ctx, ps, id, running) {
			// The daemon paused it while its init containers ran:
			// refollow goes on with them, and they read their runs back
			// themselves; the containers never ran.
			p.mu.Lock()
			ps.initialized = false
			for _, c := range ps.plan.followed() {
				delete(ps.containers, c.name)
			}
			p.mu.Unlock()
			return
		}
		p.recoverInits(ps.ctx, ps, id)
	}
	for _, c := range ps.plan.followed() {
		if len(c.argv) == 0 {
			continue
		}
		cs := &containerState{running: true}
		p.recoverRuns(ps.ctx, id, c.name, cs)
		p.mu.Lock()
		if old := ps.containers[c.name]; old != nil {
			cs.startedAt = old.startedAt
		}
		ps.containers[c.name] = cs
		p.mu.Unlock()
	}
}

// refollow follows each container of a sandbox that was paused (or whose
// pause failed) again: its process if it still runs (a memory pause kept
// it), its exit code if it ended on its own (the restart policy applies),
// and otherwise (a filesystem pause ended it at pausedAt) it starts again
// as its next restart. A pod paused while its init containers ran goes
// on with them (start).
func (p *Pods) refollow(ps *podState, id string, pausedAt time.Time) error {
	running, err := p.runningByTag(ps.ctx, id)
	if err != nil {
		return err
	}
	p.mu.Lock()
	initialized := ps.initialized || len(ps.plan.inits) == 0
	up := ps.up
	p.mu.Unlock()
	if !up {
		// Paused before its processes started (start sets up): the
		// pod's run goes on (prepare).
		return nil
	}
	if !initialized {
		p.wg.Go(func() { p.start(ps.ctx, ps, running, pausedAt) })
		return nil
	}
	ctx := p.newFollowers(ps)
	for _, c := range ps.plan.followed() {
		if len(c.argv) == 0 {
			continue
		}
		if pid := running[processTag(c.name)]; pid != 0 {
			p.follow(ctx, ps, c, pid)
			continue
		}
		pid, err := p.restartPaused(ctx, ps, c, pausedAt)
		if err != nil {
			return err
		}
		p.follow(ctx, ps, c, pid)
	}
	return nil
}

// restartPaused takes container c, without a process after its sandbox
// was resumed, on: a run that ended on its own left its exit code (pid 0:
// its follower reads it, and its restart policy applies); one the
// filesystem pause ended at pausedAt is recorded as ended with 137 then
// and started again as its next restart, whatever the restart policy: a
// resumed pod runs what it ran before. One the pause came before starts
// as its first run.
func (p *Pods) restartPaused(ctx context.Context, ps *podState, c containerPlan, pausedAt time.Time) (uint32, error) {
	if _, _, err := p.readExit(ctx, ps.sandboxID, c.name, ""); err == nil {
		return 0, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return 0, fmt.Errorf("container %s: exit code: %w", c.name, err)
	}
	if !p.ranHere(ctx, ps, c.name) {
		pid, err := p.startContainer(ctx, ps, c, 0)
		if err != nil {
			return 0, fmt.Errorf("start container %s: %w", c.name, err)
		}
		return pid, nil
	}
	p.mu.Lock()
	cs := ps.containers[c.name]
	if cs == nil {
		cs = &containerState{startedAt: pausedAt}
		ps.containers[c.name] = cs
	}
	cs.running, cs.exited, cs.exitCode, cs.finishedAt = false, true, 137, pausedAt
	restart := cs.restarts + 1
	p.mu.Unlock()
	pid, err := p.startContainer(ctx, ps, c, restart)
	if err != nil {
		return 0, fmt.Errorf("start container %s again: %w", c.name, err)
	}
	return pid, nil
}

// pauseCondition is ConditionPaused for a pod whose sandbox exists; the
// caller holds p.mu.
func pauseCondition(ps *podState, now metav1.Time) corev1.PodCondition {
	want := ps.pod.Annotations[AnnotationPaused]
	st := ps.pz
	c := corev1.PodCondition{Type: ConditionPaused, LastTransitionTime: now}
	failed := want == st.failed && st.failedErr != nil
	switch {
	case want == "" && st.paused && st.byDaemon && !failed:
		c.Status, c.Reason = corev1.ConditionTrue, PausePaused
		c.Message = "pause by the daemon at " + st.at.UTC().Format(time.RFC3339Nano) + " (" + st.why + ") applied: " + st.kind
	case want != "" && st.paused:
		c.Status, c.Reason = corev1.ConditionTrue, PausePaused
		c.Message = "pause " + NetworkHash(st.value) + " applied: " + st.kind
	case want != "" && failed:
		c.Status, c.Reason = corev1.ConditionFalse, PauseRefused
		c.Message = "pause " + NetworkHash(want) + " refused: " + errText(st.failedErr)
	case want != "":
		c.Status, c.Reason = corev1.ConditionFalse, PausePausing
		c.Message = "pause " + NetworkHash(want) + " not applied yet"
	case st.paused && failed:
		c.Status, c.Reason = corev1.ConditionTrue, ResumeRefused
		c.Message = "resume refused: " + errText(st.failedErr)
	case st.paused:
		c.Status, c.Reason = corev1.ConditionTrue, PauseResuming
		c.Message = "resume not applied yet"
	default:
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, PauseRunning, "running"
	}
	return c
}

// errText is an error as "<code>: <message>" for a condition's message.
func errText(err error) string {
	var e *errdefs.Error
	msg := err.Error()
	if errors.As(err, &e) {
		msg = e.Message
	}
	return errdefs.Code(err) + ": " + msg
}

// pausedStatus shows a paused pod's running containers (init containers
// and sidecars too) waiting with ReasonPaused, and the pod not ready; the
// caller holds p.mu.
func pausedStatus(st *corev1.PodStatus, kind string) {
	msg := "the sandbox is paused (" + kind + ")"
	for _, list := range [][]corev1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses} {
		for i := range list {
			cs := &list[i]
			if cs.State.Running != nil {
				cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: ReasonPaused, Message: msg}}
				cs.Ready = false
				cs.Started = ptr.To(false)
			}
		}
	}
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type == corev1.ContainersReady || c.Type == corev1.PodReady {
			c.Status, c.Reason, c.Message = corev1.ConditionFalse, ReasonPaused, msg
		}
	}
}
