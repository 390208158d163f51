package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// TestPausePod: the berth.dev/paused annotation on a pod made with
// kubectl pauses its sandbox (runc: a filesystem pause), and its removal
// resumes it. While paused the pod stays Running, its container waits
// with SandboxPaused and the node's daemon holds the sandbox paused; at
// resume the container the pause ended starts again as a restart (its
// previous run ended with 137) in the same sandbox, whose files were kept.
// A node restarted while the sandbox is paused takes it back paused, and
// the resume after it counts on from the restarts read back. On gVisor
// the pause keeps memory: the same process runs on after the resume.
func TestPausePod(t *testing.T) {
	c := startCluster(t, "berth-pause")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")
	// Each run records that it started (the file outlives the run) and
	// then sleeps.
	pod := sandboxPod("sleeper", "sh", "-c", "echo started >> /tmp/starts; exec sleep 100000")
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningAfter := func(n int32) *corev1.Pod {
		t.Helper()
		return waitPod(t, cp, "default", "sleeper", "running", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			st, _ := node.Paused(p)
			return len(cs) == 1 && cs[0].State.Running != nil && cs[0].RestartCount == n && st == ""
		})
	}
	p := runningAfter(0)
	sbs := podSandboxes(t, c.nodes["berth-pause"], string(p.UID))
	if len(sbs) != 1 {
		t.Fatalf("pod sandboxes: %v", ids(sbs))
	}
	sbID := sbs[0].ID
	annotate := func(v *string) {
		t.Helper()
		patch := `{"metadata":{"annotations":{"` + node.AnnotationPaused + `":null}}}`
		if v != nil {
			patch = `{"metadata":{"annotations":{"` + node.AnnotationPaused + `":"` + *v + `"}}}`
		}
		if _, err := pods.Patch(ctx, "sleeper", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("annotate: %v", err)
		}
	}
	pauseNow := func(v string) {
		t.Helper()
		annotate(&v)
		p := waitPod(t, cp, "default", "sleeper", "paused", func(p *corev1.Pod) bool {
			done, err := node.PauseStatus(p, v)
			return done && err == nil
		})
		if st, kind := node.Paused(p); st != "paused" || kind != "filesystem" {
			t.Errorf("paused pod: %s, %s", st, kind)
		}
		cs := p.Status.ContainerStatuses[0]
		if p.Status.Phase != corev1.PodRunning || cs.State.Waiting == nil || cs.State.Waiting.Reason != node.ReasonPaused || cs.Ready {
			t.Errorf("paused pod: %s, container %+v", p.Status.Phase, cs)
		}
		if got, err := c.nodes["berth-pause"].Local.Get(ctx, sbID); err != nil || got.State != client.StatePaused {
			t.Errorf("node sandbox while paused = %+v, %v", got, err)
		}
	}
	// started waits (in the sandbox, bounded) until n runs recorded that
	// they started: a run reported running may not have got to its echo.
	started := func(n int) {
		t.Helper()
		script := fmt.Sprintf(`i=0; while [ "$(grep -c started /tmp/starts 2>/dev/null)" != %d ]; do i=$((i+1)); [ $i -gt 2400 ] && exit 3; sleep 0.05; done`, n)
		out, errOut, code := execPod(t, cp, "default", "sleeper", "", "sh", "-c", script)
		if code != 0 {
			got, _, _ := execPod(t, cp, "default", "sleeper", "", "cat", "/tmp/starts")
			t.Fatalf("waiting for %d recorded runs: exit %d %q %q; /tmp/starts holds %q", n, code, out, errOut, got)
		}
	}

	started(1)
	pauseNow("first")
	annotate(nil)
	p = runningAfter(1)
	if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 137 {
		t.Errorf("last state after the resume = %+v, want ended with 137 by the pause", lt)
	}
	// The file was kept across the pause: the second run adds to it.
	started(2)
	if sbs := podSandboxes(t, c.nodes["berth-pause"], string(p.UID)); len(sbs) != 1 || sbs[0].ID != sbID {
		t.Errorf("after the resume the pod's sandboxes are %v, want %s", ids(sbs), sbID)
	}

	// Paused across a node restart, resumed after it.
	pauseNow("second")
	restartNode(t, cp, c.nodes["berth-pause"], "berth-pause")
	waitPod(t, cp, "default", "sleeper", "paused after the node's restart", func(p *corev1.Pod) bool {
		st, _ := node.Paused(p)
		return st == "paused"
	})
	annotate(nil)
	runningAfter(2)
	started(3)
	if err := pods.Delete(ctx, "sleeper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "sleeper")

	// On gVisor a pause keeps memory: the container's process is the same
	// after the resume (no restart) and counts on from where it was.
	// It also answers a ping (/tmp/ping appearing) with a token it holds
	// in memory only, drawn at its start: a process started again would
	// answer another.
	counter := sandboxPod("counter", "sh", "-c", `tok=$(od -An -N8 -tx8 /dev/urandom | tr -d ' '); i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new && mv /tmp/count.new /tmp/count; if [ -e /tmp/ping ]; then echo $tok > /tmp/pong.new && mv /tmp/pong.new /tmp/pong && rm -f /tmp/ping; fi; sleep 0.05; done`)
	counter.Annotations = map[string]string{node.AnnotationIsolation: "gvisor"}
	if _, err := pods.Create(ctx, counter, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPod(t, cp, "default", "counter", "running", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Running != nil
	})
	// count waits (in the sandbox, bounded) until the count passes n and
	// returns it.
	count := func(n int) int {
		t.Helper()
		script := fmt.Sprintf(`i=0; while :; do c=$(cat /tmp/count 2>/dev/null || echo 0); [ "$c" -gt %d ] && { echo $c; exit 0; }; i=$((i+1)); [ $i -gt 2400 ] && exit 3; sleep 0.05; done`, n)
		out, errOut, code := execPod(t, cp, "default", "counter", "", "sh", "-c", script)
		var c int
		if _, err := fmt.Sscan(out, &c); code != 0 || err != nil {
			t.Fatalf("count past %d: exit %d %q %q", n, code, out, errOut)
		}
		return c
	}
	before := count(0)
	csb := podSandboxes(t, c.nodes["berth-pause"], string(p.UID))
	if len(csb) != 1 {
		t.Fatalf("counter sandboxes: %v", ids(csb))
	}
	// pid is the container process's pid in the sandbox (its agent's
	// process list, by the node's tag).
	pid := func() uint32 {
		t.Helper()
		procs, err := c.nodes["berth-pause"].Local.Sandbox(csb[0].ID).Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, pr := range procs {
			if pr.Tag == "berth-pod/main" {
				return pr.PID
			}
		}
		t.Fatalf("no process of container main in %+v", procs)
		return 0
	}
	pidBefore := pid()
	v := "gvisor"
	patch := `{"metadata":{"annotations":{"` + node.AnnotationPaused + `":"` + v + `"}}}`
	if _, err := pods.Patch(ctx, "counter", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPod(t, cp, "default", "counter", "paused", func(p *corev1.Pod) bool {
		done, err := node.PauseStatus(p, v)
		return done && err == nil
	})
	if st, kind := node.Paused(p); st != "paused" || kind != "memory" {
		t.Errorf("paused gVisor pod: %s, %s; want paused, memory", st, kind)
	}
	patch = `{"metadata":{"annotations":{"` + node.AnnotationPaused + `":null}}}`
	if _, err := pods.Patch(ctx, "counter", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPod(t, cp, "default", "counter", "resumed", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		st, _ := node.Paused(p)
		return st == "" && len(cs) == 1 && cs[0].State.Running != nil
	})
	if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
		t.Errorf("restart count after a memory pause = %d, want 0 (the same process)", rc)
	}
	if got := pid(); got != pidBefore {
		t.Errorf("container process after the resume is pid %d, was %d: not the same process", got, pidBefore)
	}
	// It counts on from where it was.
	count(before)

	// A pod made from a memory snapshot of its sandbox (the
	// berth.dev/snapshot annotation, as the gateway makes such pods)
	// carries on in the snapshot's process: its container runs with no
	// restart, and the process answers with the token it drew before the
	// snapshot.
	ping := func(pod string) string {
		t.Helper()
		script := `touch /tmp/ping; i=0; while [ ! -e /tmp/pong ]; do i=$((i+1)); [ $i -gt 2400 ] && exit 3; sleep 0.05; done; cat /tmp/pong; rm /tmp/pong`
		out, errOut, code := execPod(t, cp, "default", pod, "", "sh", "-c", script)
		if code != 0 || out == "" {
			t.Fatalf("ping %s: exit %d %q %q", pod, code, out, errOut)
		}
		return out
	}
	tok := ping("counter")
	d := c.nodes["berth-pause"]
	snap, err := d.Local.Snapshot(ctx, csb[0].ID, "")
	if err != nil || snap.Kind != client.SnapshotMemory {
		t.Fatalf("memory snapshot of the counter = %+v, %v", snap, err)
	}
	cc := sandboxPod("counter-copy", counter.Spec.Containers[0].Command...)
	cc.Annotations = map[string]string{node.AnnotationIsolation: "gvisor", node.AnnotationSnapshot: snap.ID}
	if _, err := pods.Create(ctx, cc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPod(t, cp, "default", "counter-copy", "running", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Running != nil
	})
	if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
		t.Errorf("restart count of the copy = %d, want 0", rc)
	}
	if got := ping("counter-copy"); got != tok {
		t.Errorf("the copy answers %q, the counter answered %q: the copy's process is not the snapshot's", got, tok)
	}
	copies := podSandboxes(t, d, string(p.UID))
	if len(copies) != 1 || copies[0].ID == csb[0].ID {
		t.Fatalf("copy's sandboxes: %v", ids(copies))
	}
	for _, name := range []string{"counter-copy", "counter"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, cp, "default", name)
	}
	// Once the copy's sandbox has ended, nothing sits on the snapshot.
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = d.Local.FollowEvents(fctx, copies[0].ID, func(client.Event) error { return nil })
	cancel()
	if err != nil {
		t.Fatalf("copy's sandbox after delete: %v", err)
	}
	if err := d.Local.RemoveSnapshot(ctx, snap.ID); err != nil {
		t.Errorf("remove the snapshot: %v", err)
	}
}

// TestPausedPodGivesRoom: with the real scheduler, a paused pod gives its
// node's room back: the node's allocatable CPU grows by the paused pod's
// request and a pod that would not fit beside it runs. The paused pod's
// resume then finds no room and waits, refused with resource_exhausted
// and still paused; once the other pod is gone it resumes on its own.
func TestPausedPodGivesRoom(t *testing.T) {
	c := startCluster(t, "berth-room")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")
	n := waitNode(t, cp, "berth-room", func(*corev1.Node) bool { return true })
	alloc := n.Status.Allocatable.Cpu().MilliValue()
	// Two pods of three quarters of the node each: one fits, not both.
	big := func(name string) *corev1.Pod {
		pod := sandboxPod(name, "sh", "-c", "exec sleep 100000")
		q := *resource.NewMilliQuantity(alloc*3/4, resource.DecimalSI)
		pod.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = q
		pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q}
		return pod
	}
	running := func(name string) *corev1.Pod {
		t.Helper()
		return waitPod(t, cp, "default", name, "running", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			st, _ := node.Paused(p)
			return len(cs) == 1 && cs[0].State.Running != nil && st == ""
		})
	}
	annotate := func(v string) {
		t.Helper()
		val := `"` + v + `"`
		if v == "" {
			val = "null"
		}
		patch := `{"metadata":{"annotations":{"` + node.AnnotationPaused + `":` + val + `}}}`
		if _, err := pods.Patch(ctx, "parked", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("annotate: %v", err)
		}
	}
	allocatable := func(want int64) {
		t.Helper()
		waitNode(t, cp, "berth-room", func(n *corev1.Node) bool { return n.Status.Allocatable.Cpu().MilliValue() == want })
	}

	if _, err := pods.Create(ctx, big("parked"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	parked := running("parked")
	sbs := podSandboxes(t, c.nodes["berth-room"], string(parked.UID))
	if len(sbs) != 1 {
		t.Fatalf("parked's sandboxes: %v", ids(sbs))
	}
	annotate("overnight")
	waitPod(t, cp, "default", "parked", "paused", func(p *corev1.Pod) bool {
		done, err := node.PauseStatus(p, "overnight")
		return done && err == nil
	})
	allocatable(alloc + alloc*3/4)

	if _, err := pods.Create(ctx, big("taker"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	taker := running("taker")
	if taker.Spec.NodeName != "berth-room" {
		t.Fatalf("taker runs on %q", taker.Spec.NodeName)
	}

	annotate("")
	p := waitPod(t, cp, "default", "parked", "resume refused", func(p *corev1.Pod) bool {
		done, err := node.PauseStatus(p, "")
		return done && err != nil
	})
	if _, err := node.PauseStatus(p, ""); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "no room to resume") {
		t.Errorf("resume without room: %v", err)
	}
	if got, err := c.nodes["berth-room"].Local.Get(ctx, sbs[0].ID); err != nil || got.State != client.StatePaused {
		t.Errorf("parked's sandbox while its resume waits = %+v, %v", got, err)
	}

	if err := pods.Delete(ctx, "taker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	running("parked")
	allocatable(alloc)
	if got, err := c.nodes["berth-room"].Local.Get(ctx, sbs[0].ID); err != nil || got.State != client.StateReady {
		t.Errorf("parked's sandbox after the resume = %+v, %v", got, err)
	}
	if err := pods.Delete(ctx, "parked", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "parked")
}
