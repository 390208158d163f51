package node

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// statusOnlyPods is the pods client the pod controller (virtual-kubelet)
// writes pod statuses through. The controller's UpdateStatus sends the
// whole pod as this node last built it (Pods.withStatus), metadata
// included, at the resourceVersion its informer holds; the API server's
// pods/status takes a pod's labels and annotations from such a write. So
// a status built from a pod copy older than the informer's (the gateway
// set berth.dev/paused a moment before, and the node had not taken that
// update in yet) wrote the old annotations back: the pause, a deadline or
// a network policy the gateway had just written was gone again. Through
// this client a status write replaces the pod's status and nothing else.
type statusOnlyPods struct {
	corev1client.PodsGetter
}

// Pods is the pods client of namespace ns, with UpdateStatus writing the
// status alone.
func (s statusOnlyPods) Pods(ns string) corev1client.PodInterface {
	return statusOnlyPodClient{s.PodsGetter.Pods(ns)}
}

type statusOnlyPodClient struct {
	corev1client.PodInterface
}

// UpdateStatus replaces pod's status with a JSON patch of the status
// subresource: the pod's metadata and spec are left as the API server has
// them. The patch first tests the pod's UID, so a pod made again under
// the same name never gets this one's status.
func (c statusOnlyPodClient) UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	b, err := statusPatch(pod)
	if err != nil {
		return nil, err
	}
	return c.Patch(ctx, pod.Name, ktypes.JSONPatchType, b, metav1.PatchOptions{DryRun: opts.DryRun, FieldManager: opts.FieldManager}, "status")
}

// statusPatch is the JSON patch (RFC 6902) that replaces pod's status,
// tested against its UID when it has one.
func statusPatch(pod *corev1.Pod) ([]byte, error) {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	if pod.UID != "" {
		ops = append(ops, op{Op: "test", Path: "/metadata/uid", Value: pod.UID})
	}
	ops = append(ops, op{Op: "replace", Path: "/status", Value: pod.Status})
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return b, nil
}
