package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Copies of snapshots. A snapshot is taken by one node's daemon and kept
// there; with SnapshotCopies above 1 the leader copies it to more Ready
// nodes until that many hold it: one holder's export streamed into the
// other's import under the same ID (the daemon's ?id=), which that node
// then serves as its own. The record lists the copies (recordCopies). A
// sandbox from the snapshot may run on any Ready holder (podOfSnapshot's
// affinity); one made from it whose node is lost is made again on
// another holder under on_node_lost: recreate (lost.go); a delete removes
// every copy. A node whose Node object is deleted holds nothing: it
// leaves the record, and if it was the snapshot's node a copy takes its
// place. A fork's snapshot is not copied: its copies run beside their
// source, and it goes when they do.

// maxSnapshotCopies bounds SnapshotCopies.
const maxSnapshotCopies = 16

// copySnapshots starts, for each snapshot record (cms) held by fewer
// Ready nodes than SnapshotCopies, a copy to one more Ready node (the one
// holding the fewest snapshots), and drops from each record the nodes
// that are gone.
func (g *Gateway) copySnapshots(ctx context.Context, s *syncWork, cms []*corev1.ConfigMap) {
	nodes, err := g.nodes.List(everything())
	if err != nil {
		return
	}
	exists := map[string]bool{}
	var ready []string
	for _, n := range nodes {
		exists[n.Name] = true
		if nodeReady(n) {
			ready = append(ready, n.Name)
		}
	}
	held := map[string]int{}
	recs := make([]snapshotRecord, 0, len(cms))
	for _, cm := range cms {
		rec, err := recordOf(cm)
		if err != nil {
			continue
		}
		for _, h := range rec.holders() {
			held[h]++
		}
		recs = append(recs, rec)
	}
	for _, rec := range recs {
		id := rec.snap.ID
		if gone := slices.DeleteFunc(rec.holders(), func(h string) bool { return exists[h] }); len(gone) > 0 && len(gone) < len(rec.holders()) {
			s.start("snapshot-gone/"+id, false, func() error { return g.dropSnapshotHolders(ctx, id, gone) }, func(err error) {
				g.log.Warn("snapshot_record_failed", "snapshot_id", id, "err", err)
			})
			continue
		}
		if g.cfg.SnapshotCopies < 2 || rec.snap.Fork {
			continue
		}
		var from []string
		for _, h := range rec.holders() {
			if slices.Contains(ready, h) {
				from = append(from, h)
			}
		}
		if len(from) == 0 || len(from) >= g.cfg.SnapshotCopies {
			continue
		}
		to := ""
		for _, n := range ready {
			if !slices.Contains(rec.holders(), n) && (to == "" || cmp.Compare(held[n], held[to]) < 0) {
				to = n
			}
		}
		if to == "" {
			continue // every Ready node holds it
		}
		s.start("snapshot/"+id, true, func() error { return g.copySnapshot(ctx, rec, from, to) }, func(err error) {
			g.log.Warn("snapshot_copy_failed", "snapshot_id", id, "to", to, "err", err)
		})
	}
}

// copySnapshot copies snapshot rec to node to from the first of from
// that exports it, and records the copy. A copy made of a snapshot
// deleted meanwhile is deleted again.
func (g *Gateway) copySnapshot(ctx context.Context, rec snapshotRecord, from []string, to string) error {
	id := rec.snap.ID
	var snap apitypes.Snapshot
	f, err := g.streamCopy(ctx, from, "/v1/snapshots/"+id+"/export", to, "/v1/snapshots/import?"+url.Values{"id": {id}}.Encode(), &snap)
	// Already there: an earlier copy whose record failed.
	if err != nil && errdefs.Code(err) != errdefs.CodeAlreadyExists {
		return err
	}
	g.log.Info("snapshot_copied", "snapshot_id", id, "from", f, "to", to, "size_bytes", snap.SizeBytes)
	err = g.updateSnapshotRecord(ctx, id, func(rec *snapshotRecord) bool {
		if slices.Contains(rec.holders(), to) {
			return false
		}
		rec.copies = append(rec.copies, to)
		return true
	})
	if apierrors.IsNotFound(err) {
		// Deleted while it was copied: so is the copy.
		dst, derr := g.nodeAt(to)
		if derr == nil {
			derr = g.nodeCall(ctx, dst, http.MethodDelete, "/v1/snapshots/"+id, nil, nil)
		}
		if derr != nil && !errors.Is(derr, errdefs.ErrNotFound) {
			return fmt.Errorf("remove the copy of deleted snapshot %s on %s: %w", id, to, derr)
		}
		return nil
	}
	return err
}

// dropSnapshotHolders takes the nodes gone out of snapshot id's record;
// if its node is one, its first copy left takes its place.
func (g *Gateway) dropSnapshotHolders(ctx context.Context, id string, gone []string) error {
	err := g.updateSnapshotRecord(ctx, id, func(rec *snapshotRecord) bool {
		left := slices.DeleteFunc(rec.holders(), func(h string) bool { return slices.Contains(gone, h) })
		if len(left) == 0 || len(left) == len(rec.holders()) {
			return false
		}
		rec.node, rec.copies = left[0], left[1:]
		return true
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		g.log.Info("snapshot_holders_gone", "snapshot_id", id, "nodes", gone)
	}
	return err
}

// updateSnapshotRecord has change edit snapshot id's record (again on a
// conflict); change reports whether it changed it. The record's absence
// is apierrors' NotFound.
func (g *Gateway) updateSnapshotRecord(ctx context.Context, id string, change func(*snapshotRecord) bool) error {
	cms := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, snapshotRecordName(id), metav1.GetOptions{})
		if err != nil {
			return err
		}
		rec, err := recordOf(cm)
		if err != nil {
			return err
		}
		if !change(&rec) {
			return nil
		}
		next := rec.configMap(g.cfg.Namespace)
		cm.Labels[LabelSnapshotNode] = rec.node
		delete(cm.Data, recordCopies)
		if v, ok := next.Data[recordCopies]; ok {
			cm.Data[recordCopies] = v
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}
