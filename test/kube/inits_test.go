package kube

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/berth-sandbox/berth/internal/kube/node"
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
// A sidecar (restartPolicy Always) starts among them and runs beside the
// container: the next init container waits for its startup probe, its
// readiness holds the pod's, it is restarted under a pod whose policy is
// Never, carries on across a node restart, and is stopped (SIGTERM) once
// the container completed, the pod then Succeeded.
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

	testSidecar(t, c)
	testPauseDuringInit(t, c)
}

// testPauseDuringInit: a sandbox paused while an init container runs, by
// the pause annotation and then by its daemon at its deadline
// (on-timeout pause), leaves the pod Pending and paused, not failed; the
// annotation's removal, then a moved deadline, resume it, the init
// container each (filesystem) pause ended runs again as a restart, and
// the container starts once it succeeded.
func testPauseDuringInit(t *testing.T, c *cluster) {
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")
	pod := sandboxPod("init-paused", "sh", "-c", "cat /work/runs; exec sleep 3600")
	pod.Annotations = map[string]string{node.AnnotationOnTimeout: "pause",
		node.AnnotationDeadline: time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mount := []corev1.VolumeMount{{Name: "work", MountPath: "/work"}}
	pod.Spec.Containers[0].VolumeMounts = mount
	pod.Spec.InitContainers = []corev1.Container{{Name: "gate", Image: "minimal", VolumeMounts: mount,
		Command: []string{"sh", "-c", "echo run >> /work/runs; while [ ! -e /work/go ]; do sleep 0.1; done"}}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gate := func(p *corev1.Pod) corev1.ContainerStatus {
		if len(p.Status.InitContainerStatuses) == 0 {
			return corev1.ContainerStatus{}
		}
		return p.Status.InitContainerStatuses[0]
	}
	// gate's run is recorded once its shell wrote its line: a container
	// reported running may not have run its first command yet, and a
	// pause before it would end a run that left no line.
	recorded := func(runs string) {
		t.Helper()
		harness.WaitFor(t, time.Minute, "gate's line in /work/runs", func() bool {
			out, _, code := execPodIn(t, cp, "default", "init-paused", "gate", "cat", "/work/runs")
			return code == 0 && out == runs
		})
	}
	waitPod(t, cp, "default", "init-paused", "gate running", func(p *corev1.Pod) bool { return gate(p).State.Running != nil })
	recorded("run\n")
	// Paused by the annotation, then resumed by its removal: gate runs
	// again.
	annotate := func(v string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, node.AnnotationPaused)
		if v != "" {
			patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, node.AnnotationPaused, v)
		}
		if _, err := pods.Patch(ctx, "init-paused", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate("now")
	p := waitPod(t, cp, "default", "init-paused", "paused by the annotation", func(p *corev1.Pod) bool {
		done, err := node.PauseStatus(p, "now")
		return done && err == nil
	})
	if w := gate(p).State.Waiting; p.Status.Phase != corev1.PodPending || w == nil || w.Reason != node.ReasonPaused {
		t.Errorf("paused while initializing: phase %s, gate %+v; want Pending, waiting with %s", p.Status.Phase, gate(p).State, node.ReasonPaused)
	}
	annotate("")
	waitPod(t, cp, "default", "init-paused", "gate running again after the resume", func(p *corev1.Pod) bool {
		st, _ := node.Paused(p)
		return st == "" && gate(p).State.Running != nil && gate(p).RestartCount == 1
	})
	recorded("run\nrun\n")
	deadline := func(d time.Duration) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, node.AnnotationDeadline, time.Now().Add(d).UTC().Format(time.RFC3339))
		if _, err := pods.Patch(ctx, "init-paused", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The deadline comes while gate runs: the daemon pauses the sandbox.
	deadline(2 * time.Second)
	p = waitPod(t, cp, "default", "init-paused", "paused by its daemon", func(p *corev1.Pod) bool {
		st, _ := node.Paused(p)
		return st == "paused"
	})
	if p.Status.Phase != corev1.PodPending || p.Status.Reason != "" {
		t.Errorf("paused while initializing: phase %s, reason %q; want Pending, none", p.Status.Phase, p.Status.Reason)
	}
	// A moved deadline resumes it: gate runs again (the pause ended its
	// process), then the container starts.
	deadline(time.Hour)
	waitPod(t, cp, "default", "init-paused", "gate running again", func(p *corev1.Pod) bool {
		st, _ := node.Paused(p)
		return st == "" && gate(p).State.Running != nil && gate(p).RestartCount == 2
	})
	if out, stderr, code := execPodIn(t, cp, "default", "init-paused", "gate", "touch", "/work/go"); code != 0 {
		t.Fatalf("touch /work/go: %d %q %q", code, out, stderr)
	}
	p = waitPod(t, cp, "default", "init-paused", "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Status.ContainerStatuses[0].State.Running != nil
	})
	if s := gate(p); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 ||
		s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode != 137 {
		t.Errorf("gate = %+v, want exit 0 after a run the pause ended (137)", s)
	}
	last := ""
	harness.WaitFor(t, time.Minute, "the container's output: three runs of gate", func() bool {
		out := containerLogs(t, cp, "default", "init-paused", "main")
		if out != last {
			t.Logf("the container printed %q", out)
			last = out
		}
		return out == "run\nrun\nrun\n"
	})
	if err := pods.Delete(ctx, "init-paused", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "init-paused")
}

func testSidecar(t *testing.T, c *cluster) {
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")
	pod := sandboxPod("sidecar", "sh", "-c", "cat /work/side; while [ ! -e /work/go ]; do sleep 0.1; done")
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mount := []corev1.VolumeMount{{Name: "work", MountPath: "/work"}}
	pod.Spec.Containers[0].VolumeMounts = mount
	always := corev1.ContainerRestartPolicyAlways
	// Checked every second; the startup probe gives it a minute.
	probe := func(failures int32, cmd ...string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}, PeriodSeconds: 1, FailureThreshold: failures}
	}
	pod.Spec.InitContainers = []corev1.Container{
		// Starts (its startup probe passes) once it wrote /work/side;
		// exits 2 when asked to (/work/crash), 0 on SIGTERM.
		{Name: "proxy", Image: "minimal", RestartPolicy: &always, VolumeMounts: mount,
			Command: []string{"sh", "-c", `trap 'echo stopping; exit 0' TERM; echo up >> /work/side
while :; do if [ -e /work/crash ]; then rm /work/crash; exit 2; fi; sleep 0.1; done`},
			StartupProbe: probe(60, "test", "-s", "/work/side"), ReadinessProbe: probe(1, "test", "-e", "/work/ready")},
		// Runs only once proxy started.
		{Name: "after", Image: "minimal", VolumeMounts: mount, Command: []string{"test", "-s", "/work/side"}},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proxy := func(p *corev1.Pod) corev1.ContainerStatus {
		for _, s := range p.Status.InitContainerStatuses {
			if s.Name == "proxy" {
				return s
			}
		}
		return corev1.ContainerStatus{}
	}
	p := waitPod(t, cp, "default", "sidecar", "Running and Initialized beside a running sidecar", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && podCondition(p, corev1.PodInitialized) == corev1.ConditionTrue &&
			proxy(p).State.Running != nil
	})
	if s := p.Status.InitContainerStatuses[1]; s.Name != "after" || s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
		t.Errorf("after = %+v, want exit 0 (it ran once proxy had started)", s)
	}
	if s := proxy(p); s.Started == nil || !*s.Started || s.Ready {
		t.Errorf("proxy = %+v, want started, not ready (no /work/ready yet)", s)
	}
	if got := podCondition(p, corev1.PodReady); got != corev1.ConditionFalse {
		t.Errorf("Ready = %s while the sidecar is not, want False", got)
	}
	if out, stderr, code := execPodIn(t, cp, "default", "sidecar", "main", "touch", "/work/ready"); code != 0 {
		t.Fatalf("touch /work/ready: %d %q %q", code, out, stderr)
	}
	waitPod(t, cp, "default", "sidecar", "Ready with the sidecar ready", func(p *corev1.Pod) bool {
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue && proxy(p).Ready
	})

	// It ends: it runs again, though the pod's restartPolicy is Never.
	if out, stderr, code := execPodIn(t, cp, "default", "sidecar", "main", "touch", "/work/crash"); code != 0 {
		t.Fatalf("touch /work/crash: %d %q %q", code, out, stderr)
	}
	p = waitPod(t, cp, "default", "sidecar", "proxy running again", func(p *corev1.Pod) bool {
		s := proxy(p)
		return s.RestartCount == 1 && s.State.Running != nil && s.Started != nil && *s.Started
	})
	if l := proxy(p).LastTerminationState.Terminated; l == nil || l.ExitCode != 2 {
		t.Errorf("proxy's last run = %+v, want exit 2", l)
	}
	if s := p.Status.ContainerStatuses[0]; s.State.Running == nil || s.RestartCount != 0 {
		t.Errorf("main = %+v, want running on, never restarted", s)
	}

	// The node restarts: the sidecar carries on as it was.
	restartNode(t, cp, c.nodes["berth-inits"], "berth-inits")
	waitPod(t, cp, "default", "sidecar", "proxy and main running after the node's restart", func(p *corev1.Pod) bool {
		s := proxy(p)
		return s.RestartCount == 1 && s.State.Running != nil && p.Status.ContainerStatuses[0].State.Running != nil
	})

	// The container completes: the sidecar is stopped, the pod Succeeded.
	if out, stderr, code := execPodIn(t, cp, "default", "sidecar", "main", "touch", "/work/go"); code != 0 {
		t.Fatalf("touch /work/go: %d %q %q", code, out, stderr)
	}
	p = waitPod(t, cp, "default", "sidecar", "Succeeded with the sidecar stopped", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded && proxy(p).State.Terminated != nil
	})
	if s := proxy(p); s.State.Terminated.ExitCode != 0 || s.RestartCount != 1 {
		t.Errorf("proxy = %+v, want ended by SIGTERM (exit 0) without another restart", s)
	}
	if got := containerLogs(t, cp, "default", "sidecar", "proxy"); got != "stopping\n" {
		t.Errorf("logs of proxy = %q, want its SIGTERM trap's line", got)
	}
	if got := containerLogs(t, cp, "default", "sidecar", "main"); got != "up\n" {
		t.Errorf("main read %q from /work/side, want the sidecar's first run's line", got)
	}
	if err := pods.Delete(ctx, "sidecar", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "sidecar")
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}
