package gateway

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// world is a leader's view the test sets by hand (the listers' indexers)
// over a fake API server that takes its writes; time is the test's.
type world struct {
	kube                *fake.Clientset
	pods, nodes, leases cache.Indexer
	l                   *lifecycle
	t0                  time.Time
}

func newWorld(t *testing.T, cfg LifecycleConfig, objs ...any) *world {
	t.Helper()
	w := &world{
		pods:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		nodes:  cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		leases: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		kube:   fake.NewClientset(),
		t0:     time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC),
	}
	for _, o := range objs {
		w.put(t, o)
	}
	w.l = newLifecycle(w.kube, ns, listersv1.NewPodLister(w.pods).Pods(ns), listersv1.NewNodeLister(w.nodes),
		coordlisters.NewLeaseLister(w.leases).Leases(nodeLeaseNamespace), cfg, types.OnNodeLostFail, slog.New(slog.DiscardHandler))
	return w
}

// put stores the object in the API server and in the leader's cache.
func (w *world) put(t *testing.T, o any) {
	t.Helper()
	ctx := t.Context()
	var err error
	switch o := o.(type) {
	case *corev1.Pod:
		if _, err = w.kube.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = w.kube.CoreV1().Pods(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
		_ = w.pods.Delete(o)
		_ = w.pods.Add(o)
	case *corev1.Node:
		if _, err = w.kube.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = w.kube.CoreV1().Nodes().Update(ctx, o, metav1.UpdateOptions{})
		}
		_ = w.nodes.Delete(o)
		_ = w.nodes.Add(o)
	case *coordinationv1.Lease:
		_ = w.leases.Delete(o)
		_ = w.leases.Add(o)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// sync copies what the leader wrote back into its cache, as its
// informers would.
func (w *world) sync(t *testing.T) {
	t.Helper()
	pods, err := w.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ps []any
	for i := range pods.Items {
		ps = append(ps, &pods.Items[i])
	}
	if err := w.pods.Replace(ps, ""); err != nil {
		t.Fatal(err)
	}
	nodes, err := w.kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ns []any
	for i := range nodes.Items {
		ns = append(ns, &nodes.Items[i])
	}
	if err := w.nodes.Replace(ns, ""); err != nil {
		t.Fatal(err)
	}
}

func (w *world) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := w.kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testPod(name, uid, nodeName string, phase corev1.PodPhase, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: ktypes.UID(uid),
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelOwner: "alice"}, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: nodeName, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: containerName, Image: "minimal"}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func berthNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{node.TaintKey: "true"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: node.TaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
}

func nodeLease(name string, renew time.Time) *coordinationv1.Lease {
	rt := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nodeLeaseNamespace},
		Spec: coordinationv1.LeaseSpec{RenewTime: &rt}}
}

// TestReap: an ended sandbox's pod is deleted once the leader has seen
// it ended for KeepEnded (its own clock), a running one never, and one
// reported lost under the fail policy stays until it is deleted.
func TestReap(t *testing.T) {
	w := newWorld(t, LifecycleConfig{KeepEnded: 5 * time.Minute, NodeLostAfter: 40 * time.Second},
		berthNode("berth-a"), nodeLease("berth-a", time.Unix(0, 0)),
		testPod("running", "u1", "berth-a", corev1.PodRunning, nil),
		testPod("failed", "u2", "berth-a", corev1.PodFailed, nil),
		testPod("succeeded", "u3", "berth-a", corev1.PodSucceeded, nil),
		testPod("lost", "u4", "berth-a", corev1.PodFailed, map[string]string{node.AnnotationLost: "node berth-a lost"}))
	ctx := t.Context()
	for _, at := range []time.Duration{0, 4 * time.Minute} {
		w.l.sweep(ctx, w.t0.Add(at))
		for _, name := range []string{"running", "failed", "succeeded", "lost"} {
			if w.pod(t, name) == nil {
				t.Fatalf("at +%s: pod %s deleted before its time", at, name)
			}
		}
	}
	// A pod that ended later is kept its own full time.
	w.put(t, testPod("later", "u5", "berth-a", corev1.PodFailed, nil))
	w.l.sweep(ctx, w.t0.Add(5*time.Minute))
	for name, want := range map[string]bool{"running": true, "failed": false, "succeeded": false, "lost": true, "later": true} {
		if got := w.pod(t, name) != nil; got != want {
			t.Errorf("at +5m: pod %s present = %v, want %v", name, got, want)
		}
	}
	w.sync(t)
	w.l.sweep(ctx, w.t0.Add(10*time.Minute))
	if w.pod(t, "later") != nil {
		t.Errorf("at +10m: pod later not deleted")
	}
	w.sync(t)
	w.l.sweep(ctx, w.t0.Add(11*time.Minute))
	if len(w.l.ended) != 0 {
		t.Errorf("ended pods still remembered once gone: %v", w.l.ended)
	}

	// KeepEnded 0: at the first sweep that sees it ended.
	w0 := newWorld(t, LifecycleConfig{NodeLostAfter: 40 * time.Second}, testPod("failed", "u6", "", corev1.PodFailed, nil))
	w0.l.sweep(ctx, w0.t0)
	if w0.pod(t, "failed") != nil {
		t.Errorf("keep-ended 0: ended pod not deleted at once")
	}
}

// TestNodeLost: a node whose Lease has not changed for NodeLostAfter on
// the leader's clock is tainted unreachable; its sandbox under fail is
// marked lost, its sandbox under recreate is made again (same name, no
// node, counted); a node whose Lease changes is never lost, and the taint
// goes once the lost node's Lease changes again.
func TestNodeLost(t *testing.T) {
	// The nodes' renew times are far from the leader's clock: only
	// changes count.
	skewed := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	readyB := berthNode("berth-b")
	readyB.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	w := newWorld(t, LifecycleConfig{KeepEnded: time.Hour, NodeLostAfter: 40 * time.Second},
		berthNode("berth-a"), readyB,
		nodeLease("berth-a", skewed), nodeLease("berth-b", skewed),
		testPod("fails", "u1", "berth-a", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostFail}),
		testPod("default", "u2", "berth-a", corev1.PodRunning, nil),
		testPod("remade", "u3", "berth-a", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostRecreate,
			node.AnnotationDeadline: "2026-12-02T17:00:00Z", AnnotationRecreated: "1"}),
		testPod("elsewhere", "u4", "berth-b", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostRecreate}),
		testPod("fromsnap", "u5", "berth-a", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostRecreate, node.AnnotationSnapshot: "snap1"}),
		testPod("fromcopy", "u6", "berth-a", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostRecreate, node.AnnotationSnapshot: "snap2"}))
	ctx := t.Context()
	// snap2 has a copy on berth-b (snapcopies.go); snap1 has none.
	rec := snapshotRecord{snap: types.Snapshot{ID: "snap2", Template: "minimal"}, node: "berth-a", copies: []string{"berth-b"}, settings: map[string]string{}}
	if _, err := w.kube.CoreV1().ConfigMaps(ns).Create(ctx, rec.configMap(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.l.sweep(ctx, w.t0)
	// berth-b renews every 10s; berth-a never again.
	for i := 1; i <= 4; i++ {
		w.put(t, nodeLease("berth-b", skewed.Add(time.Duration(i)*10*time.Second)))
		w.l.sweep(ctx, w.t0.Add(time.Duration(i)*10*time.Second))
	}
	// +40s: not more than NodeLostAfter yet.
	for _, name := range []string{"fails", "default", "remade"} {
		if p := w.pod(t, name); p == nil || p.UID == "" || p.Annotations[node.AnnotationLost] != "" || p.Spec.NodeName != "berth-a" {
			t.Fatalf("at +40s: pod %s = %+v, want untouched", name, p)
		}
	}
	w.put(t, nodeLease("berth-b", skewed.Add(50*time.Second)))
	w.l.sweep(ctx, w.t0.Add(41*time.Second))

	a, err := w.kube.CoreV1().Nodes().Get(ctx, "berth-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !unreachable(a) {
		t.Errorf("lost node taints = %+v, want %s:NoSchedule", a.Spec.Taints, corev1.TaintNodeUnreachable)
	}
	if b, _ := w.kube.CoreV1().Nodes().Get(ctx, "berth-b", metav1.GetOptions{}); unreachable(b) {
		t.Errorf("renewing node tainted: %+v", b.Spec.Taints)
	}
	// A sandbox from a snapshot with a copy on a Ready node is made
	// again there; one from a snapshot the lost node alone held is lost
	// even under recreate.
	if c := w.pod(t, "fromcopy"); c == nil || c.UID == "u6" || c.Spec.NodeName != "" || !slices.Equal(podNodes(c), []string{"berth-b"}) ||
		c.Annotations[node.AnnotationSnapshot] != "snap2" || c.Annotations[node.AnnotationLost] != "" {
		t.Errorf("pod from a snapshot with a copy = %+v (nodes %v), want made again for berth-b", c, podNodes(c))
	}
	for _, name := range []string{"fails", "default", "fromsnap"} {
		p := w.pod(t, name)
		if p == nil || p.Annotations[node.AnnotationLost] == "" || p.Annotations[AnnotationLostNode] != "berth-a" {
			t.Errorf("pod %s = %+v, want marked lost on berth-a", name, p)
			continue
		}
		if st := toSandbox(p); st.State != types.StateLost || st.Reason != p.Annotations[node.AnnotationLost] {
			t.Errorf("pod %s reads as %s (%q), want lost", name, st.State, st.Reason)
		}
	}
	r := w.pod(t, "remade")
	if r == nil || r.UID == "u3" || r.Spec.NodeName != "" || r.Annotations[AnnotationRecreated] != "2" || r.Annotations[AnnotationLostNode] != "berth-a" ||
		r.Annotations[node.AnnotationDeadline] != "2026-12-02T17:00:00Z" || r.Labels[LabelOwner] != "alice" || r.Annotations[node.AnnotationLost] != "" {
		t.Errorf("recreated pod = %+v", r)
	}
	if e := w.pod(t, "elsewhere"); e == nil || e.UID != "u4" || e.Spec.NodeName != "berth-b" {
		t.Errorf("pod on the renewing node = %+v, want untouched", e)
	}

	// A sweep that still sees the old pod in its cache does not make it
	// a third time, nor mark the marked ones again.
	w.l.sweep(ctx, w.t0.Add(42*time.Second))
	if r2 := w.pod(t, "remade"); r2 == nil || r2.Annotations[AnnotationRecreated] != "2" {
		t.Errorf("after a second sweep, recreated pod = %+v", r2)
	}

	// berth-a renews again: the taint goes.
	w.sync(t)
	w.put(t, nodeLease("berth-a", skewed.Add(time.Hour)))
	w.l.sweep(ctx, w.t0.Add(50*time.Second))
	if a, _ := w.kube.CoreV1().Nodes().Get(ctx, "berth-a", metav1.GetOptions{}); unreachable(a) || len(a.Spec.Taints) != 1 {
		t.Errorf("node back: taints = %+v, want only %s", a.Spec.Taints, node.TaintKey)
	}
}

// TestNewLeaderGrace: a leader that takes over counts a node's silence
// from when it first saw the Lease, and does not lift a taint it has not
// seen the Lease renew since.
func TestNewLeaderGrace(t *testing.T) {
	tainted := berthNode("berth-a")
	tainted.Spec.Taints = append(tainted.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule})
	w := newWorld(t, LifecycleConfig{NodeLostAfter: 40 * time.Second}, tainted, nodeLease("berth-a", time.Unix(0, 0)),
		testPod("p", "u1", "berth-a", corev1.PodRunning, nil))
	ctx := t.Context()
	w.l.sweep(ctx, w.t0)
	w.l.sweep(ctx, w.t0.Add(30*time.Second))
	if a, _ := w.kube.CoreV1().Nodes().Get(ctx, "berth-a", metav1.GetOptions{}); !unreachable(a) {
		t.Errorf("taint lifted without a renewal: %+v", a.Spec.Taints)
	}
	if p := w.pod(t, "p"); p.Annotations[node.AnnotationLost] != "" {
		t.Errorf("pod marked lost within the grace")
	}
	w.l.sweep(ctx, w.t0.Add(41*time.Second))
	if p := w.pod(t, "p"); p.Annotations[node.AnnotationLost] == "" {
		t.Errorf("pod not marked lost after the grace")
	}
}

// TestRemakeAfterLeaderStopped: a leader that stopped between deleting a
// lost node's pod and making it again left the pod to make in its record;
// the next leader makes it. A record whose pod was made again meanwhile,
// or is still there, is dropped without touching the pod.
func TestRemakeAfterLeaderStopped(t *testing.T) {
	ctx := t.Context()
	lost := testPod("gone", "u1", "berth-a", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostRecreate,
		node.AnnotationDeadline: "2026-12-02T17:00:00Z"})
	still := testPod("still", "u2", "berth-a", corev1.PodRunning, map[string]string{AnnotationOnNodeLost: types.OnNodeLostRecreate})
	again := testPod("again", "u3", "", corev1.PodPending, map[string]string{AnnotationRecreated: "1"})
	w := newWorld(t, LifecycleConfig{KeepEnded: time.Hour, NodeLostAfter: 40 * time.Second}, berthNode("berth-a"), berthNode("berth-b"), still, again)
	// What the stopped leader did: the records, and the delete of "gone".
	for _, rec := range []struct {
		pod *corev1.Pod
		uid string
	}{{lost, "u1"}, {still, "u2"}, {again, "u0"}} {
		if err := w.l.writeRemake(ctx, remade(rec.pod), ktypes.UID(rec.uid)); err != nil {
			t.Fatal(err)
		}
	}
	// The next leader's cache of the records.
	recs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	cms, err := w.kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelRemake + "=true"})
	if err != nil || len(cms.Items) != 3 {
		t.Fatalf("records = %+v, %v; want 3", cms, err)
	}
	for i := range cms.Items {
		_ = recs.Add(&cms.Items[i])
	}
	w.l.remakes = listersv1.NewConfigMapLister(recs).ConfigMaps(ns)
	w.l.sweep(ctx, w.t0)

	g := w.pod(t, "gone")
	if g == nil || g.Spec.NodeName != "" || g.Annotations[AnnotationRecreated] != "1" || g.Annotations[AnnotationLostNode] != "berth-a" ||
		g.Annotations[node.AnnotationDeadline] != "2026-12-02T17:00:00Z" || g.Labels[LabelOwner] != "alice" {
		t.Errorf("pod made from its record = %+v", g)
	}
	if s := w.pod(t, "still"); s == nil || s.UID != "u2" || s.Spec.NodeName != "berth-a" {
		t.Errorf("pod still there = %+v, want untouched", s)
	}
	if a := w.pod(t, "again"); a == nil || a.UID != "u3" || a.Annotations[AnnotationRecreated] != "1" {
		t.Errorf("pod made again before = %+v, want untouched", a)
	}
	if left, err := w.kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelRemake + "=true"}); err != nil || len(left.Items) != 0 {
		t.Errorf("records after the sweep = %+v, %v; want none", left, err)
	}
}
