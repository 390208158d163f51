// Package kube runs Berth nodes in a real Kubernetes cluster on loopback:
// etcd, kube-apiserver and kube-scheduler built from source
// (scripts/k8s-bins.sh), two `berth node` processes as two nodes, pods
// made and inspected through client-go. It needs root, like test/e2e.
package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/kube/gateway"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/test/harness"
)

var (
	bin harness.Binaries
	// grpcHealthBin is the static gRPC health server (./grpchealth) the
	// gRPC probe test puts in a pod's sandbox.
	grpcHealthBin string
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, &bin, func(b harness.Binaries) error {
		grpcHealthBin = filepath.Join(b.Dir, "grpchealth")
		cmd := exec.Command("go", "build", "-o", grpcHealthBin, "./grpchealth")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build grpchealth: %v\n%s", err, out)
		}
		return nil
	}))
}

// cluster is the control plane and two Berth nodes.
type cluster struct {
	cp    *controlPlane
	nodes map[string]*harness.Daemon
}

func startCluster(t *testing.T, names ...string) *cluster {
	t.Helper()
	return startClusterWith(t, nil, names...)
}

// startClusterWith starts the cluster with nodeArgs added to each node's
// flags.
func startClusterWith(t *testing.T, nodeArgs []string, names ...string) *cluster {
	t.Helper()
	harness.RequireHost(t)
	return joinNodes(t, startControlPlane(t), nodeArgs, names...)
}

// joinNodes starts a Berth node per name on cp, each with nodeArgs after
// its own flags, and waits until they are Ready.
func joinNodes(t *testing.T, cp *controlPlane, nodeArgs []string, names ...string) *cluster {
	t.Helper()
	c := &cluster{cp: cp, nodes: map[string]*harness.Daemon{}}
	for _, name := range names {
		args := []string{"--kubeconfig", cp.Kubeconfig, "--node-name", name,
			"--kubelet-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			"--tls-cert", cp.NodeCert, "--tls-key", cp.NodeKey, "--client-ca", cp.CA}
		c.nodes[name] = harness.StartNode(t, bin, append(args, nodeArgs...))
	}
	for _, name := range names {
		waitNode(t, cp, name, func(n *corev1.Node) bool { return nodeReady(n) == corev1.ConditionTrue })
	}
	return c
}

func nodeReady(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// waitNode watches the node until cond holds.
func waitNode(t *testing.T, cp *controlPlane, name string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var last *corev1.Node
	for ctx.Err() == nil {
		list, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			t.Fatalf("list nodes: %v", err)
		}
		if len(list.Items) == 1 && cond(&list.Items[0]) {
			return &list.Items[0]
		}
		w, err := cp.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("watch nodes: %v", err)
		}
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok {
				last = n
				if cond(n) {
					w.Stop()
					return n
				}
			}
		}
	}
	t.Fatalf("node %s: condition not reached; last: %+v", name, last)
	return nil
}

// waitPod watches the pod until cond holds and returns it.
func waitPod(t *testing.T, cp *controlPlane, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	var last *corev1.Pod
	for ctx.Err() == nil {
		list, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatalf("list pods: %v", err)
		}
		if len(list.Items) == 1 {
			last = &list.Items[0]
			if cond(last) {
				return last
			}
		}
		w, err := cp.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("watch pods: %v", err)
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted {
				last = p
				if cond(p) {
					w.Stop()
					return p
				}
			}
		}
	}
	t.Fatalf("pod %s/%s never %s; last status: %+v", ns, name, what, last)
	return nil
}

// waitPodGone watches until the pod is deleted from the API.
func waitPodGone(t *testing.T, cp *controlPlane, ns, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for ctx.Err() == nil {
		list, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatalf("list pods: %v", err)
		}
		if len(list.Items) == 0 {
			return
		}
		w, err := cp.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("watch pods: %v", err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return
			}
		}
	}
	t.Fatalf("pod %s/%s was not deleted", ns, name)
}

func phase(p corev1.PodPhase) func(*corev1.Pod) bool {
	return func(pod *corev1.Pod) bool { return pod.Status.Phase == p }
}

var sandboxToleration = corev1.Toleration{Key: node.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}

func sandboxPod(name string, cmd ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "berth-test"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Tolerations:   []corev1.Toleration{sandboxToleration},
			Containers: []corev1.Container{{
				Name: "main", Image: "minimal", Command: cmd,
				Env: []corev1.EnvVar{{Name: "GREETING", Value: "hello from kubernetes"}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
			}},
		},
	}
}

// waitNoSnapshots waits, on a watch, until the namespace holds no
// snapshot records (gateway.LabelSnapshot) but those in keep.
func waitNoSnapshots(t *testing.T, cp *controlPlane, ns string, keep ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cms := cp.Client.CoreV1().ConfigMaps(ns)
	opts := metav1.ListOptions{LabelSelector: gateway.LabelSnapshot}
	for ctx.Err() == nil {
		list, err := cms.List(ctx, opts)
		if err != nil {
			t.Fatalf("list snapshot records: %v", err)
		}
		left := map[string]bool{}
		for _, cm := range list.Items {
			if id := cm.Labels[gateway.LabelSnapshot]; !slices.Contains(keep, id) {
				left[id] = true
			}
		}
		if len(left) == 0 {
			return
		}
		w, err := cms.Watch(ctx, metav1.ListOptions{LabelSelector: gateway.LabelSnapshot, ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("watch snapshot records: %v", err)
		}
		for ev := range w.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type == watch.Deleted {
				delete(left, cm.Labels[gateway.LabelSnapshot])
				if len(left) == 0 {
					w.Stop()
					return
				}
			}
		}
	}
	t.Fatalf("snapshot records left in %s", ns)
}

// podSandboxes lists the live sandboxes of a pod on a node.
func podSandboxes(t *testing.T, d *harness.Daemon, uid string) []*client.Sandbox {
	t.Helper()
	sbs, err := d.Local.List(t.Context(), client.ListOptions{Labels: map[string]string{node.LabelPodUID: uid}})
	if err != nil {
		t.Fatalf("list sandboxes: %v", err)
	}
	var live []*client.Sandbox
	for _, sb := range sbs {
		if sb.State == client.StateReady || sb.State == client.StateCreating || sb.State == client.StatePaused {
			live = append(live, sb)
		}
	}
	return live
}

// execPod runs cmd in the pod through the API server (which proxies to
// the node's kubelet API), like kubectl exec.
func execPod(t *testing.T, cp *controlPlane, ns, name string, stdin string, cmd ...string) (string, string, int) {
	t.Helper()
	return execContainer(t, cp, ns, name, "main", stdin, cmd...)
}

// execPodIn runs cmd in container of pod ns/name.
func execPodIn(t *testing.T, cp *controlPlane, ns, name, container string, cmd ...string) (string, string, int) {
	t.Helper()
	return execContainer(t, cp, ns, name, container, "", cmd...)
}

func execContainer(t *testing.T, cp *controlPlane, ns, name, container, stdin string, cmd ...string) (string, string, int) {
	t.Helper()
	req := cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdin: stdin != "", Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cp.Config, "POST", req.URL())
	if err != nil {
		t.Fatalf("exec executor: %v", err)
	}
	var out, errOut bytes.Buffer
	opts := remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}
	if stdin != "" {
		opts.Stdin = strings.NewReader(stdin)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, opts)
	var ee utilexec.ExitError
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitStatus()
	}
	t.Fatalf("exec %v in %s/%s: %v (stderr %q)", cmd, ns, name, err, errOut.String())
	return "", "", -1
}

func podLogs(t *testing.T, cp *controlPlane, ns, name string) string {
	t.Helper()
	return containerLogs(t, cp, ns, name, "main")
}

// containerLogs is the log of one container of pod ns/name.
func containerLogs(t *testing.T, cp *controlPlane, ns, name, container string) string {
	t.Helper()
	rc, err := cp.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container}).Stream(t.Context())
	if err != nil {
		t.Fatalf("logs of %s/%s -c %s: %v", ns, name, container, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("logs of %s/%s -c %s: %v", ns, name, container, err)
	}
	return string(b)
}

// TestPods: the real scheduler places sandbox pods on the two Berth nodes
// (and nothing else there); a pod runs as a sandbox, reports Running, then
// Succeeded or Failed with its exit code; logs and exec go through the
// API server; pods survive a restart of their node; deletion destroys the
// sandbox and leaves nothing behind (the harness's leak checks).
func TestPods(t *testing.T) {
	c := startCluster(t, "berth-a", "berth-b")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")

	// The node as registered: tainted, with capacity.
	n := waitNode(t, cp, "berth-a", func(*corev1.Node) bool { return true })
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != node.TaintKey || n.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("node taints = %+v, want %s:NoSchedule", n.Spec.Taints, node.TaintKey)
	}
	if n.Status.Allocatable.Cpu().IsZero() || n.Status.Allocatable.Memory().IsZero() || n.Status.Allocatable.Pods().IsZero() {
		t.Errorf("node allocatable = %v", n.Status.Allocatable)
	}

	// Two long-running pods, one per node (anti-affinity on the host
	// name): the scheduler must use both Berth nodes.
	var long []*corev1.Pod
	for _, name := range []string{"long-1", "long-2"} {
		p := sandboxPod(name, "sh", "-c", `echo "$GREETING"; echo to-stderr >&2; while [ ! -e /tmp/finish ]; do sleep 0.1; done; echo finishing; exit "$(cat /tmp/finish)"`)
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "berth-test"}},
				TopologyKey:   "kubernetes.io/hostname",
			}},
		}}
		got, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		long = append(long, got)
	}
	// A pod without the toleration is not placed on a Berth node.
	plain := sandboxPod("untolerated", "true")
	plain.Spec.Tolerations = nil
	plain.Labels = nil
	if _, err := pods.Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	onNode, sandboxOf := map[string]string{}, map[string]string{}
	for _, p := range long {
		got := waitPod(t, cp, "default", p.Name, "Running", phase(corev1.PodRunning))
		if _, ok := c.nodes[got.Spec.NodeName]; !ok {
			t.Fatalf("pod %s on node %q, want a Berth node", p.Name, got.Spec.NodeName)
		}
		onNode[p.Name] = got.Spec.NodeName
		if cs := got.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running == nil {
			t.Errorf("pod %s container statuses = %+v, want one running", p.Name, cs)
		}
		if got.Status.PodIP == "" {
			t.Errorf("pod %s has no pod IP", p.Name)
		}
		if sbs := podSandboxes(t, c.nodes[got.Spec.NodeName], string(p.UID)); len(sbs) != 1 {
			t.Errorf("pod %s: %d live sandboxes on %s, want 1", p.Name, len(sbs), got.Spec.NodeName)
		} else if sandboxOf[p.Name] = sbs[0].ID; sbs[0].CPU != 0.25 || sbs[0].MemoryBytes != 128<<20 || sbs[0].Template != "minimal" {
			t.Errorf("pod %s sandbox = cpu %v memory %d template %s, want 0.25, 128 MiB, minimal", p.Name, sbs[0].CPU, sbs[0].MemoryBytes, sbs[0].Template)
		}
	}
	if onNode["long-1"] == onNode["long-2"] {
		t.Errorf("both pods on %s: want one per node", onNode["long-1"])
	}
	waitPod(t, cp, "default", "untolerated", "unschedulable", func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})

	// Exec through the API server: stdout, stdin, stderr and exit codes.
	if out, _, code := execPod(t, cp, "default", "long-1", "", "sh", "-c", "echo $((6*7))"); code != 0 || out != "42\n" {
		t.Errorf("exec = (%q, %d), want 42", out, code)
	}
	if out, _, code := execPod(t, cp, "default", "long-1", "piped through\n", "cat"); code != 0 || out != "piped through\n" {
		t.Errorf("exec cat = (%q, %d)", out, code)
	}
	if _, errOut, code := execPod(t, cp, "default", "long-2", "", "sh", "-c", "echo oops >&2; exit 7"); code != 7 || errOut != "oops\n" {
		t.Errorf("exec exit 7 = (stderr %q, code %d)", errOut, code)
	}

	// Logs through the API server, stdout and stderr (read apart, so two
	// lines printed at once may come in either order, as on any kubelet).
	if got := podLogs(t, cp, "default", "long-1"); got != "hello from kubernetes\nto-stderr\n" && got != "to-stderr\nhello from kubernetes\n" {
		t.Errorf("logs = %q", got)
	}

	// The node of long-1 restarts: the pod keeps its sandbox and its
	// process, and still answers exec.
	restarted := c.nodes[onNode["long-1"]]
	before := podSandboxes(t, restarted, string(long[0].UID))
	restartNode(t, cp, restarted, onNode["long-1"])
	if out, _, code := execPod(t, cp, "default", "long-1", "", "cat", "/tmp/.berth-pod/main.log"); code != 0 || !strings.Contains(out, "hello from kubernetes") {
		t.Errorf("exec after node restart = (%q, %d)", out, code)
	}
	after := podSandboxes(t, restarted, string(long[0].UID))
	if len(before) != 1 || len(after) != 1 || before[0].ID != after[0].ID {
		t.Errorf("sandboxes before restart %v, after %v: want the same one", ids(before), ids(after))
	}
	if p, err := pods.Get(ctx, "long-1", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod after node restart: %v, %v", phaseOf(p), err)
	}

	// The processes end: exit 0 is Succeeded, exit 3 Failed, each with
	// its exit code (long-1's across the node restart).
	for name, code := range map[string]string{"long-1": "0", "long-2": "3"} {
		if _, _, c := execPod(t, cp, "default", name, "", "sh", "-c", "echo "+code+" > /tmp/finish"); c != 0 {
			t.Fatalf("exec in %s = %d", name, c)
		}
	}
	done := waitPod(t, cp, "default", "long-1", "Succeeded", phase(corev1.PodSucceeded))
	if st := done.Status.ContainerStatuses[0].State.Terminated; st == nil || st.ExitCode != 0 || st.Reason != "Completed" {
		t.Errorf("long-1 terminated = %+v", st)
	}
	failed := waitPod(t, cp, "default", "long-2", "Failed", phase(corev1.PodFailed))
	if st := failed.Status.ContainerStatuses[0].State.Terminated; st == nil || st.ExitCode != 3 || st.Reason != "Error" {
		t.Errorf("long-2 terminated = %+v", st)
	}
	if got := podLogs(t, cp, "default", "long-2"); !strings.HasSuffix(got, "finishing\n") {
		t.Errorf("logs after exit = %q", got)
	}

	// A pod Berth cannot run fails with the reason, without a sandbox.
	bad := sandboxPod("bad-isolation", "true")
	bad.Annotations = map[string]string{node.AnnotationIsolation: "vm"}
	bad.Labels = nil
	if _, err := pods.Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	got := waitPod(t, cp, "default", "bad-isolation", "Failed", phase(corev1.PodFailed))
	if got.Status.Reason != "BerthInvalidPod" || !strings.Contains(got.Status.Message, node.AnnotationIsolation) {
		t.Errorf("bad pod status = %s: %s", got.Status.Reason, got.Status.Message)
	}

	// Deletion: the pods leave the API and their sandboxes are gone.
	for _, name := range []string{"long-1", "long-2", "bad-isolation", "untolerated"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	for _, name := range []string{"long-1", "long-2", "bad-isolation", "untolerated"} {
		waitPodGone(t, cp, "default", name)
	}
	// A pod that ended leaves the API first and its sandbox right after
	// (the node destroys it once the pod is gone): follow the sandbox's
	// events until it is destroyed.
	for _, p := range long {
		d := c.nodes[onNode[p.Name]]
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := d.Local.FollowEvents(fctx, sandboxOf[p.Name], func(client.Event) error { return nil })
		cancel()
		if err != nil {
			t.Errorf("pod %s deleted; its sandbox %s: %v", p.Name, sandboxOf[p.Name], err)
		}
		if sbs := podSandboxes(t, d, string(p.UID)); len(sbs) != 0 {
			t.Errorf("pod %s deleted, sandboxes left: %v", p.Name, ids(sbs))
		}
	}
	for _, d := range c.nodes {
		harness.AssertNoLeaks(t, d)
	}
}

// restartNode stops the node's process and starts it again, and returns
// once the new process has written the node's status (the kubelet API
// listens before that): a heartbeat after the stop.
func restartNode(t *testing.T, cp *controlPlane, d *harness.Daemon, name string) {
	t.Helper()
	d.Stop()
	stopped := time.Now()
	d.Start()
	waitNode(t, cp, name, func(n *corev1.Node) bool {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.Unix() > stopped.Unix() {
				return true
			}
		}
		return false
	})
}

func ids(sbs []*client.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

func phaseOf(p *corev1.Pod) corev1.PodPhase {
	if p == nil {
		return ""
	}
	return p.Status.Phase
}

// portForwardGet sends a GET of path to port of the pod through the API
// server's port-forward (which streams to the node's kubelet API), as
// kubectl port-forward and curl would, and returns the raw HTTP answer.
func portForwardGet(t *testing.T, cp *controlPlane, ns, name string, port int, path string) string {
	t.Helper()
	rt, upgrader, err := spdy.RoundTripperFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	req := cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("portforward")
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, "POST", req.URL())
	stop, ready := make(chan struct{}), make(chan struct{})
	var errOut bytes.Buffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	defer func() {
		close(stop)
		<-done
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward to %s/%s: %v (%s)", ns, name, err, errOut.String())
	case <-time.After(time.Minute):
		t.Fatalf("port-forward to %s/%s did not become ready", ns, name)
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports = %v, %v", ports, err)
	}
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0].Local))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: pod\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read through port-forward: %v (%s)", err, errOut.String())
	}
	return string(b)
}
