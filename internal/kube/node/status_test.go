package node

import (
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestPodPhase: the pod's phase and container states follow its
// containers, its restart policy (the kubelet's rules) and its sandbox.
func TestPodPhase(t *testing.T) {
	now := time.Now()
	last := &containerRun{exitCode: 1, startedAt: now.Add(-time.Minute), finishedAt: now.Add(-30 * time.Second)}
	const (
		always    = corev1.RestartPolicyAlways
		onFailure = corev1.RestartPolicyOnFailure
		never     = corev1.RestartPolicyNever
	)
	for _, tc := range []struct {
		name       string
		policy     corev1.RestartPolicy
		sandbox    string
		reason     string
		containers map[string]*containerState
		want       corev1.PodPhase
		ready      corev1.ConditionStatus
	}{
		{"creating", never, "", "", nil, corev1.PodPending, corev1.ConditionFalse},
		// The kubelet: a container never started keeps the pod Pending.
		{"one running, one not started", never, "sb1", "", map[string]*containerState{"a": {running: true, startedAt: now}}, corev1.PodPending, corev1.ConditionFalse},
		{"both running", never, "sb1", "", map[string]*containerState{"a": {running: true}, "b": {running: true}}, corev1.PodRunning, corev1.ConditionTrue},
		{"one ended", never, "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {running: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"all exit 0, Never", never, "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {exited: true}}, corev1.PodSucceeded, corev1.ConditionFalse},
		{"all exit 0, OnFailure", onFailure, "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {exited: true}}, corev1.PodSucceeded, corev1.ConditionFalse},
		// Always restarts whatever the code: the pod goes on.
		{"all exit 0, Always", always, "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {exited: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"all exit 0, default policy", "", "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {exited: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"one exit 3, Never", never, "sb1", "", map[string]*containerState{"a": {exited: true, exitCode: 3}, "b": {exited: true}}, corev1.PodFailed, corev1.ConditionFalse},
		// OnFailure restarts the failed one: the pod goes on.
		{"one exit 3, OnFailure", onFailure, "sb1", "", map[string]*containerState{"a": {exited: true, exitCode: 3}, "b": {exited: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"one exit 3, Always", always, "sb1", "", map[string]*containerState{"a": {exited: true, exitCode: 3}, "b": {exited: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"backing off, other exited", onFailure, "sb1", "", map[string]*containerState{"a": {exited: true, exitCode: 1, restarts: 2, backOff: 20 * time.Second, last: last}, "b": {exited: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"restarted and running", always, "sb1", "", map[string]*containerState{"a": {running: true, restarts: 1, last: last}, "b": {running: true}}, corev1.PodRunning, corev1.ConditionTrue},
		{"sandbox ended, Always", always, "sb1", "BerthSandboxEnded", map[string]*containerState{"a": {running: true}, "b": {exited: true}}, corev1.PodFailed, corev1.ConditionFalse},
		{"sandbox ended while backing off", always, "sb1", "BerthSandboxEnded", map[string]*containerState{"a": {exited: true, restarts: 1, backOff: time.Second}, "b": {running: true}}, corev1.PodFailed, corev1.ConditionFalse},
		{"invalid", never, "", "BerthInvalidPod", nil, corev1.PodFailed, corev1.ConditionFalse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pods{ip: "127.0.0.1", log: slog.New(slog.DiscardHandler)}
			ps := &podState{pod: testPod(), started: now, sandboxID: tc.sandbox, reason: tc.reason, containers: tc.containers}
			ps.pod.Spec.RestartPolicy = tc.policy
			if ps.containers == nil {
				ps.containers = map[string]*containerState{}
			}
			if tc.reason != "BerthInvalidPod" {
				ps.plan.containers = []containerPlan{{name: "a", argv: []string{"true"}}, {name: "b", argv: []string{"true"}}}
			}
			pod := p.withStatus(ps)
			if pod.Status.Phase != tc.want {
				t.Errorf("phase = %s, want %s", pod.Status.Phase, tc.want)
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status != tc.ready {
					t.Errorf("ready = %s, want %s", c.Status, tc.ready)
				}
			}
			for _, cs := range pod.Status.ContainerStatuses {
				n := 0
				for _, set := range []bool{cs.State.Waiting != nil, cs.State.Running != nil, cs.State.Terminated != nil} {
					if set {
						n++
					}
				}
				if n != 1 {
					t.Errorf("container %s state = %+v: want exactly one of waiting, running, terminated", cs.Name, cs.State)
				}
				if tc.reason != "" && cs.State.Terminated == nil {
					t.Errorf("container %s of a failed pod = %+v, want terminated", cs.Name, cs.State)
				}
			}
			if tc.want == corev1.PodFailed && tc.reason != "" && pod.Status.Reason != tc.reason {
				t.Errorf("reason = %q, want %q", pod.Status.Reason, tc.reason)
			}
		})
	}
}

// TestContainerStatus: a container's state, last state and restart count
// as the kubelet reports them, through a crash loop.
func TestContainerStatus(t *testing.T) {
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	first := &containerRun{exitCode: 1, startedAt: at(0), finishedAt: at(1)}
	for _, tc := range []struct {
		name         string
		cs           *containerState
		failure      string
		state        string // waiting, running or terminated
		reason       string // of the waiting or terminated state
		code         int32  // of the terminated state
		restarts     int32
		lastCode     int32 // -1: no last state
		lastReason   string
		lastStarted  time.Time
		lastFinished time.Time
	}{
		{name: "not started", cs: nil, state: "waiting", reason: reasonCreating, lastCode: -1},
		{name: "first run", cs: &containerState{running: true, startedAt: at(0)}, state: "running", lastCode: -1},
		{name: "first run exited 0", cs: &containerState{exited: true, startedAt: at(0), finishedAt: at(1)}, state: "terminated", reason: reasonCompleted, lastCode: -1},
		{name: "first run exited 1", cs: &containerState{exited: true, exitCode: 1, startedAt: at(0), finishedAt: at(1)}, state: "terminated", reason: reasonError, code: 1, lastCode: -1},
		{name: "restarted, running", cs: &containerState{running: true, startedAt: at(1), restarts: 1, last: first}, state: "running", restarts: 1,
			lastCode: 1, lastReason: reasonError, lastStarted: at(0), lastFinished: at(1)},
		// Backing off: the run that just ended is the last state, the
		// restart count is that of the restarts so far.
		{name: "backing off", cs: &containerState{exited: true, exitCode: 2, startedAt: at(1), finishedAt: at(3), restarts: 1, last: first, backOff: 10 * time.Second},
			state: "waiting", reason: reasonCrashLoopBackOff, restarts: 1, lastCode: 2, lastReason: reasonError, lastStarted: at(1), lastFinished: at(3)},
		{name: "backing off after exit 0", cs: &containerState{exited: true, startedAt: at(1), finishedAt: at(3), restarts: 1, last: first, backOff: 10 * time.Second},
			state: "waiting", reason: reasonCrashLoopBackOff, restarts: 1, lastCode: 0, lastReason: reasonCompleted, lastStarted: at(1), lastFinished: at(3)},
		{name: "done after restarts", cs: &containerState{exited: true, startedAt: at(1), finishedAt: at(3), restarts: 1, last: first},
			state: "terminated", reason: reasonCompleted, restarts: 1, lastCode: 1, lastReason: reasonError, lastStarted: at(0), lastFinished: at(1)},
		{name: "pod failed while running", cs: &containerState{running: true, restarts: 1, last: first}, failure: "BerthSandboxEnded",
			state: "terminated", reason: "BerthSandboxEnded", code: 137, restarts: 1, lastCode: 1, lastReason: reasonError, lastStarted: at(0), lastFinished: at(1)},
		{name: "pod failed while backing off", cs: &containerState{exited: true, exitCode: 2, restarts: 1, last: first, backOff: time.Second}, failure: "BerthSandboxEnded",
			state: "terminated", reason: reasonError, code: 2, restarts: 1, lastCode: 1, lastReason: reasonError, lastStarted: at(0), lastFinished: at(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := containerStatus("main", "minimal", "berth://sb/main", tc.cs, tc.failure, "", "p_ns(uid)")
			var state, reason string
			var code int32
			switch {
			case s.State.Waiting != nil:
				state, reason = "waiting", s.State.Waiting.Reason
			case s.State.Running != nil:
				state = "running"
			case s.State.Terminated != nil:
				state, reason, code = "terminated", s.State.Terminated.Reason, s.State.Terminated.ExitCode
			}
			if state != tc.state || reason != tc.reason || code != tc.code {
				t.Errorf("state = %s %q exit %d, want %s %q exit %d", state, reason, code, tc.state, tc.reason, tc.code)
			}
			if s.RestartCount != tc.restarts {
				t.Errorf("restartCount = %d, want %d", s.RestartCount, tc.restarts)
			}
			lt := s.LastTerminationState.Terminated
			switch {
			case tc.lastCode < 0 && lt != nil:
				t.Errorf("lastState = %+v, want none", lt)
			case tc.lastCode >= 0 && lt == nil:
				t.Errorf("lastState = none, want exit %d", tc.lastCode)
			case lt != nil && (lt.ExitCode != tc.lastCode || lt.Reason != tc.lastReason || !lt.StartedAt.Time.Equal(tc.lastStarted) || !lt.FinishedAt.Time.Equal(tc.lastFinished)):
				t.Errorf("lastState = exit %d %q %s–%s, want exit %d %q %s–%s", lt.ExitCode, lt.Reason, lt.StartedAt.Time, lt.FinishedAt.Time,
					tc.lastCode, tc.lastReason, tc.lastStarted, tc.lastFinished)
			}
			if (s.State.Running != nil) != s.Ready {
				t.Errorf("ready = %v with state %+v", s.Ready, s.State)
			}
		})
	}
}

// TestBackOff: the kubelet's back-off, 0 then 10 s doubling to 5 min,
// reset after 10 min; and a configured one.
func TestBackOff(t *testing.T) {
	b := newBackOff(0, 0)
	if b.initial != DefaultRestartBackOff || b.max != DefaultRestartBackOffMax || b.reset != restartBackOffReset {
		t.Errorf("default back-off = %+v, want the kubelet's", b)
	}
	s := time.Second
	for _, tc := range []struct {
		b     backOff
		steps int
		want  time.Duration
	}{
		{b, 0, 0},
		{b, 1, 10 * s},
		{b, 2, 20 * s},
		{b, 3, 40 * s},
		{b, 5, 160 * s},
		{b, 6, 300 * s},
		{b, 7, 300 * s},
		{b, 1000, 300 * s},
		{newBackOff(s, 4*s), 1, s},
		{newBackOff(s, 4*s), 3, 4 * s},
		{newBackOff(s, 4*s), 9, 4 * s},
		// A cap below the first wait is raised to it.
		{newBackOff(3*s, s), 2, 3 * s},
	} {
		if got := tc.b.delay(tc.steps); got != tc.want {
			t.Errorf("%+v.delay(%d) = %s, want %s", tc.b, tc.steps, got, tc.want)
		}
	}
	if got := newBackOff(s, 4*s).reset; got != 8*s {
		t.Errorf("reset of a 4 s cap = %s, want 8 s", got)
	}
}

// TestRestartsOn: which exits each restart policy restarts.
func TestRestartsOn(t *testing.T) {
	for _, tc := range []struct {
		policy corev1.RestartPolicy
		code   int
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{"", 0, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 137, true},
		{corev1.RestartPolicyNever, 0, false},
		{corev1.RestartPolicyNever, 1, false},
	} {
		if got := restartsOn(tc.policy, tc.code); got != tc.want {
			t.Errorf("restartsOn(%q, %d) = %v, want %v", tc.policy, tc.code, got, tc.want)
		}
	}
}

// TestWithWarm: the warm pools' sandboxes come out of the allocatable
// pods, never below none; other resources and no pools change nothing.
func TestWithWarm(t *testing.T) {
	alloc := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10"), corev1.ResourceMemory: resource.MustParse("8Gi")}
	for _, tc := range []struct {
		warm, want int64
	}{{0, 10}, {3, 7}, {10, 0}, {12, 0}} {
		got := withWarm(alloc, tc.warm)
		if got.Pods().Value() != tc.want || !got.Memory().Equal(resource.MustParse("8Gi")) {
			t.Errorf("withWarm(%d) = %v, want %d pods and the memory as it was", tc.warm, got, tc.want)
		}
	}
	if alloc.Pods().Value() != 10 {
		t.Errorf("withWarm changed its argument: %v", alloc)
	}
}
