package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// pausingRunner is fakeRunner with a daemon's pause and resume: a
// filesystem pause ends the container's process without an exit code
// (the whole sandbox stops), a memory pause keeps it; refuse makes the
// next pause fail as a daemon's would.
type pausingRunner struct {
	*fakeRunner
	kind   string
	refuse error
	// refuseResume makes the next resume fail.
	refuseResume error

	// events is what Events lists.
	events []client.Event

	pmu     sync.Mutex
	paused  bool
	pauses  int
	resumes int
	ended   map[uint32]bool
}

func (f *pausingRunner) Pause(_ context.Context, _ string) (*client.Sandbox, error) {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	if f.refuse != nil {
		err := f.refuse
		f.refuse = nil
		return nil, err
	}
	f.paused, f.pauses = true, f.pauses+1
	if f.kind == "filesystem" {
		f.fakeRunner.mu.Lock()
		for pid := range f.procs {
			f.ended[pid] = true
		}
		f.fakeRunner.mu.Unlock()
	}
	return &client.Sandbox{Sandbox: types.Sandbox{State: client.StatePaused, Pause: f.kind}}, nil
}

func (f *pausingRunner) Resume(context.Context, string) error {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	if !f.paused {
		return errdefs.ErrFailedPrecondition
	}
	if err := f.refuseResume; err != nil {
		f.refuseResume = nil
		return err
	}
	f.paused, f.resumes = false, f.resumes+1
	return nil
}

// Processes lists the container processes that neither exited nor were
// ended by a pause.
func (f *pausingRunner) Processes(context.Context, string) ([]client.ProcessInfo, error) {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	if f.paused {
		return nil, errdefs.ErrFailedPrecondition
	}
	f.fakeRunner.mu.Lock()
	defer f.fakeRunner.mu.Unlock()
	var out []client.ProcessInfo
	for pid, done := range f.procs {
		select {
		case <-done:
			continue
		default:
		}
		if !f.ended[pid] {
			out = append(out, client.ProcessInfo{PID: pid, Tag: processTag("main")})
		}
	}
	return out, nil
}

// newPausePods is a node with one pod under Always whose container
// "main" runs (run 0) on f.
func newPausePods(t *testing.T, f *pausingRunner) (*Pods, *podState) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p := &Pods{ctx: ctx, sb: f, backOff: newBackOff(time.Second, 4*time.Second), log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	t.Cleanup(func() {
		cancel()
		p.Wait()
	})
	pod := testPod()
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	ps := &podState{pod: pod, plan: pl, sandboxID: "sb", ctx: ctx, containers: map[string]*containerState{}, up: true, net: netState{known: true}}
	p.pods[key(pod.Namespace, pod.Name)] = ps
	pid, err := p.startContainer(ctx, ps, pl.containers[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	p.follow(p.newFollowers(ps), ps, pl.containers[0], pid)
	return p, ps
}

func podNow(p *Pods, ps *podState) *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withStatus(ps)
}

func withPaused(pod *corev1.Pod, v string) *corev1.Pod {
	pod = pod.DeepCopy()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if v == "" {
		delete(pod.Annotations, AnnotationPaused)
	} else {
		pod.Annotations[AnnotationPaused] = v
	}
	return pod
}

func podCondition(pod *corev1.Pod, typ corev1.PodConditionType) corev1.PodCondition {
	for _, c := range pod.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return corev1.PodCondition{}
}

// TestPauseFilesystem: the annotation pauses the sandbox; the pod stays
// Running, not ready, its container waiting with SandboxPaused and its
// condition naming the value; its removal resumes it, and the container
// the pause ended starts again as a restart whose previous run ended
// with 137.
func TestPauseFilesystem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "filesystem", ended: map[uint32]bool{}}
		p, ps := newPausePods(t, f)
		ctx := t.Context()
		if done, _ := PauseStatus(podNow(p, ps), ""); !done {
			t.Fatalf("a running pod's condition does not say running: %+v", podCondition(podNow(p, ps), ConditionPaused))
		}

		const v = "2026-12-03T10:00:00Z"
		if err := p.UpdatePod(ctx, withPaused(ps.pod, v)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		pod := podNow(p, ps)
		if done, err := PauseStatus(pod, v); !done || err != nil {
			t.Fatalf("after the pause: PauseStatus = %v, %v; condition %+v", done, err, podCondition(pod, ConditionPaused))
		}
		if st, kind := Paused(pod); st != "paused" || kind != "filesystem" {
			t.Errorf("Paused = %q, %q; want paused, filesystem", st, kind)
		}
		cs := pod.Status.ContainerStatuses[0]
		if pod.Status.Phase != corev1.PodRunning || cs.State.Waiting == nil || cs.State.Waiting.Reason != ReasonPaused || cs.Ready {
			t.Errorf("paused pod: %s, %+v; want Running with the container waiting (SandboxPaused)", pod.Status.Phase, cs)
		}
		if c := podCondition(pod, corev1.PodReady); c.Status != corev1.ConditionFalse {
			t.Errorf("paused pod Ready = %s", c.Status)
		}
		// The same value again does nothing.
		if err := p.UpdatePod(ctx, withPaused(ps.pod, v)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		if err := p.UpdatePod(ctx, withPaused(ps.pod, "")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		pod = podNow(p, ps)
		if done, err := PauseStatus(pod, ""); !done || err != nil {
			t.Fatalf("after the resume: PauseStatus = %v, %v", done, err)
		}
		cs = pod.Status.ContainerStatuses[0]
		if cs.State.Running == nil || cs.RestartCount != 1 {
			t.Fatalf("resumed: %+v; want running again as restart 1", cs)
		}
		if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 137 {
			t.Errorf("last state = %+v, want ended with 137 by the pause", lt)
		}
		if got := f.starts(); !slices.Equal(got, []int{0, 1}) {
			t.Errorf("runs started = %v, want 0 and 1", got)
		}
		if f.pauses != 1 || f.resumes != 1 {
			t.Errorf("pauses %d, resumes %d; want 1 each", f.pauses, f.resumes)
		}
		// The new run is followed: its exit is seen and restarted.
		f.exit(1)
		synctest.Wait()
		if got := f.starts(); !slices.Equal(got, []int{0, 1, 2}) {
			t.Errorf("after the resumed run exited: runs %v, want 0, 1, 2", got)
		}
	})
}

// TestPauseMemory: a memory pause keeps the process, which is followed
// again after the resume (nothing restarts; its exit is still seen).
func TestPauseMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "memory", ended: map[uint32]bool{}}
		p, ps := newPausePods(t, f)
		ctx := t.Context()
		if err := p.UpdatePod(ctx, withPaused(ps.pod, "now")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st, kind := Paused(podNow(p, ps)); st != "paused" || kind != "memory" {
			t.Fatalf("Paused = %q, %q; want paused, memory", st, kind)
		}
		if err := p.UpdatePod(ctx, withPaused(ps.pod, "")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		pod := podNow(p, ps)
		if cs := pod.Status.ContainerStatuses[0]; cs.State.Running == nil || cs.RestartCount != 0 {
			t.Fatalf("resumed: %+v; want the same run running", cs)
		}
		f.exit(3)
		synctest.Wait()
		if got := f.starts(); !slices.Equal(got, []int{0, 1}) {
			t.Errorf("after the kept process exited: runs %v, want 0 then 1", got)
		}
	})
}

// TestPauseRefused: a pause the daemon refuses is reported with its code
// and words, the sandbox runs on with its container followed, and the
// same value is not tried again; another value is.
func TestPauseRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "filesystem", ended: map[uint32]bool{},
			refuse: &errdefs.Error{Code: errdefs.CodeUnavailable, Message: "no room for the checkpoint"}}
		p, ps := newPausePods(t, f)
		ctx := t.Context()
		if err := p.UpdatePod(ctx, withPaused(ps.pod, "one")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		pod := podNow(p, ps)
		done, err := PauseStatus(pod, "one")
		if !done || !errors.Is(err, errdefs.ErrUnavailable) || err.Error() != "no room for the checkpoint: "+errdefs.ErrUnavailable.Error() {
			t.Fatalf("refused pause: PauseStatus = %v, %v", done, err)
		}
		if st, _ := Paused(pod); st != "" {
			t.Errorf("refused pause: Paused = %q, want running", st)
		}
		f.exit(1)
		synctest.Wait()
		if got := f.starts(); !slices.Equal(got, []int{0, 1}) {
			t.Fatalf("the container is not followed after a refused pause: runs %v", got)
		}
		if err := p.UpdatePod(ctx, withPaused(ps.pod, "two")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, ps), "two"); !done || err != nil {
			t.Errorf("another value: PauseStatus = %v, %v", done, err)
		}
	})
}

func (f *pausingRunner) Get(context.Context, string) (*client.Sandbox, error) {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	st := client.StateReady
	if f.paused {
		st = client.StatePaused
	}
	return &client.Sandbox{Sandbox: types.Sandbox{State: st, Pause: f.kind}}, nil
}

func (f *pausingRunner) SetTimeout(context.Context, string, time.Duration) error { return nil }

// pausedByItsDaemon gives the running pod ps the annotations ann (its
// plan made again from them), then has f's daemon pause its sandbox on
// its own, with why as the paused event says, and the node hear of it.
func pausedByItsDaemon(t *testing.T, p *Pods, ps *podState, f *pausingRunner, ann map[string]string, why string) *corev1.Pod {
	t.Helper()
	pod := ps.pod.DeepCopy()
	pod.Annotations = ann
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	ps.pod, ps.plan, ps.applied = pod, pl, pod.Annotations[AnnotationDeadline]
	p.mu.Unlock()
	if _, err := f.Pause(t.Context(), "sb"); err != nil {
		t.Fatal(err)
	}
	p.pausedByDaemon(t.Context(), ps, "sb", client.Event{Type: client.EventPaused, Time: time.Now(), Message: why})
	return pod
}

// TestPauseAtDeadline: a pause the daemon made on its own (the deadline
// under on-timeout pause) is reported paused and not undone; a moved
// deadline resumes the sandbox; a pause annotation then takes it over.
func TestPauseAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "filesystem", ended: map[uint32]bool{}}
		p, ps := newPausePods(t, f)
		ctx := t.Context()
		// The daemon pauses it at the deadline.
		pod := pausedByItsDaemon(t, p, ps, f, map[string]string{AnnotationDeadline: "2026-12-03T10:00:00Z", AnnotationOnTimeout: "pause"},
			"paused at its deadline (filesystem)")
		synctest.Wait()
		got := podNow(p, ps)
		if st, kind := Paused(got); st != "paused" || kind != "filesystem" {
			t.Fatalf("after the deadline: Paused = %q, %q; condition %+v", st, kind, podCondition(got, ConditionPaused))
		}
		if at, ok := PausedByDaemon(got); !ok || at.IsZero() {
			t.Errorf("PausedByDaemon = %v, %v; condition %+v", at, ok, podCondition(got, ConditionPaused))
		}
		// Another change of the pod (a label) does not resume it.
		same := pod.DeepCopy()
		same.Labels = map[string]string{"x": "y"}
		if err := p.UpdatePod(ctx, same); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if f.resumes != 0 {
			t.Fatalf("resumed without a new deadline")
		}
		// A moved deadline resumes it; the container starts again.
		moved := same.DeepCopy()
		moved.Annotations[AnnotationDeadline] = "2026-12-03T11:00:00Z"
		if err := p.UpdatePod(ctx, moved); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		got = podNow(p, ps)
		if done, err := PauseStatus(got, ""); !done || err != nil || f.resumes != 1 {
			t.Fatalf("after the deadline moved: PauseStatus = %v, %v; resumes %d", done, err, f.resumes)
		}
		if cs := got.Status.ContainerStatuses[0]; cs.State.Running == nil || cs.RestartCount != 1 {
			t.Errorf("resumed container = %+v, want running as restart 1", cs)
		}

		// Paused at the deadline again, then the annotation takes over:
		// its removal resumes.
		if _, err := f.Pause(ctx, "sb"); err != nil {
			t.Fatal(err)
		}
		p.pausedByDaemon(ctx, ps, "sb", client.Event{Type: client.EventPaused, Time: time.Now(), Message: "paused at its deadline (filesystem)"})
		held := withPaused(moved, "held")
		if err := p.UpdatePod(ctx, held); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, ps), "held"); !done || err != nil {
			t.Fatalf("annotation over a deadline pause: PauseStatus = %v, %v", done, err)
		}
		if err := p.UpdatePod(ctx, withPaused(held, "")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, ps), ""); !done || err != nil || f.resumes != 2 {
			t.Errorf("annotation removed: PauseStatus = %v, %v; resumes %d", done, err, f.resumes)
		}
	})
}

// FollowEvents has no events to tell until ctx ends.
func (f *pausingRunner) FollowEvents(ctx context.Context, _ string, _ func(client.Event) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *pausingRunner) Events(context.Context, string) ([]client.Event, error) { return f.events, nil }

// TestReadoptPaused: a node that restarts while its pod's sandbox is
// paused keeps it paused when the daemon paused it on its own (its
// deadline, idle: its last paused event says so), and resumes it when
// the pause annotation was removed while it was away.
func TestReadoptPaused(t *testing.T) {
	for _, tc := range []struct {
		name, message string
		resumes       int
	}{
		{"at its deadline", "paused at its deadline (filesystem)", 0},
		{"idle", "idle for 5s (filesystem)", 0},
		{"annotation removed", "paused (filesystem)", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "filesystem", ended: map[uint32]bool{},
					events: []client.Event{{Type: client.EventPaused, Message: "paused (filesystem)"}, {Type: client.EventResumed}, {Type: client.EventPaused, Message: tc.message}}}
				p, ps := newPausePods(t, f)
				ctx := t.Context()
				if _, err := f.Pause(ctx, "sb"); err != nil {
					t.Fatal(err)
				}
				pod := ps.pod.DeepCopy()
				pod.Annotations = map[string]string{AnnotationDeadline: "2026-12-03T10:00:00Z", AnnotationOnTimeout: "pause"}
				fresh := &podState{pod: pod, plan: ps.plan, sandboxID: "sb", ctx: ctx, containers: map[string]*containerState{}, net: netState{known: true}}
				p.mu.Lock()
				p.pods[key(pod.Namespace, pod.Name)] = fresh
				p.mu.Unlock()
				sb := &client.Sandbox{Sandbox: types.Sandbox{ID: "sb", State: client.StatePaused, Pause: "filesystem", OnTimeout: client.OnTimeoutPause, Remaining: "0s"}}
				p.readoptPaused(ctx, fresh, sb)
				p.applyPause(ctx, fresh)
				synctest.Wait()
				if f.resumes != tc.resumes {
					t.Errorf("resumes = %d, want %d", f.resumes, tc.resumes)
				}
			})
		})
	}
}

// TestPauseAtDeadlineResumeRefused: a daemon's pause whose resume (a
// moved deadline) the daemon refuses is reported ResumeRefused, and the
// next deadline tries again.
func TestPauseAtDeadlineResumeRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "memory", ended: map[uint32]bool{},
			refuseResume: &errdefs.Error{Code: errdefs.CodeUnavailable, Message: "no room to restore"}}
		p, ps := newPausePods(t, f)
		ctx := t.Context()
		pod := pausedByItsDaemon(t, p, ps, f, map[string]string{AnnotationDeadline: "2026-12-03T10:00:00Z", AnnotationIdlePause: "5m"},
			"idle for 5m0s (memory)")
		moved := pod.DeepCopy()
		moved.Annotations[AnnotationDeadline] = "2026-12-03T11:00:00Z"
		if err := p.UpdatePod(ctx, moved); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, ps), ""); !done || !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("refused resume: PauseStatus = %v, %v; condition %+v", done, err, podCondition(podNow(p, ps), ConditionPaused))
		}
		again := moved.DeepCopy()
		again.Annotations[AnnotationDeadline] = "2026-12-03T12:00:00Z"
		if err := p.UpdatePod(ctx, again); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, ps), ""); !done || err != nil || f.resumes != 1 {
			t.Errorf("after another deadline: PauseStatus = %v, %v; resumes %d", done, err, f.resumes)
		}
	})
}
