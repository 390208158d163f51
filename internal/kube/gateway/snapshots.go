package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// Snapshots on Kubernetes. A snapshot is taken by the daemon of the node
// that runs the sandbox (POST /berth/v1/sandboxes/<node sandbox>/snapshots
// on its kubelet port) and stays on that node: its files (and, on gVisor,
// memory) are the daemon's. What the cluster knows of it is a ConfigMap in
// the gateway's namespace, its record: the snapshot as the API shows it,
// the node that holds it, and the settings of the pod it was taken of. A
// sandbox made from it is a pod with node.AnnotationSnapshot that selects
// that node by its hostname label, so the scheduler places it there or
// nowhere; the node makes its sandbox from the snapshot.

// Labels and keys of a snapshot's record.
const (
	// LabelSnapshot holds the snapshot's ID on its record.
	LabelSnapshot = "berth.dev/snapshot"
	// LabelSnapshotNode is the node whose daemon holds the snapshot.
	LabelSnapshotNode = "berth.dev/snapshot-node"
	// LabelSnapshotFork ("true") marks a fork's snapshot: the leader
	// removes it once no pod is made from it (forkgc.go).
	LabelSnapshotFork = "berth.dev/snapshot-fork"
	// AnnotationForkDone, on a fork's record, says its copies are made
	// (or given up): from then on the last copy's end takes it away.
	AnnotationForkDone   = "berth.dev/fork-done"
	snapshotRecordPrefix = "berth-snapshot-"
	recordSnapshot       = "snapshot"
	recordSettings       = "settings"
	recordResources      = "resources"
	// recordCopies lists (JSON) the nodes that hold a copy of the
	// snapshot, under its ID, besides its node (snapcopies.go).
	recordCopies = "copies"
)

// hostnameLabel is the node label a pod from a snapshot selects its
// holder by (every Berth node sets it to its name).
const hostnameLabel = "kubernetes.io/hostname"

// snapshotSettings are the annotations a sandbox made from a snapshot
// takes from the pod the snapshot was taken of, unless its create says
// otherwise: what the snapshot's files and processes were made with.
var snapshotSettings = []string{
	node.AnnotationTemplate, node.AnnotationIsolation, node.AnnotationNetwork,
	node.AnnotationEnv, node.AnnotationUser, node.AnnotationAllowSudo,
}

// snapshotRecord is a snapshot as the cluster records it.
type snapshotRecord struct {
	snap apitypes.Snapshot
	// node holds the snapshot; its ID there is snap.ID.
	node string
	// settings are the source pod's snapshotSettings annotations, and
	// limits its container's limits.
	settings map[string]string
	limits   corev1.ResourceList
	owner    string
	// copies are the other nodes that hold it (snapcopies.go).
	copies []string
}

// holders are the nodes that hold the snapshot, its node first.
func (rec snapshotRecord) holders() []string { return append([]string{rec.node}, rec.copies...) }

// api is the snapshot as the API shows it: with the nodes that hold it.
func (rec snapshotRecord) api() apitypes.Snapshot {
	s := rec.snap
	s.Nodes = rec.holders()
	return s
}

func snapshotRecordName(id string) string { return snapshotRecordPrefix + id }

// recordOf reads a snapshot's record from its ConfigMap.
func recordOf(cm *corev1.ConfigMap) (snapshotRecord, error) {
	rec := snapshotRecord{node: cm.Labels[LabelSnapshotNode], owner: cm.Labels[LabelOwner]}
	if err := json.Unmarshal([]byte(cm.Data[recordSnapshot]), &rec.snap); err != nil {
		return rec, fmt.Errorf("snapshot record %s: %v: %w", cm.Name, err, errdefs.ErrUnavailable)
	}
	if err := json.Unmarshal([]byte(cm.Data[recordSettings]), &rec.settings); err != nil {
		return rec, fmt.Errorf("snapshot record %s: settings: %v: %w", cm.Name, err, errdefs.ErrUnavailable)
	}
	if s := cm.Data[recordResources]; s != "" {
		if err := json.Unmarshal([]byte(s), &rec.limits); err != nil {
			return rec, fmt.Errorf("snapshot record %s: resources: %v: %w", cm.Name, err, errdefs.ErrUnavailable)
		}
	}
	if s := cm.Data[recordCopies]; s != "" {
		if err := json.Unmarshal([]byte(s), &rec.copies); err != nil {
			return rec, fmt.Errorf("snapshot record %s: copies: %v: %w", cm.Name, err, errdefs.ErrUnavailable)
		}
	}
	return rec, nil
}

// configMap is the record as a ConfigMap.
func (rec snapshotRecord) configMap(ns string) *corev1.ConfigMap {
	snap, _ := json.Marshal(rec.snap)
	settings, _ := json.Marshal(rec.settings)
	limits, _ := json.Marshal(rec.limits)
	labels := map[string]string{LabelManagedBy: ManagedBy, LabelSnapshot: rec.snap.ID, LabelSnapshotNode: rec.node}
	if rec.owner != "" {
		labels[LabelOwner] = rec.owner
	}
	if rec.snap.Fork {
		labels[LabelSnapshotFork] = "true"
	}
	data := map[string]string{recordSnapshot: string(snap), recordSettings: string(settings), recordResources: string(limits)}
	if len(rec.copies) > 0 {
		copies, _ := json.Marshal(rec.copies)
		data[recordCopies] = string(copies)
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: snapshotRecordName(rec.snap.ID), Namespace: ns, Labels: labels},
		Data:       data,
	}
}

// snapshotFor is the record of snapshot id as the caller may see it: one
// of another key's is not found, as one that does not exist. field names
// the ID in errors ("snapshot" on a create, "id" on the snapshot's routes).
func (g *Gateway) snapshotFor(ctx context.Context, p auth.Principal, id, field string) (snapshotRecord, error) {
	if err := apitypes.ValidSandboxID(id); err != nil {
		return snapshotRecord{}, fieldErr(field, errdefs.ErrInvalidArgument, "snapshot ID: %v", err)
	}
	cm, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Get(ctx, snapshotRecordName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && !p.Sees(cm.Labels[LabelOwner]) {
		return snapshotRecord{}, fieldErr(field, errdefs.ErrNotFound, "snapshot %s: not found", id)
	}
	if err != nil {
		return snapshotRecord{}, kubeErr("read snapshot "+id, err)
	}
	return recordOf(cm)
}

// nodeCall sends one request to t's node's data plane at path (under
// node.DataPlanePrefix), with in as its JSON body (nil: none; an
// io.Reader is streamed as an archive), and decodes its JSON answer into
// out (nil: none). The node's error comes back with its class.
func (g *Gateway) nodeCall(ctx context.Context, t nodeTarget, method, path string, in, out any) error {
	resp, err := g.nodeOpen(ctx, t, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("node %s: %v: %w", t.node, err, errdefs.ErrUnavailable)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("node %s: %s %s: %v: %w", t.node, method, path, err, errdefs.ErrUnavailable)
	}
	return nil
}

// nodeOpen sends nodeCall's request and returns the node's answer, its
// body unread (the caller closes it), when it is a success; otherwise the
// node's error with its class.
func (g *Gateway) nodeOpen(ctx context.Context, t nodeTarget, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	ctype := "application/json"
	switch v := in.(type) {
	case nil:
	case io.Reader:
		body, ctype = v, "application/x-tar"
	default:
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+t.addr+node.DataPlanePrefix+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := (&http.Client{Transport: g.cfg.NodeTransport}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s unreachable: %v: %w", t.node, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("node %s: %v: %w", t.node, err, errdefs.ErrUnavailable)
	}
	var e errdefs.Error
	_ = json.Unmarshal(data, &e)
	return nil, &errdefs.Error{Code: errdefs.Code(errdefs.FromCode(e.Code)), Field: e.Field,
		Message: fmt.Sprintf("node %s: %s", t.node, e.Message)}
}

// snapshotTimeout bounds taking and recording a snapshot (a memory
// snapshot writes the sandbox's memory out).
const snapshotTimeout = 10 * time.Minute

// takeSnapshot has the node of the caller's sandbox id snapshot it and
// records the snapshot. fork marks a fork's.
func (g *Gateway) takeSnapshot(ctx context.Context, p auth.Principal, id, name string, fork bool) (snapshotRecord, *corev1.Pod, error) {
	pod, err := g.sandboxPod(ctx, p, id)
	if err != nil {
		return snapshotRecord{}, nil, err
	}
	t, err := g.target(pod, "")
	if err != nil {
		return snapshotRecord{}, nil, err
	}
	// A snapshot taken is recorded even if the caller gives up: it would
	// be no one's otherwise.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTimeout)
	defer cancel()
	var snap apitypes.Snapshot
	if err := g.nodeCall(ctx, t, http.MethodPost, "/v1/sandboxes/"+t.sandbox+"/snapshots", apitypes.SnapshotRequest{Name: name}, &snap); err != nil {
		return snapshotRecord{}, nil, err
	}
	// The node's labels say which pod it was of; the API's are the
	// sandbox's own.
	snap.Source, snap.Fork, snap.Labels = sandboxID(pod), fork, nil
	_ = json.Unmarshal([]byte(pod.Annotations[AnnotationLabels]), &snap.Labels)
	rec := snapshotRecord{snap: snap, node: t.node, owner: ownerOf(pod), settings: map[string]string{},
		limits: pod.Spec.Containers[0].Resources.Limits}
	for _, k := range snapshotSettings {
		if v, ok := pod.Annotations[k]; ok {
			rec.settings[k] = v
		}
	}
	if _, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Create(ctx, rec.configMap(g.cfg.Namespace), metav1.CreateOptions{}); err != nil {
		// Unrecorded, the snapshot would be no one's: it goes.
		if derr := g.nodeCall(ctx, t, http.MethodDelete, "/v1/snapshots/"+snap.ID, nil, nil); derr != nil {
			g.log.Warn("snapshot_remove_failed", "snapshot_id", snap.ID, "node", t.node, "err", derr)
		}
		return snapshotRecord{}, nil, kubeErr("record snapshot "+snap.ID, err)
	}
	g.log.Info("snapshot_taken", "snapshot_id", snap.ID, "sandbox_id", snap.Source, "node", t.node, "kind", snap.Kind)
	return rec, pod, nil
}

func (g *Gateway) createSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in apitypes.SnapshotRequest
	if err := decodeBody(r, &in, true, `{} or {"name":"before-upgrade"}`); err != nil {
		writeError(w, err)
		return
	}
	rec, _, err := g.takeSnapshot(r.Context(), p, r.PathValue("id"), in.Name, false)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, rec.api())
}

// snapshotRecords is every snapshot the caller may see, oldest first.
func (g *Gateway) snapshotRecords(ctx context.Context, p auth.Principal) ([]snapshotRecord, error) {
	cms, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy + "," + LabelSnapshot})
	if err != nil {
		return nil, kubeErr("list snapshots", err)
	}
	var out []snapshotRecord
	for i := range cms.Items {
		cm := &cms.Items[i]
		if !p.Sees(cm.Labels[LabelOwner]) {
			continue
		}
		rec, err := recordOf(cm)
		if err != nil {
			g.log.Warn("snapshot_record_unreadable", "record", cm.Name, "err", err)
			continue
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b snapshotRecord) int {
		if c := a.snap.CreatedAt.Compare(b.snap.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.snap.ID, b.snap.ID)
	})
	return out, nil
}

func (g *Gateway) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	recs, err := g.snapshotRecords(r.Context(), p)
	if err != nil {
		writeError(w, err)
		return
	}
	out := apitypes.SnapshotList{Snapshots: make([]apitypes.Snapshot, 0, len(recs))}
	for _, rec := range recs {
		out.Snapshots = append(out.Snapshots, rec.api())
	}
	writeJSON(w, http.StatusOK, out)
}

func (g *Gateway) getSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	rec, err := g.snapshotFor(r.Context(), p, r.PathValue("id"), "id")
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rec.api())
}

// exportSnapshot is GET /v1/snapshots/{id}/export: the snapshot as its
// node's daemon exports it (a tar archive: manifest, layers with their
// SHA-256, the memory image), streamed from that node. A daemon's import
// takes it (berth snapshot import).
func (g *Gateway) exportSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	rec, err := g.snapshotFor(r.Context(), p, r.PathValue("id"), "id")
	if err != nil {
		writeError(w, err)
		return
	}
	t, err := g.nodeAt(rec.node)
	if err != nil {
		writeError(w, fmt.Errorf("snapshot %s: %w", rec.snap.ID, err))
		return
	}
	t.path = "/v1/snapshots/" + rec.snap.ID + "/export"
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// maxImport bounds an uploaded snapshot archive, as a daemon does.
const maxImport = 64 << 30

// importSnapshot is POST /v1/snapshots/import[?node=NAME][&label=k=v…]: an archive a
// daemon's (or the gateway's) export wrote, streamed to a Ready Berth node
// (the one named, else the one holding the fewest snapshots), whose
// daemon checks it and records it as a snapshot of that node's; then the
// caller's record of it. Moving a snapshot between nodes is its export
// and an import naming the other node.
func (g *Gateway) importSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, err := g.importNode(r.Context(), r.URL.Query().Get("node"))
	if err != nil {
		writeError(w, err)
		return
	}
	t, err := g.nodeAt(name)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), snapshotTimeout)
	defer cancel()
	var snap apitypes.Snapshot
	// Once uploaded, the snapshot is recorded even if the caller has
	// gone: it would be no one's otherwise.
	path := "/v1/snapshots/import"
	if labels := r.URL.Query()["label"]; len(labels) > 0 {
		path += "?" + url.Values{"label": labels}.Encode()
	}
	if err := g.nodeCall(ctx, t, http.MethodPost, path, http.MaxBytesReader(w, r.Body, maxImport), &snap); err != nil {
		writeError(w, err)
		return
	}
	// What the archive's source was on its node is not this cluster's.
	maps.DeleteFunc(snap.Labels, func(k, _ string) bool { return node.InternalLabel(k) })
	rec := snapshotRecord{snap: snap, node: name, owner: p.Owner(), settings: map[string]string{node.AnnotationTemplate: snap.Template}}
	if snap.Isolation != "" {
		rec.settings[node.AnnotationIsolation] = snap.Isolation
	}
	if snap.AllowSudo {
		rec.settings[node.AnnotationAllowSudo] = "true"
	}
	if _, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Create(ctx, rec.configMap(g.cfg.Namespace), metav1.CreateOptions{}); err != nil {
		if derr := g.nodeCall(ctx, t, http.MethodDelete, "/v1/snapshots/"+snap.ID, nil, nil); derr != nil {
			g.log.Warn("snapshot_remove_failed", "snapshot_id", snap.ID, "node", name, "err", derr)
		}
		writeError(w, kubeErr("record snapshot "+snap.ID, err))
		return
	}
	g.log.Info("snapshot_imported", "snapshot_id", snap.ID, "node", name, "kind", snap.Kind)
	writeJSON(w, http.StatusCreated, rec.api())
}

// importNode is the node an import goes to: want if it names a Ready
// Berth node, else (want "") the Ready one holding the fewest snapshots.
func (g *Gateway) importNode(ctx context.Context, want string) (string, error) {
	nodes, err := g.nodes.List(everything())
	if err != nil {
		return "", err
	}
	var ready []string
	for _, n := range nodes {
		if nodeReady(n) {
			ready = append(ready, n.Name)
		}
	}
	if want != "" {
		if !slices.Contains(ready, want) {
			return "", fieldErr("node", errdefs.ErrInvalidArgument, "node %q is no Ready Berth node", want)
		}
		return want, nil
	}
	if len(ready) == 0 {
		return "", fmt.Errorf("no Berth node is Ready: %w", errdefs.ErrUnavailable)
	}
	cms, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelSnapshotNode})
	if err != nil {
		return "", kubeErr("list snapshots", err)
	}
	held := map[string]int{}
	for _, cm := range cms.Items {
		held[cm.Labels[LabelSnapshotNode]]++
	}
	slices.Sort(ready)
	best := ready[0]
	for _, n := range ready[1:] {
		if held[n] < held[best] {
			best = n
		}
	}
	return best, nil
}

// deleteSnapshot removes the snapshot from its node, then its record. A
// node that no longer exists took the snapshot with it: the record goes.
// The node's refusal (a sandbox still sits on it: already_exists) or
// silence changes nothing.
func (g *Gateway) deleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	rec, err := g.snapshotFor(r.Context(), p, r.PathValue("id"), "id")
	if err == nil {
		err = g.removeSnapshot(r.Context(), rec)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// removeSnapshot deletes the snapshot from each node that holds it (one
// gone holds nothing), then its record. A node that refuses keeps the
// record: a delete asked again tries again.
func (g *Gateway) removeSnapshot(ctx context.Context, rec snapshotRecord) error {
	id := rec.snap.ID
	for _, on := range rec.holders() {
		if _, err := g.nodes.Get(on); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return err
		}
		t, err := g.nodeAt(on)
		if err != nil {
			return err
		}
		err = g.nodeCall(ctx, t, http.MethodDelete, "/v1/snapshots/"+id, nil, nil)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Delete(ctx, snapshotRecordName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return kubeErr("remove the record of snapshot "+id, err)
	}
	g.log.Info("snapshot_removed", "snapshot_id", id, "nodes", rec.holders())
	return nil
}

// podFromSnapshot is podFor for a create naming a snapshot (in.Snapshot).
func (g *Gateway) podFromSnapshot(ctx context.Context, in createRequest, p auth.Principal, templates map[string]bool) (*corev1.Pod, error) {
	rec, err := g.snapshotFor(ctx, p, in.Snapshot, "snapshot")
	if err != nil {
		return nil, err
	}
	return g.podOfSnapshot(rec, in, p, templates)
}

// podOfSnapshot is the pod of a create from snapshot rec: podFor's, with
// the snapshot's settings where the create sets none, its limits when the
// create sets neither cpu nor memory, and placed on the node that holds
// it.
func (g *Gateway) podOfSnapshot(rec snapshotRecord, in createRequest, p auth.Principal, templates map[string]bool) (*corev1.Pod, error) {
	if in.Template != "" && in.Template != rec.snap.Template {
		return nil, fieldErr("template", errdefs.ErrInvalidArgument, "template %q: snapshot %s is of template %q; leave template unset", in.Template, rec.snap.ID, rec.snap.Template)
	}
	held, err := g.snapshotHolderReady(rec)
	if err != nil {
		return nil, err
	}
	in.Template = rec.snap.Template
	pod, err := g.podFor(in, p, templates)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{
		node.AnnotationIsolation: in.Isolation != "", node.AnnotationNetwork: in.Network != nil,
		node.AnnotationEnv: len(in.Env) > 0, node.AnnotationUser: in.User != "", node.AnnotationAllowSudo: in.AllowSudo != nil,
	}
	for k, v := range rec.settings {
		if !set[k] {
			pod.Annotations[k] = v
		}
	}
	if len(in.Env) > 0 {
		// The snapshot's environment, under the create's.
		env := map[string]string{}
		_ = json.Unmarshal([]byte(rec.settings[node.AnnotationEnv]), &env)
		maps.Copy(env, in.Env)
		b, _ := json.Marshal(env)
		pod.Annotations[node.AnnotationEnv] = string(b)
	}
	pod.Annotations[node.AnnotationTemplate] = rec.snap.Template
	pod.Annotations[node.AnnotationSnapshot] = rec.snap.ID
	c := &pod.Spec.Containers[0]
	c.Image = rec.snap.Template
	if in.CPU == nil && in.Memory == "" && len(rec.limits) > 0 {
		c.Resources.Limits, c.Resources.Requests = rec.limits.DeepCopy(), rec.limits.DeepCopy()
	}
	pod.Spec.Affinity = onNodes(held)
	return pod, nil
}

// onNodes is the affinity of a pod that may run on the named nodes only.
func onNodes(names []string) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: slices.Clone(names)}},
		}}},
	}}
}

// snapshotHolderReady returns the Ready nodes that hold the snapshot, and
// refuses a create from one none of whose nodes is Ready (or left): the
// pod could not be placed.
func (g *Gateway) snapshotHolderReady(rec snapshotRecord) ([]string, error) {
	var ready, notReady []string
	for _, on := range rec.holders() {
		n, err := g.nodes.Get(on)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if nodeReady(n) {
			ready = append(ready, on)
		} else {
			notReady = append(notReady, on)
		}
	}
	switch {
	case len(ready) > 0:
		return ready, nil
	case len(notReady) > 0:
		return nil, fieldErr("snapshot", errdefs.ErrUnavailable, "snapshot %s: no node that holds it is Ready (%s)", rec.snap.ID, strings.Join(notReady, ", "))
	}
	return nil, fieldErr("snapshot", errdefs.ErrFailedPrecondition, "snapshot %s: the nodes that held it (%s) are gone, and the snapshot with them", rec.snap.ID, strings.Join(rec.holders(), ", "))
}

// forkSandbox is POST /v1/sandboxes/{id}/fork ({"count":n}, default 1, at
// most 64): a snapshot of the sandbox, then n sandboxes made from it on
// the same node, each as a create naming it would make one (the source's
// settings, the gateway's default timeout). The snapshot is marked a
// fork's; it stays until deleted, as any other. A copy that cannot be made
// fails the fork with its error; the copies made so far are deleted.
func (g *Gateway) forkSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	in := apitypes.ForkRequest{Count: 1}
	if err := decodeBody(r, &in, true, `{} or {"count":2}`); err != nil {
		writeError(w, err)
		return
	}
	if in.Count < 1 || in.Count > maxFork {
		writeError(w, fieldErr("count", errdefs.ErrInvalidArgument, "count %d: want 1 to %d", in.Count, maxFork))
		return
	}
	id := r.PathValue("id")
	rec, src, err := g.takeSnapshot(r.Context(), p, id, "fork of "+id, true)
	if err != nil {
		writeError(w, err)
		return
	}
	made, err := g.forkCopies(r.Context(), p, rec, src, in.Count, g.cfg.DefaultTimeout, nil)
	g.forkDone(r.Context(), rec)
	if err != nil {
		writeError(w, fmt.Errorf("fork of %s: %w", id, err))
		return
	}
	out := apitypes.ForkResult{Snapshot: rec.api(), Sandboxes: make([]apitypes.Sandbox, 0, len(made))}
	for _, pod := range made {
		out.Sandboxes = append(out.Sandboxes, toSandbox(pod))
	}
	writeJSON(w, http.StatusCreated, out)
}

// forkCopies makes n sandboxes from rec, the snapshot a fork took of src,
// each a create from it would make with src's labels, on_node_lost,
// auto_resume, on_timeout and idle_pause and timeout to live, its pod
// finished by dress (nil: as it is). A copy that cannot be made deletes
// those made before it, and its error is returned.
func (g *Gateway) forkCopies(ctx context.Context, p auth.Principal, rec snapshotRecord, src *corev1.Pod, n int, timeout time.Duration, dress func(*corev1.Pod)) ([]*corev1.Pod, error) {
	tpls, err := g.templates()
	if err != nil {
		return nil, err
	}
	var labels map[string]string
	_ = json.Unmarshal([]byte(src.Annotations[AnnotationLabels]), &labels)
	req := createRequest{CreateRequest: apitypes.CreateRequest{Snapshot: rec.snap.ID, Labels: labels,
		Timeout:    strconv.FormatInt(int64(timeout/time.Second), 10) + "s",
		OnNodeLost: src.Annotations[AnnotationOnNodeLost], AutoResume: src.Annotations[AnnotationAutoResume] == "true",
		OnTimeout: src.Annotations[node.AnnotationOnTimeout], IdlePause: src.Annotations[node.AnnotationIdlePause]}}
	var made []*corev1.Pod
	for range n {
		pod, err := g.podOfSnapshot(rec, req, p, tpls)
		if err == nil {
			if dress != nil {
				dress(pod)
			}
			pod, err = g.makeSandbox(ctx, pod, p.Key.Quota)
		}
		if err != nil {
			for _, m := range made {
				if derr := g.destroy(context.WithoutCancel(ctx), m); derr != nil {
					g.log.Warn("fork_undo_failed", "sandbox_id", sandboxID(m), "err", derr)
				}
			}
			return nil, fmt.Errorf("copy %d of %d: %w", len(made)+1, n, err)
		}
		made = append(made, pod)
	}
	return made, nil
}

// maxFork bounds the copies one fork makes.
const maxFork = 64
