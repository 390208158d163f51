package kube

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/test/harness"
)

// TestPodInitContainers: a pod's init containers run in its sandbox one
// after the other, each to exit 0, before its containers start: the pod is
// Pending and not Initialized meanwhile (its container waiting with
// PodInitializing); one that fails runs again (restartPolicy OnFailure);
// what they leave in a shared emptyDir is there for the container; their
// logs are kubectl logs -c NAME. They carry on across a restart of the
// node without running again once done. Under restartPolicy Never a
// failed init container fails the pod and its container never starts.
func TestPodInitContainers(t *testing.T) {
	c := startClusterWith(t, []string{"--restart-backoff", "1s", "--restart-backoff-max", "2s"}, "berth-inits")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")

	pod := sandboxPod("inits", "sh", "-c", "cat /data/seed /data/runs && exec sleep 3600")
	pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: "/data"}}
	mount := []corev1.VolumeMount{{Name: "work", MountPath: "/work"}}
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "seed", Image: "minimal", VolumeMounts: mount, Env: []corev1.EnvVar{{Name: "WHAT", Value: "seeded"}},
			Command: []string{"sh", "-c", "echo $WHAT > /work/seed && echo seed-log-line"}},
		// Fails its first run, succeeds its second.
		{Name: "flaky", Image: "minimal", VolumeMounts: mount,
			Command: []string{"sh", "-c", "[ -e /work/tried ] && exit 0; touch /work/tried; exit 3"}},
		// Holds the pod initializing until the test lets it go; counts
		// its runs.
		{Name: "gate", Image: "minimal", VolumeMounts: mount,
			Command: []string{"sh", "-c", "echo run >> /work/runs; while [ ! -e /work/go ]; do sleep 0.1; done"}},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	initStatus := func(p *corev1.Pod, name string) corev1.ContainerStatus {
		for _, s := range p.Status.InitContainerStatuses {
			if s.Name == name {
				return s
			}
		}
		return corev1.ContainerStatus{}
	}
	p := waitPod(t, cp, "default", "inits", "the gate init container running", func(p *corev1.Pod) bool {
		return initStatus(p, "gate").State.Running != nil
	})
	if p.Status.Phase != corev1.PodPending || podCondition(p, corev1.PodInitialized) != corev1.ConditionFalse {
		t.Errorf("while initializing: phase %s, Initialized %s; want Pending, False", p.Status.Phase, podCondition(p, corev1.PodInitialized))
	}
	if w := p.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("container while initializing: %+v, want waiting with PodInitializing", p.Status.ContainerStatuses[0].State)
	}
	if s := initStatus(p, "seed"); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.State.Terminated.Reason != "Completed" || !s.Ready {
		t.Errorf("seed = %+v, want terminated Completed and ready", s)
	}
	if s := initStatus(p, "flaky"); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.RestartCount != 1 ||
		s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode != 3 {
		t.Errorf("flaky = %+v, want exit 0 after one restart from exit 3", s)
	}
	if got := containerLogs(t, cp, "default", "inits", "seed"); got != "seed-log-line\n" {
		t.Errorf("logs of seed = %q", got)
	}

	// The node restarts while gate runs: gate carries on (not run
	// again), seed and flaky stay done.
	restartNode(t, cp, c.nodes["berth-inits"], "berth-inits")
	p = waitPod(t, cp, "default", "inits", "gate running after the node's restart", func(p *corev1.Pod) bool {
		return initStatus(p, "gate").State.Running != nil && initStatus(p, "seed").State.Terminated != nil
	})
	if s := initStatus(p, "flaky"); s.State.Terminated == nil || s.RestartCount != 1 {
		t.Errorf("flaky after the node's restart = %+v, want done after one restart", s)
	}
	if out, stderr, code := execPodIn(t, cp, "default", "inits", "gate", "touch", "/work/go"); code != 0 {
		t.Fatalf("touch /work/go: %d %q %q", code, out, stderr)
	}
	p = waitPod(t, cp, "default", "inits", "Running and Initialized", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && podCondition(p, corev1.PodInitialized) == corev1.ConditionTrue &&
			len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	if s := initStatus(p, "gate"); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.RestartCount != 0 {
		t.Errorf("gate = %+v, want exit 0, never restarted", s)
	}
	harness.WaitFor(t, time.Minute, "the container's output", func() bool {
		return strings.Count(containerLogs(t, cp, "default", "inits", "main"), "\n") >= 2
	})
	if got := containerLogs(t, cp, "default", "inits", "main"); got != "seeded\nrun\n" {
		t.Errorf("container read %q from the init containers' volume, want seeded and one gate run", got)
	}
	if err := pods.Delete(ctx, "inits", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "inits")

	// Never: a failed init container fails the pod; the container never
	// starts and the next init container never runs.
	never := sandboxPod("init-fails", "sh", "-c", "echo should-not-run")
	never.Spec.InitContainers = []corev1.Container{
		{Name: "check", Image: "minimal", Command: []string{"sh", "-c", "echo missing config >&2; exit 7"}},
		{Name: "after", Image: "minimal", Command: []string{"true"}},
	}
	if _, err := pods.Create(ctx, never, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPod(t, cp, "default", "init-fails", "Failed", phase(corev1.PodFailed))
	if s := initStatus(p, "check"); s.State.Terminated == nil || s.State.Terminated.ExitCode != 7 || s.State.Terminated.Reason != "Error" || s.RestartCount != 0 {
		t.Errorf("check = %+v, want terminated with 7, Error, no restart", s)
	}
	if s := initStatus(p, "after"); s.State.Waiting == nil || s.State.Waiting.Reason != "PodInitializing" {
		t.Errorf("after = %+v, want waiting with PodInitializing", s.State)
	}
	if w := p.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("container = %+v, want never started (waiting with PodInitializing)", p.Status.ContainerStatuses[0].State)
	}
	if got := containerLogs(t, cp, "default", "init-fails", "check"); got != "missing config\n" {
		t.Errorf("logs of check = %q", got)
	}
	if err := pods.Delete(ctx, "init-fails", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "init-fails")
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}
