package kube

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRestarts: restartPolicy as the kubelet applies it. Under OnFailure a
// container that exits 1 is started again in the same sandbox: its
// restart count goes up, its last state is the run that ended, `kubectl
// logs --previous` gives that run's output and `kubectl logs` the new
// one's; a restart of the node keeps all that (read back from the
// sandbox). Under Never it is not restarted; under Always a container
// that exits 0 is, and backs off in CrashLoopBackOff.
func TestRestarts(t *testing.T) {
	// A short back-off: the test waits through it.
	c := startClusterWith(t, []string{"--restart-backoff", "2s", "--restart-backoff-max", "4s"}, "berth-restarts")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")

	// Each run counts itself in /tmp/runs (the sandbox outlives its
	// runs), prints its number and exits 1; from the second on, a run
	// first waits for /tmp/next-<n>, made by an exec.
	crash := sandboxPod("crash", "sh", "-c", `n=$(( $(cat /tmp/runs 2>/dev/null || echo 0) + 1 )); echo $n > /tmp/runs
echo "run $n"
if [ $n -ge 2 ]; then while [ ! -e /tmp/next-$n ]; do sleep 0.05; done; fi
exit 1`)
	crash.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	once := sandboxPod("once", "sh", "-c", "echo once; exit 1")
	always := sandboxPod("always", "sh", "-c", "echo ran")
	always.Spec.RestartPolicy = corev1.RestartPolicyAlways
	for _, p := range []*corev1.Pod{crash, once, always} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
	}

	// running waits until the crash pod's container runs after n restarts.
	running := func(n int32) *corev1.Pod {
		t.Helper()
		return waitPod(t, cp, "default", "crash", "running after restarts", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].RestartCount == n && cs[0].State.Running != nil
		})
	}
	logs := func(name string, previous bool) (string, error) {
		t.Helper()
		rc, err := pods.GetLogs(name, &corev1.PodLogOptions{Container: "main", Previous: previous}).Stream(ctx)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		return string(b), err
	}
	wantPrevious := func(name, want string) {
		t.Helper()
		if got, err := logs(name, true); err != nil || got != want {
			t.Errorf("logs --previous of %s = %q, %v; want %q", name, got, err, want)
		}
	}
	// firstLine follows the current log until its first line.
	firstLine := func(name string) string {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		rc, err := pods.GetLogs(name, &corev1.PodLogOptions{Container: "main", Follow: true}).Stream(fctx)
		if err != nil {
			t.Fatalf("logs -f %s: %v", name, err)
		}
		defer rc.Close()
		line, err := bufio.NewReader(rc).ReadString('\n')
		if err != nil {
			t.Fatalf("logs -f %s: %v (read %q)", name, err, line)
		}
		return line
	}

	// Run 1 exits 1 and is restarted at once.
	p := running(1)
	cs := p.Status.ContainerStatuses[0]
	if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 || lt.Reason != "Error" || lt.StartedAt.IsZero() || lt.FinishedAt.Before(&lt.StartedAt) {
		t.Errorf("last state after a restart = %+v, want run 1's: exit 1, Error, its times", lt)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("phase = %s, want Running", p.Status.Phase)
	}
	wantPrevious("crash", "run 1\n")
	if got := firstLine("crash"); got != "run 2\n" {
		t.Errorf("logs after a restart = %q, want run 2's", got)
	}
	// Still one sandbox: the container restarts in it.
	if sbs := podSandboxes(t, c.nodes["berth-restarts"], string(p.UID)); len(sbs) != 1 {
		t.Errorf("pod crash: %d live sandboxes, want 1", len(sbs))
	}

	// Run 2 exits 1: the second restart comes after the back-off.
	if _, _, code := execPod(t, cp, "default", "crash", "", "touch", "/tmp/next-2"); code != 0 {
		t.Fatalf("touch /tmp/next-2: %d", code)
	}
	running(2)
	wantPrevious("crash", "run 2\n")

	// The node restarts: the restart count and the previous log are read
	// back from the sandbox. The next restart counts on from them.
	restartNode(t, cp, c.nodes["berth-restarts"], "berth-restarts")
	wantPrevious("crash", "run 2\n")
	if _, _, code := execPod(t, cp, "default", "crash", "", "touch", "/tmp/next-3"); code != 0 {
		t.Fatalf("touch /tmp/next-3: %d", code)
	}
	p = running(3)
	wantPrevious("crash", "run 3\n")
	if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 {
		t.Errorf("last state after the node's restart = %+v, want exit 1", lt)
	}

	// Never: the container that exits 1 stays ended, the pod fails, and
	// there is no previous log.
	p = waitPod(t, cp, "default", "once", "Failed", phase(corev1.PodFailed))
	if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 1 {
		t.Errorf("once = %+v, want terminated with 1, no restart", cs)
	}
	if _, err := logs("once", true); !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), `previous terminated container "main" in pod "once" not found`) {
		t.Errorf("logs --previous of a container never restarted = %v, want the kubelet's bad request", err)
	}

	// Always: a container that exits 0 is restarted too, and while it
	// waits for the next run it is in CrashLoopBackOff with the run that
	// ended as its last state. The pod stays Running.
	p = waitPod(t, cp, "default", "always", "in CrashLoopBackOff", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CrashLoopBackOff"
	})
	if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 0 || lt.Reason != "Completed" {
		t.Errorf("always: last state in back-off = %+v, want exit 0, Completed", lt)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("always: phase = %s, want Running", p.Status.Phase)
	}
	wantPrevious("always", "ran\n")

	for _, name := range []string{"crash", "once", "always"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	for _, name := range []string{"crash", "once", "always"} {
		waitPodGone(t, cp, "default", name)
	}
}
