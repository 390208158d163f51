package node

import (
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestPodPhase: the pod's phase and container states follow its
// containers and its sandbox.
func TestPodPhase(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name       string
		sandbox    string
		reason     string
		containers map[string]*containerState
		want       corev1.PodPhase
		ready      corev1.ConditionStatus
	}{
		{"creating", "", "", nil, corev1.PodPending, corev1.ConditionFalse},
		{"one running", "sb1", "", map[string]*containerState{"a": {running: true, startedAt: now}}, corev1.PodRunning, corev1.ConditionFalse},
		{"both running", "sb1", "", map[string]*containerState{"a": {running: true}, "b": {running: true}}, corev1.PodRunning, corev1.ConditionTrue},
		{"one ended", "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {running: true}}, corev1.PodRunning, corev1.ConditionFalse},
		{"all exit 0", "sb1", "", map[string]*containerState{"a": {exited: true}, "b": {exited: true}}, corev1.PodSucceeded, corev1.ConditionFalse},
		{"one exit 3", "sb1", "", map[string]*containerState{"a": {exited: true, exitCode: 3}, "b": {exited: true}}, corev1.PodFailed, corev1.ConditionFalse},
		{"sandbox ended", "sb1", "BerthSandboxEnded", map[string]*containerState{"a": {running: true}, "b": {exited: true}}, corev1.PodFailed, corev1.ConditionFalse},
		{"invalid", "", "BerthInvalidPod", nil, corev1.PodFailed, corev1.ConditionFalse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pods{ip: "127.0.0.1", log: slog.New(slog.DiscardHandler)}
			ps := &podState{pod: testPod(), started: now, sandboxID: tc.sandbox, reason: tc.reason, containers: tc.containers}
			if ps.containers == nil {
				ps.containers = map[string]*containerState{}
			}
			if tc.reason != "BerthInvalidPod" {
				ps.plan.containers = []containerPlan{{name: "a", argv: []string{"true"}}, {name: "b"}}
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
