package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/gateway"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/test/harness"
)

// agent-sandbox's resources, as the test makes them.
var (
	crdsGVR      = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	asExt        = schema.GroupVersion{Group: "extensions.agents.x-k8s.io", Version: "v1beta1"}
	claimsGVR    = asExt.WithResource("sandboxclaims")
	poolsGVR     = asExt.WithResource("sandboxwarmpools")
	templatesGVR = asExt.WithResource("sandboxtemplates")
	sandboxesGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
)

// startAgentSandbox installs agent-sandbox on cp as an operator would:
// its CRDs, its controller with the extensions (claims, templates, warm
// pools), and kube-controller-manager's garbage collector, which deletes
// a claim's Sandbox and pod after the claim (by owner references). All
// come from scripts/k8s-bins.sh.
func startAgentSandbox(t *testing.T, cp *controlPlane) dynamic.Interface {
	t.Helper()
	bins := binDir(t)
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(bins, "agent-sandbox-crds", "*.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("agent-sandbox CRDs in %s: %v, %v", bins, files, err)
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crd := &unstructured.Unstructured{Object: obj}
		if _, err := dyn.Resource(crdsGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD %s: %v", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	for _, name := range names {
		waitObject(t, dyn.Resource(crdsGVR), name, "Established", func(u *unstructured.Unstructured) bool {
			return condition(u, "Established") == "True"
		})
	}
	start(t, "kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig, "--authorization-kubeconfig", cp.Kubeconfig,
		"--controllers", "garbagecollector", "--use-service-account-credentials=false",
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(freePort(t)))
	start(t, "agent-sandbox-controller", filepath.Join(bins, "agent-sandbox-controller"),
		"--kubeconfig", cp.Kubeconfig, "--extensions", "--leader-elect=false",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	return dyn
}

// condition is the status of the object's condition typ, "" without it.
func condition(u *unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

// waitObject watches the object until cond holds and returns it.
func waitObject(t *testing.T, r dynamic.ResourceInterface, name, what string, cond func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var last *unstructured.Unstructured
	for ctx.Err() == nil {
		list, err := r.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			t.Fatalf("list %s: %v", name, err)
		}
		if len(list.Items) == 1 && cond(&list.Items[0]) {
			return &list.Items[0]
		}
		w, err := r.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: list.GetResourceVersion()})
		if err != nil {
			t.Fatalf("watch %s: %v", name, err)
		}
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				last = u
				if cond(u) {
					w.Stop()
					return u
				}
			}
		}
	}
	t.Fatalf("%s: %s not reached; last: %v", name, what, last)
	return nil
}

// waitObjectGone watches until the object is deleted.
func waitObjectGone(t *testing.T, r dynamic.ResourceInterface, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		list, err := r.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			t.Fatalf("list %s: %v", name, err)
		}
		if len(list.Items) == 0 {
			return
		}
		w, err := r.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: list.GetResourceVersion()})
		if err != nil {
			t.Fatalf("watch %s: %v", name, err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return
			}
		}
	}
	t.Fatalf("%s not deleted", name)
}

// sandboxTemplate is an agent-sandbox SandboxTemplate of Berth's minimal
// template for Berth nodes, with the pod annotations ann.
func sandboxTemplate(ns, name string, ann map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": asExt.String(), "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"podTemplate": map[string]any{
			"metadata": map[string]any{"annotations": ann},
			"spec": map[string]any{
				"nodeSelector": map[string]any{node.TaintKey: "true"},
				"tolerations":  []any{map[string]any{"key": node.TaintKey, "operator": "Exists", "effect": "NoSchedule"}},
				"containers": []any{map[string]any{
					"name": "main", "image": "registry.example/team/minimal:1",
					"resources": map[string]any{"limits": map[string]any{"cpu": "250m", "memory": "128Mi"}},
				}},
			},
		}},
	}}
}

// warmPool is a SandboxWarmPool of the template, labelled for Berth's
// template minimal so the gateway makes claims of it.
func warmPool(ns, name, template string, replicas int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": asExt.String(), "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]any{gateway.LabelPoolTemplate: "minimal"}},
		"spec":     map[string]any{"replicas": replicas, "sandboxTemplateRef": map[string]any{"name": template}},
	}}
}

// TestGatewayClaims: with agent-sandbox installed (its CRDs and controller,
// built from sigs.k8s.io/agent-sandbox) and a SandboxWarmPool labelled for
// a Berth template, the gateway makes each sandbox through a SandboxClaim:
// agent-sandbox's controller makes the Sandbox and its pod, the scheduler
// places it on a Berth node, and the sandbox works through the gateway
// as any other (exec, env, timeout, list, other keys kept out, delete);
// a pool that keeps warm pods hands one over, and a create asking what a
// warm sandbox cannot take is refused naming the field and leaves no
// claim; deleting leaves nothing behind. A claim made without the gateway
// (as with kubectl) runs on a Berth node too.
func TestGatewayClaims(t *testing.T) {
	harness.RequireHost(t)
	cp := startControlPlane(t)
	dyn := startAgentSandbox(t, cp)
	c := joinNodes(t, cp, nil, "berth-a")
	d := c.nodes["berth-a"]
	ctx := t.Context()
	ns := gateway.DefaultNamespace
	const otherKey = "e2b_fedcba9876543210fedcba9876543210fedcba98"
	keys, cert := gatewaySetup(t, cp, map[string]testKey{"other": {secret: otherKey, quota: "{max_sandboxes: 1, max_memory: 256M}"}})
	templates := dyn.Resource(templatesGVR).Namespace(ns)
	pools := dyn.Resource(poolsGVR).Namespace(ns)
	claims := dyn.Resource(claimsGVR).Namespace(ns)
	pods := cp.Client.CoreV1().Pods(ns)
	if _, err := templates.Create(ctx, sandboxTemplate(ns, "berth-minimal", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Create(ctx, warmPool(ns, "minimal", "berth-minimal", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, cp, "gateway-a", keys, cert)

	// A create becomes a claim of the pool; the claim's pod (cold: named
	// by the claim) runs the sandbox with the create's settings and the
	// template's resources.
	sb, err := gw.Create(ctx, client.CreateRequest{Env: map[string]string{"GREETING": "claimed"}, Labels: map[string]string{"run": "claims"}, Timeout: "10m"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.State != client.StateReady || sb.Template != "minimal" || sb.CPU != 0.25 || sb.MemoryBytes != 128<<20 || sb.Labels["run"] != "claims" {
		t.Errorf("created = %+v", sb.Sandbox)
	}
	claim, err := claims.Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's SandboxClaim: %v", err)
	}
	if pool, _, _ := unstructured.NestedString(claim.Object, "spec", "warmPoolRef", "name"); pool != "minimal" || claim.GetLabels()[gateway.LabelOwner] != "tester" {
		t.Errorf("claim = pool %q, labels %v", pool, claim.GetLabels())
	}
	pod, err := pods.Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim's pod: %v", err)
	}
	if pod.Annotations[gateway.AnnotationSandboxID] != sb.ID || pod.Spec.NodeName != "berth-a" || len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].Kind != "Sandbox" {
		t.Errorf("pod %s: annotations %v, node %q, owners %v", pod.Name, pod.Annotations, pod.Spec.NodeName, pod.OwnerReferences)
	}
	live := podSandboxes(t, d, string(pod.UID))
	if len(live) != 1 || live[0].Env["GREETING"] != "claimed" || live[0].CPU != 0.25 {
		t.Fatalf("node sandboxes of the claim's pod: %+v", live)
	}
	var out bytes.Buffer
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", `echo "$GREETING"`}, Stdout: &out}); err != nil || code != 0 || out.String() != "claimed\n" {
		t.Errorf("exec through the gateway = %d, %v, %q", code, err, out.String())
	}

	// The timeout moves through the claim to the pod and the node's
	// sandbox.
	moved, err := gw.SetTimeout(ctx, sb.ID, 2*time.Hour)
	if err != nil {
		t.Fatalf("set timeout: %v", err)
	}
	want := moved.Deadline.UTC().Format(time.RFC3339)
	waitPod(t, cp, ns, pod.Name, "deadline moved", func(p *corev1.Pod) bool { return p.Annotations[node.AnnotationDeadline] == want })
	// The node's sandbox reports each deadline it is given; it is the
	// annotation's, or within the second after (the daemon takes a
	// timeout from now).
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = d.Local.FollowEvents(fctx, live[0].ID, func(ev client.Event) error {
		if ev.Type != client.EventTimeoutChanged {
			return nil
		}
		if got, err := d.Local.Get(fctx, live[0].ID); err == nil && !got.Deadline.Before(moved.Deadline) && got.Deadline.Before(moved.Deadline.Add(2*time.Second)) {
			return io.EOF
		}
		return nil
	})
	cancel()
	if !errors.Is(err, io.EOF) {
		t.Errorf("the node's sandbox did not take the deadline %v: %v", moved.Deadline, err)
	}

	// Listed for its key, unseen by another.
	if list, err := gw.List(ctx, client.ListOptions{Labels: map[string]string{"run": "claims"}}); err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Errorf("list = %v, %v", list, err)
	}
	other, err := client.New(gw.URL(), client.WithAPIKey(otherKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's get = %v, want not found", err)
	}

	// The other key's quota (one sandbox, 256 MiB) counts its claims, at
	// their template's memory: a second is refused and makes no claim.
	osb, err := other.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatalf("create within the quota: %v", err)
	}
	before, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Create(ctx, client.CreateRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-sandboxes 1") {
		t.Errorf("create past the quota = %v, want resource exhausted", err)
	}
	if after, err := claims.List(ctx, metav1.ListOptions{}); err != nil || len(after.Items) != len(before.Items) {
		t.Errorf("refused create left claims: %d before, %d after (%v)", len(before.Items), len(after.Items), err)
	}
	if err := other.Kill(ctx, osb.ID); err != nil {
		t.Fatal(err)
	}
	waitObjectGone(t, claims, osb.ID)
	waitPodGone(t, cp, ns, osb.ID)

	// What the pool's template sets cannot be asked of a claim.
	_, err = gw.Create(ctx, client.CreateRequest{CPU: 1})
	if e := (*errdefs.Error)(nil); !errors.As(err, &e) || e.Field != "cpu" {
		t.Errorf("create with cpu through a pool = %v, want a cpu field error", err)
	}

	// A pool that keeps a warm pod: it is handed over to the next create.
	if _, err := pools.Patch(ctx, "minimal", ktypes.MergePatchType, []byte(`{"spec":{"replicas":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	warm := waitWarmPod(t, cp, ns)
	// A replica started now knows of the warm pod's pool in its cache.
	gwB := startGateway(t, cp, "gateway-b", keys, cert)
	before, err = claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = gwB.Create(ctx, client.CreateRequest{Env: map[string]string{"A": "1"}})
	if e := (*errdefs.Error)(nil); !errors.As(err, &e) || e.Field != "env" {
		t.Errorf("create asking a warm pool for another environment = %v, want an env field error", err)
	}
	if after, err := claims.List(ctx, metav1.ListOptions{}); err != nil || len(after.Items) != len(before.Items) {
		t.Errorf("refused create left claims: %d before, %d after (%v)", len(before.Items), len(after.Items), err)
	}
	// Another network policy than the template's is the node's to apply
	// to the warm sandbox, and it holds before the create answers.
	handed, err := gwB.Create(ctx, client.CreateRequest{Labels: map[string]string{"run": "warm"},
		Network: &client.NetworkPolicy{Mode: "allow", Allow: []string{"198.51.100.0/24"}}})
	if err != nil {
		t.Fatalf("create from the warm pool: %v", err)
	}
	if pol, err := gwB.NetworkPolicy(ctx, handed.ID); err != nil || pol.Mode != "allow" || !slices.Equal(pol.Allow, []string{"198.51.100.0/24"}) {
		t.Errorf("handed-over sandbox's policy = %+v, %v; want the create's", pol, err)
	}
	wp, err := pods.Get(ctx, warm, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if wp.Annotations[gateway.AnnotationSandboxID] != handed.ID {
		t.Errorf("warm pod %s carries sandbox %q, want %s (handed over)", warm, wp.Annotations[gateway.AnnotationSandboxID], handed.ID)
	}
	out.Reset()
	if code, err := gwB.Sandbox(handed.ID).Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"warm"}, Stdout: &out}); err != nil || code != 0 || out.String() != "warm\n" {
		t.Errorf("exec in the handed-over sandbox = %d, %v, %q", code, err, out.String())
	}
	if got, err := gwB.Get(ctx, handed.ID); err != nil || got.State != client.StateReady || got.Labels["run"] != "warm" {
		t.Errorf("get handed-over sandbox = %+v, %v", got, err)
	}

	// A claim made without the gateway (kubectl) runs on a Berth node.
	direct := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": asExt.String(), "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "direct", "namespace": ns},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "minimal"}},
	}}
	if _, err := claims.Create(ctx, direct, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dc := waitObject(t, claims, "direct", "Ready", func(u *unstructured.Unstructured) bool { return condition(u, "Ready") == "True" })
	dname, _, _ := unstructured.NestedString(dc.Object, "status", "sandbox", "name")
	dpod := waitPod(t, cp, ns, dname, "running", phase(corev1.PodRunning))
	if stdout, _, code := execPod(t, cp, ns, dpod.Name, "", "echo", "direct"); code != 0 || stdout != "direct\n" {
		t.Errorf("kubectl exec in the direct claim's pod = %d, %q", code, stdout)
	}
	if list, err := gwB.List(ctx, client.ListOptions{}); err != nil || len(list) != 2 {
		t.Errorf("gateway lists %d sandboxes (%v), want its own 2", len(list), err)
	}

	// Deleting a sandbox deletes its claim; its Sandbox, pod and node
	// sandbox follow.
	var nodeIDs []string
	for _, id := range []string{sb.ID, handed.ID} {
		p, err := gwB.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		pname := pod.Name
		if id == handed.ID {
			pname = warm
		}
		nodeIDs = append(nodeIDs, nodeSandbox(t, cp, c, ns, pname))
		if err := gwB.Kill(ctx, p.ID); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		waitObjectGone(t, claims, id)
		waitPodGone(t, cp, ns, pname)
	}
	if err := claims.Delete(ctx, "direct", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, ns, dpod.Name)
	for _, id := range nodeIDs {
		destroyed(t, d, id)
	}
	// The cold sandbox's Sandbox was named by its claim; a warm one's by
	// its pool, as its pod.
	for _, name := range []string{sb.ID, warm} {
		if _, err := dyn.Resource(sandboxesGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Sandbox %s after its claim's delete: %v", name, err)
		}
	}
	if _, err := gw.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after delete = %v", err)
	}
	// The pool refills; scale it to none and nothing of Berth's is left.
	if _, err := pools.Patch(ctx, "minimal", ktypes.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNoPods(t, cp, ns)
	harness.AssertNoLeaks(t, d)
}

// waitWarmPod waits for a warm pool's pod (no sandbox yet) to run, Ready,
// and returns its name.
func waitWarmPod(t *testing.T, cp *controlPlane, ns string) string {
	t.Helper()
	list, w := watchPods(t, cp, ns)
	ready := func(p *corev1.Pod) bool {
		if p.Annotations[gateway.AnnotationSandboxID] != "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	}
	for i := range list.Items {
		if ready(&list.Items[i]) {
			return list.Items[i].Name
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("pod watch ended")
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted && ready(p) {
				return p.Name
			}
		case <-ctx.Done():
			t.Fatal("no warm pod ran")
		}
	}
}

// waitNoPods waits until the namespace has no pods.
func waitNoPods(t *testing.T, cp *controlPlane, ns string) {
	t.Helper()
	list, w := watchPods(t, cp, ns)
	left := map[string]bool{}
	for _, p := range list.Items {
		left[p.Name] = true
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for len(left) > 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("pod watch ended")
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod {
				if ev.Type == watch.Deleted {
					delete(left, p.Name)
				} else {
					left[p.Name] = true
				}
			}
		case <-ctx.Done():
			t.Fatalf("pods left: %v", left)
		}
	}
}
