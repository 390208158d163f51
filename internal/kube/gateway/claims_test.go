package gateway

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// claimCaches is a claimAPI over in-memory caches holding objs.
func claimCaches(t *testing.T, objs ...*unstructured.Unstructured) *claimAPI {
	t.Helper()
	idx := func(kind string) cache.Indexer {
		i := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		for _, o := range objs {
			if o.GetKind() == kind {
				if err := i.Add(o); err != nil {
					t.Fatal(err)
				}
			}
		}
		return i
	}
	return &claimAPI{ns: ns,
		claims:    cache.NewGenericLister(idx("SandboxClaim"), claimsGVR.GroupResource()).ByNamespace(ns),
		pools:     cache.NewGenericLister(idx("SandboxWarmPool"), poolsGVR.GroupResource()).ByNamespace(ns),
		templates: cache.NewGenericLister(idx("SandboxTemplate"), templatesGVR.GroupResource()).ByNamespace(ns)}
}

func object(kind, name string, labels map[string]any, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": agentSandboxGroupVersion.String(), "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": labels},
		"spec":     spec,
	}}
}

func poolObj(name, template string, replicas any, tpl string) *unstructured.Unstructured {
	spec := map[string]any{"sandboxTemplateRef": map[string]any{"name": tpl}}
	if replicas != nil {
		spec["replicas"] = replicas
	}
	return object("SandboxWarmPool", name, map[string]any{LabelPoolTemplate: template}, spec)
}

func templateObj(name string, ann map[string]any) *unstructured.Unstructured {
	return object("SandboxTemplate", name, nil, map[string]any{"podTemplate": map[string]any{
		"metadata": map[string]any{"annotations": ann},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "main", "image": "team/base:1"}}},
	}})
}

// TestClaimPool: the pool of a template is the first by name of those
// labelled for it; none, or a gateway without agent-sandbox, is "".
func TestClaimPool(t *testing.T) {
	c := claimCaches(t, poolObj("b", "base", nil, "t"), poolObj("a", "base", nil, "t"), poolObj("c", "other", nil, "t"))
	if got := c.pool("base"); got != "a" {
		t.Errorf("pool(base) = %q, want a", got)
	}
	if got := c.pool("minimal"); got != "" {
		t.Errorf("pool(minimal) = %q, want none", got)
	}
	if got := (*claimAPI)(nil).pool("base"); got != "" {
		t.Errorf("nil claims: pool = %q", got)
	}
}

// TestHandOver: a pool that keeps warm pods (replicas unset is
// agent-sandbox's default of 1) refuses, naming the field, a create
// stating other settings than its template's but for the network policy
// (which a node applies to a running sandbox); the same settings pass,
// and a pool of 0 replicas takes any.
func TestHandOver(t *testing.T) {
	c := claimCaches(t,
		poolObj("warm", "base", nil, "open"), poolObj("cold", "base", int64(0), "open"), poolObj("lost", "base", int64(2), "missing"),
		templateObj("open", map[string]any{node.AnnotationNetwork: "open", node.AnnotationUser: "user"}))
	pod := func(ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sb", Namespace: ns, Annotations: ann}}
	}
	for _, tc := range []struct {
		name, pool string
		ann        map[string]string
		field      string
		class      error
	}{
		{"same settings", "warm", map[string]string{node.AnnotationTemplate: "base", node.AnnotationNetwork: `{"mode":"open"}`, node.AnnotationUser: "user"}, "", nil},
		{"only the deadline", "warm", map[string]string{node.AnnotationDeadline: "2030-01-01T00:00:00Z"}, "", nil},
		// The claim's policy is applied to the warm pod by its node.
		{"network closed", "warm", map[string]string{node.AnnotationNetwork: "none"}, "", nil},
		{"env", "warm", map[string]string{node.AnnotationEnv: `{"A":"1"}`}, "env", errdefs.ErrInvalidArgument},
		{"another template", "warm", map[string]string{node.AnnotationTemplate: "minimal"}, "template", errdefs.ErrInvalidArgument},
		{"cold pool", "cold", map[string]string{node.AnnotationNetwork: "none", node.AnnotationEnv: `{"A":"1"}`}, "", nil},
		{"template missing", "lost", nil, "", errdefs.ErrFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.handOver(tc.pool, pod(tc.ann))
			if tc.class == nil {
				if err != nil {
					t.Fatalf("handOver = %v", err)
				}
				return
			}
			var e *errdefs.Error
			if !errors.Is(err, tc.class) || tc.field != "" && (!errors.As(err, &e) || e.Field != tc.field) {
				t.Fatalf("handOver = %v, want %v on field %q", err, tc.class, tc.field)
			}
		})
	}
}

// TestClaimFor: the claim carries the pod's labels, and its annotations
// with the sandbox's ID and owner and its network policy (none when the
// create names none) for the pod agent-sandbox makes.
func TestClaimFor(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sb1", Namespace: ns,
		Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelOwner: "alice"},
		Annotations: map[string]string{node.AnnotationTemplate: "base"}}}
	u := claimFor(pod, "pool")
	if u.GetName() != "sb1" || u.GetLabels()[LabelOwner] != "alice" {
		t.Errorf("claim metadata = %v", u.Object["metadata"])
	}
	ann, _, _ := unstructured.NestedStringMap(u.Object, "spec", "additionalPodMetadata", "annotations")
	// A create that names no policy states none: a warm pod does not keep
	// its template's.
	if ann[AnnotationSandboxID] != "sb1" || ann[AnnotationOwner] != "alice" || ann[node.AnnotationTemplate] != "base" || ann[node.AnnotationNetwork] != "none" {
		t.Errorf("pod annotations = %v", ann)
	}
	made := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pool-x1", Annotations: map[string]string{AnnotationSandboxID: "sb1", AnnotationOwner: "alice"}}}
	if sandboxID(made) != "sb1" || ownerOf(made) != "alice" || !claimed(made) {
		t.Errorf("claim's pod: id %q owner %q", sandboxID(made), ownerOf(made))
	}
	// A warm pool's pod not claimed yet is no sandbox; nor does an owner
	// annotation on some other pod count.
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pool-x2", Annotations: map[string]string{AnnotationOwner: "alice"}}}
	if sandboxID(other) != "" || ownerOf(other) != "" {
		t.Errorf("unclaimed pod: id %q owner %q", sandboxID(other), ownerOf(other))
	}
}
