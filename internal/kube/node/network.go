package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// ConditionNetwork is the pod condition that reports whether the sandbox
// holds the egress policy its pod's AnnotationNetwork states. Its message
// starts with "policy <NetworkHash of the annotation>", so a writer of
// the annotation (the gateway's PUT …/network) knows when its own value
// was applied or refused.
const ConditionNetwork corev1.PodConditionType = "berth.dev/NetworkPolicy"

// Reasons of ConditionNetwork.
const (
	// NetworkApplied: the sandbox's egress policy is the annotation's.
	NetworkApplied = "Applied"
	// NetworkRefused: the daemon refused the annotation's policy (the
	// message has its error code and words); the sandbox keeps the last
	// policy applied.
	NetworkRefused = "Refused"
	// NetworkPending: the annotation changed and the node has not applied
	// it yet.
	NetworkPending = "Pending"
)

// NetworkHash identifies an AnnotationNetwork value in ConditionNetwork's
// message: the first 16 hex digits of its SHA-256, spaces around it
// ignored.
func NetworkHash(annotation string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(annotation)))
	return hex.EncodeToString(sum[:8])
}

// NetworkStatus reads ConditionNetwork of a pod for the annotation value
// want: done once the node applied it (err nil) or refused it (err of the
// daemon's class, with its words); not done while the pod's condition is
// about another value or pending.
func NetworkStatus(pod *corev1.Pod, want string) (done bool, err error) {
	prefix := "policy " + NetworkHash(want)
	for _, c := range pod.Status.Conditions {
		if c.Type != ConditionNetwork || !strings.HasPrefix(c.Message, prefix) {
			continue
		}
		switch c.Reason {
		case NetworkApplied:
			return true, nil
		case NetworkRefused:
			// "policy <hash> refused: <code>: <message>"
			return true, conditionErr(strings.TrimPrefix(c.Message, prefix+" refused: "))
		}
	}
	return false, nil
}

// netState is what the node knows of a sandbox's egress policy against
// its pod's AnnotationNetwork; guarded by Pods.mu.
type netState struct {
	// applied is the annotation value the sandbox's policy was last set
	// from; known says applied is (a restarted node does not know what
	// the daemon holds until it sets it again).
	applied string
	known   bool
	// refused is the annotation value the daemon last refused and why.
	refused    string
	refusedErr error
}

// applyNetwork makes the sandbox's egress policy its pod's
// AnnotationNetwork when that changed since it was last applied, and
// reports the outcome in ConditionNetwork. A refused policy (bad JSON in
// the annotation, or the daemon's no) changes nothing in the sandbox.
func (p *Pods) applyNetwork(ctx context.Context, ps *podState) {
	ps.dmu.Lock()
	defer ps.dmu.Unlock()
	p.mu.Lock()
	pod, id, ns, over := ps.pod, ps.sandboxID, ps.net, ps.reason != "" || ps.deleted
	p.mu.Unlock()
	want := pod.Annotations[AnnotationNetwork]
	if id == "" || over || (ns.known && want == ns.applied) || want == ns.refused && ns.refusedErr != nil {
		return
	}
	err := func() error {
		np, err := parseNetwork(want)
		if err != nil {
			return fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
		}
		if np == nil {
			np = &client.NetworkPolicy{Mode: "none"}
		}
		return p.sb.SetNetworkPolicy(ctx, id, *np)
	}()
	if err != nil && ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	if err != nil {
		ps.net.refused, ps.net.refusedErr = want, err
	} else {
		ps.net = netState{applied: want, known: true}
	}
	p.mu.Unlock()
	k := key(pod.Namespace, pod.Name)
	if err != nil {
		p.log.Warn("sandbox_network_refused", "pod", k, "sandbox_id", id, "err", err)
	} else {
		p.log.Info("sandbox_network_set", "pod", k, "sandbox_id", id, "policy_hash", NetworkHash(want))
	}
	p.changed(ps)
}

// networkCondition is ConditionNetwork for a pod whose sandbox exists;
// the caller holds p.mu.
func networkCondition(ps *podState, now metav1.Time) corev1.PodCondition {
	want := ps.pod.Annotations[AnnotationNetwork]
	c := corev1.PodCondition{Type: ConditionNetwork, LastTransitionTime: now}
	switch {
	case ps.net.known && want == ps.net.applied:
		c.Status, c.Reason = corev1.ConditionTrue, NetworkApplied
		c.Message = "policy " + NetworkHash(want) + " applied"
	case want == ps.net.refused && ps.net.refusedErr != nil:
		c.Status, c.Reason = corev1.ConditionFalse, NetworkRefused
		c.Message = "policy " + NetworkHash(want) + " refused: " + errText(ps.net.refusedErr)
	default:
		c.Status, c.Reason = corev1.ConditionFalse, NetworkPending
		c.Message = "policy " + NetworkHash(want) + " not applied yet"
	}
	return c
}
