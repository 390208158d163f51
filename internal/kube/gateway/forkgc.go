package gateway

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	listersv1 "k8s.io/client-go/listers/core/v1"

	"github.com/berth-sandbox/berth/internal/kube/node"
)

// A fork's snapshot is the fork's, not the caller's (E2B does not list
// it): it goes once its copies have. The fork marks its record done when
// it has made its copies or given up (AnnotationForkDone); the leader then
// removes the snapshot, from its node and from the cluster, once no
// sandbox pod names it. A record a fork never marked (its gateway died
// mid-fork) is taken as done after forkAbandoned.

// forkAbandoned is how old an unmarked fork record is before the leader
// takes its fork for dead: far past any create's wait.
const forkAbandoned = time.Hour

// forkDone marks rec's record done, so its snapshot goes with its last
// copy. A failed mark leaves it to forkAbandoned.
func (g *Gateway) forkDone(ctx context.Context, rec snapshotRecord) {
	patch := []byte(`{"metadata":{"annotations":{"` + AnnotationForkDone + `":"true"}}}`)
	_, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Patch(context.WithoutCancel(ctx), snapshotRecordName(rec.snap.ID), ktypes.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		g.log.Warn("fork_mark_failed", "snapshot_id", rec.snap.ID, "err", err)
	}
}

// forkRetry is how long the leader waits before it asks a node again to
// remove a fork's snapshot it refused or did not answer for.
const forkRetry = 30 * time.Second

// sweepForks removes each fork snapshot in forks (the leader's cache of
// fork records) that is done and that no sandbox pod names. A node that
// refuses (a sandbox it cannot tell deleted still sits on it) or does not
// answer is asked again forkRetry after; tried holds when each was last
// tried (the leader's, for its term).
func (g *Gateway) sweepForks(ctx context.Context, forks listersv1.ConfigMapNamespaceLister, tried map[string]time.Time, now time.Time) {
	cms, err := forks.List(everything())
	if err != nil || len(cms) == 0 {
		return
	}
	pods, err := g.pods.List(everything())
	if err != nil {
		return
	}
	used := map[string]bool{}
	for _, pod := range pods {
		if id := pod.Annotations[node.AnnotationSnapshot]; id != "" {
			used[id] = true
		}
	}
	present := map[string]bool{}
	for _, cm := range cms {
		id := cm.Labels[LabelSnapshot]
		present[id] = true
		if !forkOver(cm, now) || used[id] || now.Sub(tried[id]) < forkRetry {
			continue
		}
		rec, err := recordOf(cm)
		if err != nil {
			continue
		}
		if err := g.removeSnapshot(ctx, rec); err != nil {
			tried[id] = now
			g.log.Info("fork_snapshot_kept", "snapshot_id", id, "retry_in", forkRetry, "err", err)
		}
	}
	for id := range tried {
		if !present[id] {
			delete(tried, id)
		}
	}
}

// forkOver says whether a fork record's fork is over: marked done, or
// abandoned.
func forkOver(cm *corev1.ConfigMap, now time.Time) bool {
	return cm.Annotations[AnnotationForkDone] == "true" || now.Sub(cm.CreationTimestamp.Time) > forkAbandoned
}
