package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

func everything() labels.Selector { return labels.Everything() }

// sandboxOf is the node's sandbox ID of a pod's sandbox: its container's
// ID is berth://<sandbox>/<container>.
func sandboxOf(pod *corev1.Pod) (string, error) {
	for _, cs := range pod.Status.ContainerStatuses {
		rest, ok := strings.CutPrefix(cs.ContainerID, "berth://")
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, "/")
		if apitypes.ValidSandboxID(id) == nil {
			return id, nil
		}
	}
	return "", fmt.Errorf("sandbox %s has no sandbox on a node yet: %w", pod.Name, errdefs.ErrFailedPrecondition)
}

// state is a sandbox pod's state in the API's terms.
func state(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil {
		return apitypes.StateStopping
	}
	if pod.Annotations[node.AnnotationLost] != "" {
		return apitypes.StateLost
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		if _, err := sandboxOf(pod); err == nil {
			if st, _ := node.Paused(pod); st != "" {
				return st
			}
			return apitypes.StateReady
		}
	case corev1.PodSucceeded:
		return apitypes.StateStopped
	case corev1.PodFailed:
		return apitypes.StateFailed
	}
	return apitypes.StateCreating
}

// toSandbox is a sandbox pod as the API shows a sandbox.
func toSandbox(pod *corev1.Pod) apitypes.Sandbox {
	c := pod.Spec.Containers[0]
	out := apitypes.Sandbox{
		ID: sandboxID(pod), State: state(pod), Template: pod.Annotations[node.AnnotationTemplate],
		Isolation: pod.Annotations[node.AnnotationIsolation],
		CreatedAt: pod.CreationTimestamp.UTC(),
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		out.CPU = float64(q.MilliValue()) / 1000
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		out.MemoryBytes = q.Value()
	}
	_ = json.Unmarshal([]byte(pod.Annotations[node.AnnotationEnv]), &out.Env)
	_ = json.Unmarshal([]byte(pod.Annotations[AnnotationLabels]), &out.Labels)
	ended := out.State == apitypes.StateStopped || out.State == apitypes.StateFailed || out.State == apitypes.StateLost
	if t, err := time.Parse(time.RFC3339, pod.Annotations[node.AnnotationDeadline]); err == nil && !ended {
		out.Deadline = t.UTC()
	} else if d := pod.Spec.ActiveDeadlineSeconds; d != nil && !ended {
		start := pod.CreationTimestamp.Time
		if pod.Status.StartTime != nil {
			start = pod.Status.StartTime.Time
		}
		out.Deadline = start.Add(time.Duration(*d) * time.Second).UTC()
	}
	if out.State == apitypes.StatePaused {
		_, out.Pause = node.Paused(pod)
	}
	out.AutoResume = pod.Annotations[AnnotationAutoResume] == "true"
	out.OnTimeout = pod.Annotations[node.AnnotationOnTimeout]
	out.IdlePause = pod.Annotations[node.AnnotationIdlePause]
	switch out.State {
	case apitypes.StateFailed, apitypes.StateStopped:
		out.Reason = endReason(pod)
	case apitypes.StateLost:
		out.Reason = pod.Annotations[node.AnnotationLost]
	}
	return out
}

func (g *Gateway) getSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, fresh, err := g.sandboxPodFresh(r.Context(), p, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	pod = g.current(r.Context(), pod, fresh)
	out := toSandbox(pod)
	g.withUsage(r.Context(), pod, &out)
	writeJSON(w, http.StatusOK, out)
}

func (g *Gateway) listSandboxes(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	want := map[string]string{}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeError(w, fieldErr("label", errdefs.ErrInvalidArgument, "label %q: want key=value", l))
			return
		}
		want[k] = v
	}
	var states []string
	for _, st := range q["state"] {
		for one := range strings.SplitSeq(st, ",") {
			if known := append(slices.Clip(apitypes.States), apitypes.StateLost); !slices.Contains(known, one) {
				writeError(w, fieldErr("state", errdefs.ErrInvalidArgument, "state %q is not one of %s", one, strings.Join(known, ", ")))
				return
			}
			states = append(states, one)
		}
	}
	pods, err := g.sandboxPods()
	if err != nil {
		writeError(w, err)
		return
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(sandboxID(a), sandboxID(b))
	})
	out := apitypes.SandboxList{Sandboxes: []apitypes.Sandbox{}}
	for _, pod := range pods {
		if !p.Sees(ownerOf(pod)) {
			continue
		}
		sb := toSandbox(pod)
		if len(states) > 0 && !slices.Contains(states, sb.State) {
			continue
		}
		match := true
		for k, v := range want {
			if sb.Labels[k] != v {
				match = false
			}
		}
		if match {
			out.Sandboxes = append(out.Sandboxes, sb)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (g *Gateway) deleteSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, err := g.sandboxPod(r.Context(), p, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := g.destroy(r.Context(), pod); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// destroy deletes a sandbox: its claim when it was made through one (the
// pod follows), else its pod.
func (g *Gateway) destroy(ctx context.Context, pod *corev1.Pod) error {
	if claimed(pod) {
		return g.claims.delete(ctx, pod)
	}
	return g.deletePod(ctx, pod.Name, pod.UID)
}

// deletePod deletes the pod at once (grace period 0: its node destroys
// the sandbox as soon as it sees the pod gone), only if it is still the
// pod with that UID.
func (g *Gateway) deletePod(ctx context.Context, name string, uid types.UID) error {
	zero := int64(0)
	err := g.cfg.Kube.CoreV1().Pods(g.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil {
		return kubeErr("delete sandbox "+name, err)
	}
	return nil
}
