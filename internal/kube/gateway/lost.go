package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// Annotations the gateway keeps on a sandbox pod for a lost node.
const (
	// AnnotationOnNodeLost is the sandbox's policy once its node is lost
	// (the create's on_node_lost, else the gateway's --on-node-lost):
	// fail or recreate.
	AnnotationOnNodeLost = "berth.dev/on-node-lost"
	// AnnotationRecreated counts the times the sandbox was made again
	// after its node was lost; AnnotationLostNode names the last node
	// it was lost on.
	AnnotationRecreated = "berth.dev/recreated"
	AnnotationLostNode  = "berth.dev/lost-node"
)

// A Berth node renews its Lease in kube-node-lease as a kubelet does. The
// leader (lifecycle.go) holds a node lost once that Lease has not changed
// for NodeLostAfter, timed on its own clock from when it saw the renew
// time change: the node's clock is never compared with the gateway's. A
// lost node is tainted node.kubernetes.io/unreachable:NoSchedule (as the
// node lifecycle controller would), so the scheduler places no new
// sandbox there, and each sandbox pod on it is reported lost
// (node.AnnotationLost, which the node also reads once back: the sandbox
// does not come back) or, under the recreate policy, deleted and made
// again with the same name, so the same sandbox ID, on another node. The
// taint goes once the Lease changes again.

// leaseSeen is what the leader saw of a node's Lease: its renew time,
// when that last changed on the leader's clock, and whether it changed
// since the leader first saw it.
type leaseSeen struct {
	renew   string
	changed time.Time
	renewed bool
}

// observe records the node's Lease renew time as of now and says whether
// the node is lost, and since when it has not renewed.
func (l *lifecycle) observe(name, renew string, now time.Time) (bool, time.Time) {
	s, ok := l.seen[name]
	switch {
	case !ok:
		s = leaseSeen{renew: renew, changed: now}
	case s.renew != renew:
		s = leaseSeen{renew: renew, changed: now, renewed: true}
	}
	l.seen[name] = s
	return now.Sub(s.changed) > l.cfg.NodeLostAfter, s.changed
}

// sweepNodes observes every Berth node's Lease, taints the lost ones and
// untaints those that renewed again; it returns why each lost node is.
func (l *lifecycle) sweepNodes(ctx context.Context, now time.Time) map[string]string {
	nodes, err := l.nodes.List(everything())
	if err != nil {
		l.log.Warn("lifecycle_list_failed", "err", err)
		return nil
	}
	lost := map[string]string{}
	names := map[string]bool{}
	for _, n := range nodes {
		names[n.Name] = true
		lease, err := l.leases.Get(n.Name)
		if err != nil {
			lease = nil
		}
		isLost, since := l.observe(n.Name, leaseRenew(lease), now)
		switch {
		case isLost:
			lost[n.Name] = fmt.Sprintf("node %s lost: its lease in %s has not been renewed since %s (more than %s)",
				n.Name, nodeLeaseNamespace, since.UTC().Format(time.RFC3339), l.cfg.NodeLostAfter)
			if !unreachable(n) {
				l.setUnreachable(ctx, n, true, now)
			}
		case unreachable(n) && l.seen[n.Name].renewed:
			l.setUnreachable(ctx, n, false, now)
		}
	}
	for name := range l.seen {
		if !names[name] {
			delete(l.seen, name)
		}
	}
	return lost
}

func unreachable(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable && t.Effect == corev1.TaintEffectNoSchedule {
			return true
		}
	}
	return false
}

// setUnreachable adds or removes the unreachable NoSchedule taint. A
// conflict (the node changed since the cache saw it) is tried again next
// sweep.
func (l *lifecycle) setUnreachable(ctx context.Context, n *corev1.Node, on bool, now time.Time) {
	n = n.DeepCopy()
	taints := n.Spec.Taints[:0]
	for _, t := range n.Spec.Taints {
		if t.Key != corev1.TaintNodeUnreachable || t.Effect != corev1.TaintEffectNoSchedule {
			taints = append(taints, t)
		}
	}
	if on {
		at := metav1.NewTime(now)
		taints = append(taints, corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule, TimeAdded: &at})
	}
	n.Spec.Taints = taints
	if _, err := l.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		l.log.Warn("node_taint_failed", "node", n.Name, "unreachable", on, "err", err)
		return
	}
	if on {
		l.log.Warn("node_lost", "node", n.Name)
	} else {
		l.log.Info("node_back", "node", n.Name)
	}
}

// nodeLost acts on a live sandbox pod of a lost node, per its policy.
func (l *lifecycle) nodeLost(ctx context.Context, pod *corev1.Pod, why string) {
	policy := pod.Annotations[AnnotationOnNodeLost]
	if policy == "" {
		policy = l.policy
	}
	// A sandbox made from a snapshot is made again only where another
	// node holds a copy of it (snapcopies.go); otherwise the snapshot
	// was the lost node's only, and the sandbox is lost.
	if policy == apitypes.OnNodeLostRecreate {
		if id := pod.Annotations[node.AnnotationSnapshot]; id == "" {
			l.recreate(ctx, pod, nil)
			return
		} else if held := l.otherHolders(ctx, id, pod.Spec.NodeName); len(held) > 0 {
			l.recreate(ctx, pod, held)
			return
		}
	}
	if pod.Annotations[node.AnnotationLost] != "" {
		return
	}
	// The UID is a precondition: a pod made again under the name is not
	// marked.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID,
		"annotations": map[string]string{node.AnnotationLost: why, AnnotationLostNode: pod.Spec.NodeName},
	}})
	if err != nil {
		return
	}
	if _, err := l.kube.CoreV1().Pods(l.ns).Patch(ctx, pod.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		l.log.Warn("sandbox_lost_mark_failed", "sandbox_id", pod.Name, "err", err)
		return
	}
	l.log.Warn("sandbox_lost", "sandbox_id", pod.Name, "node", pod.Spec.NodeName, "policy", policy)
}

// otherHolders are the Ready nodes other than lost that hold a copy of
// snapshot id.
func (l *lifecycle) otherHolders(ctx context.Context, id, lost string) []string {
	cm, err := l.kube.CoreV1().ConfigMaps(l.ns).Get(ctx, snapshotRecordName(id), metav1.GetOptions{})
	if err != nil {
		return nil
	}
	rec, err := recordOf(cm)
	if err != nil {
		return nil
	}
	var out []string
	for _, h := range rec.holders() {
		if n, err := l.nodes.Get(h); err == nil && h != lost && nodeReady(n) {
			out = append(out, h)
		}
	}
	return out
}

// recreate deletes the pod of a lost node at once and makes it again
// under the same name without its node, for the scheduler to place on
// another (one of on, for a sandbox from a snapshot). The new pod is a
// new sandbox (nothing of the old one's files or processes survives but
// its snapshot's), with the old one's ID, template, limits,
// environment, labels, owner and deadline. The pod to make is recorded
// first (remakeRecord): a leader that stops between the delete and the
// create leaves it to the next one, which makes it (sweepRemakes).
func (l *lifecycle) recreate(ctx context.Context, pod *corev1.Pod, on []string) {
	if claimed(pod) {
		// agent-sandbox makes a Sandbox's pod again as soon as it is
		// gone, from the same pod template.
		if err := l.deletePod(ctx, pod); err != nil {
			l.log.Warn("sandbox_recreate_failed", "sandbox_id", sandboxID(pod), "err", err)
			return
		}
		l.log.Warn("sandbox_lost_recreating", "sandbox_id", sandboxID(pod), "node", pod.Spec.NodeName, "by", "agent-sandbox")
		return
	}
	fresh := remade(pod)
	if on != nil {
		// From a snapshot: on a node that holds a copy of it.
		delete(fresh.Spec.NodeSelector, hostnameLabel)
		fresh.Spec.Affinity = onNodes(on)
	}
	if err := l.writeRemake(ctx, fresh, pod.UID); err != nil {
		l.log.Warn("sandbox_recreate_failed", "sandbox_id", pod.Name, "err", err)
		return
	}
	if err := l.deletePod(ctx, pod); err != nil {
		// The record stays: the next sweep sees whether the pod is
		// still there (and looks again) or is gone (and makes it).
		l.log.Warn("sandbox_recreate_failed", "sandbox_id", pod.Name, "err", err)
		return
	}
	l.log.Warn("sandbox_lost_recreating", "sandbox_id", pod.Name, "node", pod.Spec.NodeName, "recreated", fresh.Annotations[AnnotationRecreated])
	l.finishRemake(ctx, fresh)
}

// remade is the pod to make again for a pod of a lost node.
func remade(pod *corev1.Pod) *corev1.Pod {
	n, _ := strconv.Atoi(pod.Annotations[AnnotationRecreated])
	ann := maps.Clone(pod.Annotations)
	delete(ann, node.AnnotationLost)
	ann[AnnotationRecreated] = strconv.Itoa(n + 1)
	ann[AnnotationLostNode] = pod.Spec.NodeName
	spec := pod.Spec.DeepCopy()
	spec.NodeName = ""
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: maps.Clone(pod.Labels), Annotations: ann},
		Spec:       *spec,
	}
}

// LabelRemake ("true") marks the record of a pod the leader is making
// again (ConfigMap berth-remake-<sandbox ID>: data "pod", the pod to
// make, and "uid", the lost one's UID).
const LabelRemake = "berth.dev/remake"

const remakePrefix = "berth-remake-"

// writeRemake records that fresh is to be made in place of the pod with
// UID old.
func (l *lifecycle) writeRemake(ctx context.Context, fresh *corev1.Pod, old ktypes.UID) error {
	b, err := json.Marshal(fresh)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: remakePrefix + fresh.Name, Namespace: l.ns, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelRemake: "true"}},
		Data:       map[string]string{"pod": string(b), "uid": string(old)},
	}
	cms := l.kube.CoreV1().ConfigMaps(l.ns)
	_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return kubeErr("record the pod to make again", err)
	}
	return nil
}

// finishRemake makes fresh and drops its record once it is made (or the
// name was taken meanwhile); otherwise the record stays for the next
// sweep.
func (l *lifecycle) finishRemake(ctx context.Context, fresh *corev1.Pod) {
	if !l.create(ctx, fresh) {
		return
	}
	err := l.kube.CoreV1().ConfigMaps(l.ns).Delete(ctx, remakePrefix+fresh.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		l.log.Warn("sandbox_remake_record_left", "sandbox_id", fresh.Name, "err", err)
	}
}

// sweepRemakes finishes what a leader recorded to make again and did not
// (it stopped, or the create failed): each record's pod, read from the
// API server, not the cache, is made when it is gone; a record whose pod
// was made again (another UID) is dropped, and so is one whose pod is
// still there (the lost-node pass decides about it afresh).
func (l *lifecycle) sweepRemakes(ctx context.Context) {
	if l.remakes == nil {
		return
	}
	recs, err := l.remakes.List(everything())
	if err != nil {
		return
	}
	for _, cached := range recs {
		cm, err := l.kube.CoreV1().ConfigMaps(l.ns).Get(ctx, cached.Name, metav1.GetOptions{})
		if err != nil {
			continue // gone meanwhile, or the API is away: next sweep
		}
		var fresh corev1.Pod
		// Only a sandbox pod of the gateway's, as recreate writes it.
		if err := json.Unmarshal([]byte(cm.Data["pod"]), &fresh); err != nil || fresh.Name == "" || remakePrefix+fresh.Name != cm.Name ||
			fresh.Labels[LabelManagedBy] != ManagedBy || fresh.Spec.NodeName != "" {
			l.log.Warn("sandbox_remake_record_bad", "record", cm.Name, "err", err)
			continue
		}
		fresh.Namespace = l.ns
		pod, err := l.kube.CoreV1().Pods(l.ns).Get(ctx, fresh.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l.log.Warn("sandbox_lost_recreating", "sandbox_id", fresh.Name, "recreated", fresh.Annotations[AnnotationRecreated], "by", "record")
			l.finishRemake(ctx, &fresh)
		case err != nil:
		case string(pod.UID) == cm.Data["uid"] && pod.DeletionTimestamp != nil:
			// Being deleted: made once it is gone.
		default:
			if err := l.kube.CoreV1().ConfigMaps(l.ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				l.log.Warn("sandbox_remake_record_left", "sandbox_id", fresh.Name, "err", err)
			}
		}
	}
}

// create makes a pod again; false means try again next sweep.
func (l *lifecycle) create(ctx context.Context, pod *corev1.Pod) bool {
	_, err := l.kube.CoreV1().Pods(l.ns).Create(ctx, pod, metav1.CreateOptions{})
	switch {
	case err == nil:
		l.log.Info("sandbox_recreated", "sandbox_id", pod.Name)
		return true
	case apierrors.IsAlreadyExists(err):
		// Made by the leader before, or by a create that reused the
		// name: either way not ours to make.
		return true
	}
	l.log.Warn("sandbox_recreate_failed", "sandbox_id", pod.Name, "err", err)
	return false
}

func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
