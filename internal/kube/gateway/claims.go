package gateway

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// A sandbox is made one of two ways. Without agent-sandbox
// (sigs.k8s.io/agent-sandbox) the gateway makes its pod itself, named by
// the sandbox ID. Where agent-sandbox's CRDs are installed and a
// SandboxWarmPool in the gateway's namespace carries the label
// LabelPoolTemplate=<template>, a create of that template becomes a
// SandboxClaim of that pool instead, named by the sandbox ID; agent-sandbox's
// controller makes (or hands over from the pool) the Sandbox and its pod, and
// the pod carries the gateway's annotations through the claim's
// additionalPodMetadata. Such a pod is found by AnnotationSandboxID, as its
// name is the pool's when it came warm.

// Annotations and labels of the claim way.
const (
	// AnnotationSandboxID is the sandbox ID of a pod made through a
	// SandboxClaim (the claim's name).
	AnnotationSandboxID = "berth.dev/sandbox-id"
	// AnnotationOwner is LabelOwner on such a pod: agent-sandbox lets a
	// claim add labels only of domains its operator allowed.
	AnnotationOwner = "berth.dev/owner"
	// LabelPoolTemplate on a SandboxWarmPool names the Berth template its
	// SandboxTemplate's pods run.
	LabelPoolTemplate = "berth.dev/template"
	// labelClaimUID is the label agent-sandbox puts on a claim's pod.
	labelClaimUID = "agents.x-k8s.io/claim-uid"
)

// agent-sandbox's resources.
var (
	agentSandboxGroupVersion = schema.GroupVersion{Group: "extensions.agents.x-k8s.io", Version: "v1beta1"}
	claimsGVR                = agentSandboxGroupVersion.WithResource("sandboxclaims")
	poolsGVR                 = agentSandboxGroupVersion.WithResource("sandboxwarmpools")
	templatesGVR             = agentSandboxGroupVersion.WithResource("sandboxtemplates")
)

// Claims modes (Config.Claims).
const (
	ClaimsAuto = "auto"
	ClaimsOff  = "off"
)

// claimFatal are the Ready=False reasons of a claim that no retry mends.
var claimFatal = []string{"TemplateNotFound", "WarmPoolNotFound", "InvalidMetadata", "EnvVarsInjectionRejected"}

// claimAPI is the gateway's view of agent-sandbox's claims and pools.
type claimAPI struct {
	client    dynamic.Interface
	ns        string
	claims    cache.GenericNamespaceLister
	pools     cache.GenericNamespaceLister
	templates cache.GenericNamespaceLister
	factory   dynamicinformer.DynamicSharedInformerFactory
}

// agentSandboxInstalled asks the API server whether agent-sandbox's
// extension API is served.
func agentSandboxInstalled(cfg Config) (bool, error) {
	_, err := cfg.Kube.Discovery().ServerResourcesForGroupVersion(agentSandboxGroupVersion.String())
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("ask the API server for %s: %w", agentSandboxGroupVersion, err)
}

// newClaimAPI sets up the claim and pool informers; wake is called with a
// claim's name when it changes.
func newClaimAPI(client dynamic.Interface, ns string, wake func(string)) (*claimAPI, error) {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 0, ns, nil)
	ci, pi, ti := f.ForResource(claimsGVR), f.ForResource(poolsGVR), f.ForResource(templatesGVR)
	on := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			wake(u.GetName())
		}
	}
	if _, err := ci.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: on, UpdateFunc: func(_, obj any) { on(obj) }, DeleteFunc: on,
	}); err != nil {
		return nil, err
	}
	// Registered before the factory starts.
	_, _ = pi.Informer(), ti.Informer()
	return &claimAPI{client: client, ns: ns, factory: f, claims: ci.Lister().ByNamespace(ns),
		pools: pi.Lister().ByNamespace(ns), templates: ti.Lister().ByNamespace(ns)}, nil
}

// pool is the SandboxWarmPool of the template, the first by name of those
// labelled for it; "" when there is none.
func (c *claimAPI) pool(template string) string {
	if c == nil {
		return ""
	}
	objs, err := c.pools.List(labels.SelectorFromSet(labels.Set{LabelPoolTemplate: template}))
	if err != nil || len(objs) == 0 {
		return ""
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok && u.GetDeletionTimestamp() == nil {
			names = append(names, u.GetName())
		}
	}
	if len(names) == 0 {
		return ""
	}
	return slices.Min(names)
}

// handOver refuses, naming the field, a create whose settings a warm
// sandbox of pool could not take: a pool that keeps warm pods (replicas
// above 0) may hand one over, made with its SandboxTemplate's settings,
// and a running sandbox's template, isolation, environment, user and sudo
// cannot change (its node would fail the pod). Its network policy can:
// the claim states it (claimFor) and its node applies it before the
// create answers (createClaim). A pool of no replicas makes each claim's
// pod cold, with the claim's settings.
func (c *claimAPI) handOver(pool string, pod *corev1.Pod) error {
	obj, err := c.pools.Get(pool)
	if err != nil {
		return fmt.Errorf("SandboxWarmPool %s: %w", pool, errdefs.ErrUnavailable)
	}
	p := obj.(*unstructured.Unstructured)
	replicas, found, _ := unstructured.NestedInt64(p.Object, "spec", "replicas")
	if found && replicas == 0 {
		return nil
	}
	tname, _, _ := unstructured.NestedString(p.Object, "spec", "sandboxTemplateRef", "name")
	tobj, err := c.templates.Get(tname)
	if err != nil {
		return fmt.Errorf("SandboxWarmPool %s: its SandboxTemplate %q is not there: %w", pool, tname, errdefs.ErrFailedPrecondition)
	}
	var warm corev1.Pod
	t := tobj.(*unstructured.Unstructured)
	spec, _, _ := unstructured.NestedMap(t.Object, "spec", "podTemplate", "spec")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &warm.Spec); err != nil {
		return fmt.Errorf("SandboxTemplate %s: pod spec: %v: %w", tname, err, errdefs.ErrFailedPrecondition)
	}
	warm.Annotations, _, _ = unstructured.NestedStringMap(t.Object, "spec", "podTemplate", "metadata", "annotations")
	warm.Name, warm.Namespace, warm.UID = "warm", c.ns, "warm"
	claimed := warm.DeepCopy()
	if claimed.Annotations == nil {
		claimed.Annotations = map[string]string{}
	}
	maps.Copy(claimed.Annotations, pod.Annotations)
	diff, err := node.SettingsChange(&warm, claimed)
	if err != nil {
		return fmt.Errorf("SandboxTemplate %s makes pods a Berth node cannot run: %v: %w", tname, err, errdefs.ErrFailedPrecondition)
	}
	diff = slices.DeleteFunc(diff, func(s string) bool { return s == "network" })
	if len(diff) > 0 {
		return fieldErr(diff[0], errdefs.ErrInvalidArgument,
			"%s: SandboxWarmPool %q keeps warm sandboxes made with its SandboxTemplate %q, and a claim cannot change a running sandbox's %s; "+
				"ask for what the template states, or use a pool of 0 replicas (each claim then made cold)", diff[0], pool, tname, strings.Join(diff, ", "))
	}
	return nil
}

// claimFor is the SandboxClaim that makes pod's sandbox from pool: the
// pod's labels go on the claim, its annotations (and the sandbox's ID and
// owner) onto the pod agent-sandbox makes.
func claimFor(pod *corev1.Pod, pool string) *unstructured.Unstructured {
	// The policy is always stated: a warm pod handed over keeps its
	// template's otherwise, and a create that names none means none.
	ann := map[string]any{AnnotationSandboxID: pod.Name, node.AnnotationNetwork: claimNetwork(pod)}
	for k, v := range pod.Annotations {
		ann[k] = v
	}
	if o := pod.Labels[LabelOwner]; o != "" {
		ann[AnnotationOwner] = o
	}
	lbl := map[string]any{}
	for k, v := range pod.Labels {
		lbl[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": agentSandboxGroupVersion.String(),
		"kind":       "SandboxClaim",
		"metadata":   map[string]any{"name": pod.Name, "namespace": pod.Namespace, "labels": lbl},
		"spec": map[string]any{
			"warmPoolRef":           map[string]any{"name": pool},
			"additionalPodMetadata": map[string]any{"annotations": ann},
		},
	}}
}

// failed is why the claim id cannot be met (a fatal Ready=False reason),
// nil while it can.
func (c *claimAPI) failed(id string) error {
	if c == nil {
		return nil
	}
	obj, err := c.claims.Get(id)
	if err != nil {
		return nil // not in the cache yet, or gone (the pod wait sees that)
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != "Ready" || m["status"] != "False" {
			continue
		}
		reason, _ := m["reason"].(string)
		if slices.Contains(claimFatal, reason) {
			msg, _ := m["message"].(string)
			return fmt.Errorf("sandbox %s: its SandboxClaim cannot be met: %s: %s: %w", id, reason, msg, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// delete deletes the claim of a pod made through one; agent-sandbox's
// Sandbox and the pod follow by their owner references. The claim's UID
// (on the pod) is a precondition when known.
func (c *claimAPI) delete(ctx context.Context, pod *corev1.Pod) error {
	if c == nil {
		return noClaims(sandboxID(pod))
	}
	opts := metav1.DeleteOptions{}
	if uid := ktypes.UID(pod.Labels[labelClaimUID]); uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	id := sandboxID(pod)
	if err := c.client.Resource(claimsGVR).Namespace(c.ns).Delete(ctx, id, opts); err != nil {
		return kubeErr("delete the SandboxClaim of sandbox "+id, err)
	}
	return nil
}

// setAnnotation sets one annotation on the pod of the claim id, through
// the claim (agent-sandbox keeps the pod's propagated annotations as the
// claim says).
func (c *claimAPI) setAnnotation(ctx context.Context, id, key, value string) error {
	if c == nil {
		return noClaims(id)
	}
	patch := fmt.Appendf(nil, `{"spec":{"additionalPodMetadata":{"annotations":{%q:%q}}}}`, key, value)
	if _, err := c.client.Resource(claimsGVR).Namespace(c.ns).Patch(ctx, id, ktypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return kubeErr("update the SandboxClaim of sandbox "+id, err)
	}
	return nil
}

// noClaims is the error for a sandbox made through a SandboxClaim on a
// gateway that does not serve agent-sandbox (--sandbox-claims off).
func noClaims(id string) error {
	return fmt.Errorf("sandbox %s was made through a SandboxClaim, and this gateway does not serve agent-sandbox's API (--sandbox-claims): %w", id, errdefs.ErrFailedPrecondition)
}

// sandboxID is the sandbox ID of a gateway's pod: its AnnotationSandboxID
// when made through a claim, else its name when the gateway made it; ""
// for any other pod (a warm pool's, not claimed yet).
func sandboxID(pod *corev1.Pod) string {
	if id := pod.Annotations[AnnotationSandboxID]; id != "" {
		return id
	}
	if pod.Labels[LabelManagedBy] == ManagedBy {
		return pod.Name
	}
	return ""
}

// ownerOf is the ID of the API key that made the pod's sandbox.
func ownerOf(pod *corev1.Pod) string {
	if o := pod.Labels[LabelOwner]; o != "" {
		return o
	}
	if pod.Annotations[AnnotationSandboxID] != "" {
		return pod.Annotations[AnnotationOwner]
	}
	return ""
}

// claimed reports whether the pod was made through a SandboxClaim.
func claimed(pod *corev1.Pod) bool { return pod.Annotations[AnnotationSandboxID] != "" }

// indexSandboxID indexes pods by sandboxID.
func indexSandboxID(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if id := sandboxID(pod); id != "" {
		return []string{id}, nil
	}
	return nil, nil
}

// bySandboxID is the pod informer's index of indexSandboxID.
const bySandboxID = "sandbox-id"

// podByID is the sandbox id's pod from the cache: of several (a pod
// being replaced), the one not being deleted, else the newest.
func (g *Gateway) podByID(id string) (*corev1.Pod, error) {
	objs, err := g.podIndex.ByIndex(bySandboxID, id)
	if err != nil {
		return nil, err
	}
	var best *corev1.Pod
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if ok && pod.Namespace == g.cfg.Namespace && (best == nil || preferred(pod, best)) {
			best = pod
		}
	}
	if best == nil {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), id)
	}
	return best, nil
}

// requestPod is podByID for a caller's request, which must see what
// another gateway replica did a moment ago even when this replica's watch
// has not brought it yet (a client that creates through one replica and
// reads or execs through the next, behind one load balancer): a sandbox
// the cache does not have is read from the API server by its pod's name,
// and one the cache shows creating is read again there (its node may have
// reported it running already). One GET, on those paths only. A sandbox
// of agent-sandbox's claims, whose pod is not named by its ID, is found
// once this replica's cache has it. fresh says the pod was read from the
// API server just now, so a caller that wants the sandbox's state as of
// now need not read it again.
func (g *Gateway) requestPod(ctx context.Context, id string) (pod *corev1.Pod, fresh bool, err error) {
	pod, err = g.podByID(id)
	switch {
	case err == nil && state(pod) == apitypes.StateCreating:
		if got, ferr := g.fresh(ctx, pod); ferr == nil && got != pod {
			return got, true, nil
		}
		return pod, false, nil
	case !apierrors.IsNotFound(err):
		return pod, false, err
	}
	got, gerr := g.cfg.Kube.CoreV1().Pods(g.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(gerr):
		return nil, false, err
	case gerr != nil:
		return nil, false, kubeErr("read sandbox "+id, gerr)
	case sandboxID(got) != id:
		return nil, false, err
	}
	return got, true, nil
}

// preferred reports whether a is the pod to answer for a sandbox rather
// than b: one not being deleted, else the newer.
func preferred(a, b *corev1.Pod) bool {
	if ad, bd := a.DeletionTimestamp != nil, b.DeletionTimestamp != nil; ad != bd {
		return !ad
	}
	return b.CreationTimestamp.Before(&a.CreationTimestamp)
}

// sandboxPods is every sandbox's pod in the cache.
func (g *Gateway) sandboxPods() ([]*corev1.Pod, error) {
	pods, err := g.pods.List(everything())
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods, func(p *corev1.Pod) bool { return sandboxID(p) == "" }), nil
}

// claimNetwork is the network annotation a claim states for pod: the
// pod's, or "none".
func claimNetwork(pod *corev1.Pod) string {
	if v := pod.Annotations[node.AnnotationNetwork]; v != "" {
		return v
	}
	return "none"
}
