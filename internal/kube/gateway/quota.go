package gateway

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/quota"
)

// A key's quota (its quota in --api-keys, as a daemon's key quota) bounds
// its live sandboxes: how many, their CPU and memory together, and each
// one's timeout. Replicas share no counter, so a create is checked twice:
// against the replica's cache before anything is made (the usual refusal,
// at no cost to the API server), then, once its pod or claim exists,
// against a fresh list from the API server that holds every create
// committed before it, its own included. A create that finds itself over
// the quota there deletes what it made and is refused. Two creates that
// race for the last place and each see the other are both refused; none
// is ever let past the quota.

// resources is a sandbox's CPU (millicores) and memory (bytes).
type resources struct{ cpuMillis, memoryBytes int64 }

// podResources is what a pod's sandbox is given, as its node reads it:
// the containers' limits, else their requests.
func podResources(pod *corev1.Pod) resources {
	var r resources
	for _, c := range pod.Spec.Containers {
		cpu, mem := c.Resources.Limits.Cpu(), c.Resources.Limits.Memory()
		if cpu.IsZero() {
			cpu = c.Resources.Requests.Cpu()
		}
		if mem.IsZero() {
			mem = c.Resources.Requests.Memory()
		}
		r.cpuMillis += cpu.MilliValue()
		r.memoryBytes += mem.Value()
	}
	return r
}

// poolResources is what a sandbox of the pool is given: its
// SandboxTemplate's pod's; zero when the pool or template is not known.
func (c *claimAPI) poolResources(pool string) resources {
	if c == nil {
		return resources{}
	}
	obj, err := c.pools.Get(pool)
	if err != nil {
		return resources{}
	}
	tname, _, _ := unstructured.NestedString(obj.(*unstructured.Unstructured).Object, "spec", "sandboxTemplateRef", "name")
	tobj, err := c.templates.Get(tname)
	if err != nil {
		return resources{}
	}
	spec, _, _ := unstructured.NestedMap(tobj.(*unstructured.Unstructured).Object, "spec", "podTemplate", "spec")
	var pod corev1.Pod
	if runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &pod.Spec) != nil {
		return resources{}
	}
	return podResources(&pod)
}

// admit checks a new sandbox asking for ask against owner's quota q,
// counting owner's live sandboxes but self (the new one's ID once made):
// from the cache, or with fresh from a list of the API server.
func (g *Gateway) admit(ctx context.Context, owner string, q core.Quota, self string, ask resources, fresh bool) error {
	if q == (core.Quota{}) || owner == "" {
		return nil
	}
	used, err := g.usage(ctx, owner, self, fresh)
	if err != nil {
		return err
	}
	if err := quota.Admit(q, used, ask.cpuMillis, ask.memoryBytes); err != nil {
		return fmt.Errorf("key %s: %w", owner, err)
	}
	return nil
}

// usage is what owner's live sandboxes but self hold: its gateway pods
// that have not ended and are not being deleted, and its SandboxClaims
// not being deleted whose pod (in the cache) has not ended, each claim at
// its pod's resources, or its pool's before it has one.
func (g *Gateway) usage(ctx context.Context, owner, self string, fresh bool) (quota.Usage, error) {
	var used quota.Usage
	sel := labels.SelectorFromSet(labels.Set{LabelOwner: owner})
	var pods []*corev1.Pod
	if fresh {
		list, err := g.cfg.Kube.CoreV1().Pods(g.cfg.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(labels.Set{LabelOwner: owner, LabelManagedBy: ManagedBy}).String()})
		if err != nil {
			return used, kubeErr("list the sandboxes of key "+owner, err)
		}
		for i := range list.Items {
			pods = append(pods, &list.Items[i])
		}
	} else {
		var err error
		if pods, err = g.pods.List(sel); err != nil {
			return used, err
		}
	}
	for _, pod := range pods {
		if pod.Labels[LabelManagedBy] != ManagedBy || pod.Name == self || pod.DeletionTimestamp != nil || podEnded(pod) {
			continue
		}
		r := podResources(pod)
		used.Add(r.cpuMillis, r.memoryBytes)
	}
	if g.claims == nil {
		return used, nil
	}
	var claims []*unstructured.Unstructured
	if fresh {
		list, err := g.claims.client.Resource(claimsGVR).Namespace(g.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return used, kubeErr("list the SandboxClaims of key "+owner, err)
		}
		for i := range list.Items {
			claims = append(claims, &list.Items[i])
		}
	} else {
		objs, err := g.claims.claims.List(sel)
		if err != nil {
			return used, err
		}
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				claims = append(claims, u)
			}
		}
	}
	for _, c := range claims {
		if c.GetName() == self || c.GetDeletionTimestamp() != nil {
			continue
		}
		var r resources
		if pod, err := g.podByID(c.GetName()); err == nil {
			if podEnded(pod) {
				continue
			}
			r = podResources(pod)
		} else {
			pool, _, _ := unstructured.NestedString(c.Object, "spec", "warmPoolRef", "name")
			r = g.claims.poolResources(pool)
		}
		used.Add(r.cpuMillis, r.memoryBytes)
	}
	return used, nil
}
