package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/internal/policy"
)

// A sandbox's egress policy is its pod's node.AnnotationNetwork. Its node
// applies the annotation at create and each time it changes, and reports
// in the pod's node.ConditionNetwork, by the value's hash, whether the
// daemon took it or refused it (an operator's ceiling, say). So a policy
// holds while no gateway runs, `kubectl annotate` changes it as PUT
// …/network does, and any gateway replica reads the outcome from its
// informer.

// networkApplyTimeout bounds how long PUT …/network waits for the node's
// word on a new policy.
const networkApplyTimeout = time.Minute

// networkAnnotation validates a policy from the wire and returns its
// annotation value (the normalized policy as JSON), naming the bad entry
// under prefix ("network." at create, "" for PUT …/network).
func networkAnnotation(in apitypes.NetworkPolicy, prefix string) (policy.Policy, string, error) {
	p := policy.FromWire(in)
	if err := p.Validate(); err != nil {
		var re *policy.RuleError
		if errors.As(err, &re) {
			return p, "", fieldErr(prefix+re.Field, errdefs.ErrInvalidArgument, "%s%v", prefix, err)
		}
		return p, "", fieldErr(prefix+"mode", errdefs.ErrInvalidArgument, "%v", err)
	}
	p = p.Normalize()
	b, err := json.Marshal(policy.ToWire(p))
	if err != nil {
		return p, "", err
	}
	return p, string(b), nil
}

// putNetwork is PUT /v1/sandboxes/{id}/network: the body is a policy, as
// on a daemon. It answers once the sandbox's node applied it (200 with
// the policy) or its daemon refused it (the daemon's error; the sandbox
// keeps the policy it had, and so does its pod).
func (g *Gateway) putNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in apitypes.NetworkPolicy
	if err := decodeBody(r, &in, false, `a network policy such as {"mode":"allow","allow":["pypi.org"]}`); err != nil {
		writeError(w, err)
		return
	}
	pol, value, err := networkAnnotation(in, "")
	if err != nil {
		writeError(w, err)
		return
	}
	if err := g.setNetwork(r.Context(), p, r.PathValue("id"), value, nil); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, policy.ToWire(pol))
}

// setNetwork makes value the network annotation of the caller's sandbox
// id, with the extra annotations in the same write, and waits for its
// node's outcome. A refused value is taken back off the pod with the
// extra ones (unless another writer changed it since), so the
// annotations keep stating the policy the sandbox holds.
func (g *Gateway) setNetwork(ctx context.Context, p auth.Principal, id, value string, extra map[string]string) error {
	pod, err := g.sandboxPod(ctx, p, id)
	if err != nil {
		return err
	}
	if st := state(pod); st != apitypes.StateReady {
		return fmt.Errorf("sandbox %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	set := map[string]*string{node.AnnotationNetwork: &value}
	for k, v := range extra {
		set[k] = &v
	}
	// What goes back on a refusal.
	back := map[string]*string{}
	same := true
	for k, v := range set {
		if old, ok := pod.Annotations[k]; ok {
			back[k] = &old
			same = same && old == *v
		} else {
			back[k], same = nil, false
		}
	}
	if same {
		// Written before: the node's word on it may already be in.
		if done, err := node.NetworkStatus(pod, value); done {
			return err
		}
	}
	changed, stop := g.watch(id)
	defer stop()
	if err := g.writeAnnotations(ctx, pod, id, set); err != nil {
		return err
	}
	g.log.Info("sandbox_network_requested", "sandbox_id", id, "policy_hash", node.NetworkHash(value))
	werr := g.waitNetwork(ctx, id, pod.UID, value, changed)
	if werr == nil {
		g.log.Info("sandbox_network_set", "sandbox_id", id, "policy_hash", node.NetworkHash(value))
		return nil
	}
	var refused *nodeRefused
	if !errors.As(werr, &refused) {
		return werr
	}
	g.log.Warn("sandbox_network_refused", "sandbox_id", id, "policy_hash", node.NetworkHash(value), "err", refused.err)
	// Put the previous value back, the teardown outliving the request.
	g.undoAnnotation(ctx, pod, id, node.AnnotationNetwork, value, back)
	return refused.err
}

// undoAnnotation writes back (a nil value removes one) on the sandbox id's
// pod when its node refused value of annotation key: only while the cache
// still shows that pod with that value, and only at its resourceVersion,
// so that what another writer set since stays. It outlives the request.
func (g *Gateway) undoAnnotation(ctx context.Context, pod *corev1.Pod, id, key, value string, back map[string]*string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cur, err := g.podByID(id); err == nil && cur.UID == pod.UID && cur.Annotations[key] == value {
		if err := g.writeAnnotationsAt(rctx, cur, id, back); err != nil && !apierrors.IsConflict(err) {
			g.log.Warn("sandbox_annotation_undo_failed", "sandbox_id", id, "annotation", key, "err", err)
		}
	}
}

// nodeRefused is a node's daemon refusing what a pod's annotation asked (a policy, a pause).
type nodeRefused struct{ err error }

func (e *nodeRefused) Error() string { return e.err.Error() }

// writeAnnotations sets the annotations (a nil value removes one) on the pod
// (its UID a precondition), or on its claim for a claimed sandbox.
func (g *Gateway) writeAnnotations(ctx context.Context, pod *corev1.Pod, id string, ann map[string]*string) error {
	if claimed(pod) {
		for k, v := range ann {
			s := ""
			if v != nil {
				s = *v
			}
			if err := g.claims.setAnnotation(ctx, id, k, s); err != nil {
				return err
			}
		}
		return nil
	}
	return g.patchAnnotations(ctx, pod, id, ann, "")
}

// writeAnnotationsAt is writeAnnotations that changes a gateway-made pod only at
// its cached resourceVersion: a value written since by someone else
// stays.
func (g *Gateway) writeAnnotationsAt(ctx context.Context, pod *corev1.Pod, id string, ann map[string]*string) error {
	if claimed(pod) {
		return g.writeAnnotations(ctx, pod, id, ann)
	}
	return g.patchAnnotations(ctx, pod, id, ann, pod.ResourceVersion)
}

func (g *Gateway) patchAnnotations(ctx context.Context, pod *corev1.Pod, id string, ann map[string]*string, rv string) error {
	meta := map[string]any{"uid": pod.UID, "annotations": ann}
	if rv != "" {
		meta["resourceVersion"] = rv
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	_, err = g.cfg.Kube.CoreV1().Pods(g.cfg.Namespace).Patch(ctx, pod.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			return err
		}
		return kubeErr("set the network policy of sandbox "+id, err)
	}
	return nil
}

// waitNetwork waits (nodeWait) until the sandbox's node applied value
// (nil) or refused it (*nodeRefused), the sandbox ended, another value
// replaced it, or networkApplyTimeout passed. Once the cache showed value
// on the pod, another value there is a later writer's (before, it may be
// the cache lagging behind the write).
func (g *Gateway) waitNetwork(ctx context.Context, id string, uid ktypes.UID, value string, changed <-chan struct{}) error {
	caught := false
	_, err := g.nodeWait(ctx, id, uid, changed, networkApplyTimeout, "the new network policy", func(pod *corev1.Pod) (bool, error) {
		if done, err := node.NetworkStatus(pod, value); done {
			if err != nil {
				return true, &nodeRefused{err}
			}
			return true, nil
		}
		if st := state(pod); st != apitypes.StateReady {
			return true, fmt.Errorf("sandbox %s is %s: its network policy was not set: %w", id, st, errdefs.ErrFailedPrecondition)
		}
		cur := pod.Annotations[node.AnnotationNetwork]
		if caught && cur != value {
			return true, fmt.Errorf("sandbox %s: another update replaced this network policy before its node applied it: %w", id, errdefs.ErrFailedPrecondition)
		}
		caught = caught || cur == value
		return false, nil
	})
	return err
}

// nodeWait reads the sandbox's pod from the cache each time it changes
// (changed, a watch taken before the write) and hands it to step until
// step is done, the pod is gone or another, or limit passed (unavailable:
// the node did not report what) and returns the pod step was done with.
func (g *Gateway) nodeWait(ctx context.Context, id string, uid ktypes.UID, changed <-chan struct{}, limit time.Duration, what string,
	step func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		pod, err := g.podByID(id)
		switch {
		case apierrors.IsNotFound(err) || err == nil && pod.UID != uid:
			return nil, fmt.Errorf("sandbox %s ended while its node was to report %s: %w", id, what, errdefs.ErrFailedPrecondition)
		case err != nil:
			return nil, err
		}
		if done, err := step(pod); done {
			return pod, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("sandbox %s: its node did not report %s within %s (the pod keeps the request and the node does it when it can): %w", id, what, limit, errdefs.ErrUnavailable)
			}
			return nil, ctx.Err()
		}
	}
}
