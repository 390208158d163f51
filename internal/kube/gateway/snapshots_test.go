package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// TestSnapshots: a snapshot is taken by the sandbox's node and recorded
// in a ConfigMap only its key sees; a create from it is a pod on that
// node with the snapshot's settings; a fork is a snapshot and its copies;
// a delete removes it from its node, then its record; bad input and other
// keys change nothing.
func TestSnapshots(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	body := `{"memory":"256M","labels":{"team":"a"},"network":{"mode":"allow","allow":["pypi.org"]},"env":{"A":"1"}}`
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, body, &sb); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	cms := e.kube.CoreV1().ConfigMaps(ns)
	records := func() int {
		l, err := cms.List(t.Context(), metav1.ListOptions{LabelSelector: LabelSnapshot})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	for _, tc := range []struct {
		method, path, key, body string
		status                  int
		code, field             string
	}{
		{"POST", "/v1/sandboxes/" + sb.ID + "/snapshots", keyBob, "", 404, errdefs.CodeNotFound, ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/snapshots", keyAlice, `{"nom":"x"}`, 400, errdefs.CodeInvalidArgument, "body"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/snapshots", keyAlice, `{"name":1}`, 400, errdefs.CodeInvalidArgument, "name"},
		{"POST", "/v1/sandboxes/nosuch/snapshots", keyAlice, "", 404, errdefs.CodeNotFound, ""},
		{"POST", "/v1/sandboxes/" + sb.ID + "/fork", keyAlice, `{"count":0}`, 400, errdefs.CodeInvalidArgument, "count"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/fork", keyAlice, `{"count":65}`, 400, errdefs.CodeInvalidArgument, "count"},
		{"GET", "/v1/snapshots/NOPE", keyAlice, "", 400, errdefs.CodeInvalidArgument, "id"},
		{"GET", "/v1/snapshots/nope", keyAlice, "", 404, errdefs.CodeNotFound, "id"},
		{"POST", "/v1/sandboxes", keyAlice, `{"snapshot":"nope"}`, 404, errdefs.CodeNotFound, "snapshot"},
	} {
		if code, eb := e.call(t, tc.method, tc.path, tc.key, tc.body, nil); code != tc.status || eb.Code != tc.code || eb.Field != tc.field {
			t.Errorf("%s %s %s = %d %+v, want %d %s on %q", tc.method, tc.path, tc.body, code, eb, tc.status, tc.code, tc.field)
		}
	}
	if n := records(); n != 0 {
		t.Fatalf("refused requests left %d snapshot records", n)
	}

	var snap types.Snapshot
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", keyAlice, `{"name":"before"}`, &snap); code != 201 {
		t.Fatalf("snapshot = %d %+v", code, eb)
	}
	if snap.Source != sb.ID || snap.Name != "before" || snap.Kind != types.SnapshotFilesystem || snap.Template != "minimal" || snap.Labels["team"] != "a" || len(snap.Labels) != 1 || snap.Fork {
		t.Errorf("snapshot = %+v, want of %s with its labels only", snap, sb.ID)
	}
	var list types.SnapshotList
	if code, eb := e.call(t, "GET", "/v1/snapshots", keyAlice, "", &list); code != 200 || len(list.Snapshots) != 1 || list.Snapshots[0].ID != snap.ID {
		t.Errorf("alice's list = %d %+v %+v", code, eb, list)
	}
	if code, eb := e.call(t, "GET", "/v1/snapshots", keyBob, "", &list); code != 200 || len(list.Snapshots) != 0 {
		t.Errorf("bob's list = %d %+v %+v", code, eb, list)
	}
	for _, tc := range []struct{ method, path, key, body, field string }{
		{"GET", "/v1/snapshots/" + snap.ID, keyBob, "", "id"},
		{"DELETE", "/v1/snapshots/" + snap.ID, keyBob, "", "id"},
		{"POST", "/v1/sandboxes", keyBob, `{"snapshot":"` + snap.ID + `"}`, "snapshot"},
	} {
		if code, eb := e.call(t, tc.method, tc.path, tc.key, tc.body, nil); code != 404 || eb.Field != tc.field {
			t.Errorf("bob's %s %s = %d %+v, want 404 on %s", tc.method, tc.path, code, eb, tc.field)
		}
	}
	// Its export streams from its node.
	if code, _, h := e.e2bCall(t, "GET", "/v1/snapshots/"+snap.ID+"/export", keyAlice, "", nil); code != 200 || h.Get("X-Got-Path") != node.DataPlanePrefix+"/v1/snapshots/"+snap.ID+"/export" {
		t.Errorf("export = %d, node saw %q", code, h.Get("X-Got-Path"))
	}
	if code, _, h := e.e2bCall(t, "GET", "/v1/snapshots/"+snap.ID+"/export", keyBob, "", nil); code != 404 || h.Get("X-Got-Path") != "" {
		t.Errorf("bob's export = %d, node saw %q", code, h.Get("X-Got-Path"))
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"snapshot":"`+snap.ID+`","template":"other"}`, nil); code != 400 || eb.Field != "template" {
		t.Errorf("create from the snapshot with another template = %d %+v, want 400 on template", code, eb)
	}

	// A create from it: the source's settings, on the node that holds it.
	var from types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"snapshot":"`+snap.ID+`","env":{"B":"2"}}`, &from); code != 201 {
		t.Fatalf("create from the snapshot = %d %+v", code, eb)
	}
	pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), from.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src, _ := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.ID, metav1.GetOptions{})
	if pod.Annotations[node.AnnotationSnapshot] != snap.ID || !slices.Equal(podNodes(pod), []string{"berth-a"}) ||
		pod.Annotations[node.AnnotationNetwork] != src.Annotations[node.AnnotationNetwork] ||
		pod.Annotations[node.AnnotationEnv] != `{"A":"1","B":"2"}` {
		t.Errorf("pod from the snapshot: annotations %v, nodes %v", pod.Annotations, podNodes(pod))
	}
	if m := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; m.Value() != 256<<20 {
		t.Errorf("pod from the snapshot has memory %v, want the source's 256M", m.String())
	}

	// A fork: its own snapshot, marked, and its copies.
	var fr types.ForkResult
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/fork", keyAlice, `{"count":2}`, &fr); code != 201 {
		t.Fatalf("fork = %d %+v", code, eb)
	}
	if !fr.Snapshot.Fork || len(fr.Sandboxes) != 2 || fr.Sandboxes[0].Labels["team"] != "a" || fr.Sandboxes[0].State != types.StateReady {
		t.Errorf("fork = %+v", fr)
	}
	for _, c := range fr.Sandboxes {
		if p, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), c.ID, metav1.GetOptions{}); err != nil || p.Annotations[node.AnnotationSnapshot] != fr.Snapshot.ID {
			t.Errorf("fork copy %s: %v %v", c.ID, err, p)
		}
	}

	// Delete: from the node, then the record. A node's refusal (a sandbox
	// sits on it) keeps it.
	busy := snapshotRecord{snap: types.Snapshot{ID: "snapbusy", Template: "minimal"}, node: "berth-a", owner: "alice", settings: map[string]string{}}
	if _, err := cms.Create(t.Context(), busy.configMap(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, eb := e.call(t, "DELETE", "/v1/snapshots/snapbusy", keyAlice, "", nil); code != 409 || eb.Code != errdefs.CodeFailedPrecondition {
		t.Errorf("delete of a snapshot its node refuses = %d %+v, want 409", code, eb)
	}
	if n := records(); n != 3 {
		t.Errorf("%d records, want 3 (the snapshot, the fork's, the busy one)", n)
	}
	if code, eb := e.call(t, "DELETE", "/v1/snapshots/"+snap.ID, keyAlice, "", nil); code != 204 {
		t.Fatalf("delete = %d %+v", code, eb)
	}
	if code, _ := e.call(t, "GET", "/v1/snapshots/"+snap.ID, keyAlice, "", nil); code != 404 {
		t.Errorf("get after delete = %d", code)
	}
	// An import goes to a Ready node, which labels it its own; the answer
	// and the record keep the archive's own labels only.
	if code, eb := e.call(t, "POST", "/v1/snapshots/import?node=berth-z", keyAlice, "archive", nil); code != 400 || eb.Field != "node" {
		t.Errorf("import to no such node = %d %+v, want 400 on node", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/snapshots/import", keyAlice, "junk", nil); code != 400 || eb.Field != "file" {
		t.Errorf("import of junk = %d %+v, want the node's 400 on file", code, eb)
	}
	var imp types.Snapshot
	if code, eb := e.call(t, "POST", "/v1/snapshots/import", keyAlice, "archive", &imp); code != 201 || len(imp.Labels) != 1 || imp.Labels["team"] != "x" {
		t.Fatalf("import = %d %+v %+v", code, eb, imp)
	}
	if code, _ := e.call(t, "GET", "/v1/snapshots/"+imp.ID, keyBob, "", nil); code != 404 {
		t.Errorf("bob's get of alice's import = %d", code)
	}
	var fromImp types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"snapshot":"`+imp.ID+`"}`, &fromImp); code != 201 {
		t.Errorf("create from the import = %d %+v", code, eb)
	} else if p, _ := e.kube.CoreV1().Pods(ns).Get(t.Context(), fromImp.ID, metav1.GetOptions{}); !slices.Equal(podNodes(p), []string{"berth-a"}) {
		t.Errorf("pod from the import runs on %v", podNodes(p))
	}

	// A snapshot whose node is gone went with it: its record goes, and
	// a create from it is refused.
	gone := snapshotRecord{snap: types.Snapshot{ID: "snapgone", Template: "minimal"}, node: "berth-z", owner: "alice", settings: map[string]string{}}
	if _, err := cms.Create(t.Context(), gone.configMap(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"snapshot":"snapgone"}`, nil); code != 409 || eb.Field != "snapshot" {
		t.Errorf("create from a snapshot of a gone node = %d %+v, want 409 on snapshot", code, eb)
	}
	if code, eb := e.call(t, "DELETE", "/v1/snapshots/snapgone", keyAlice, "", nil); code != 204 {
		t.Errorf("delete of a gone node's snapshot = %d %+v", code, eb)
	}
	if n := records(); n != 3 {
		t.Errorf("%d records, want 3 (the fork's, the busy one, the import)", n)
	}
}

// TestE2BSnapshots: E2B's createSnapshot, listSnapshots, a create whose
// templateID is a snapshot, fork and deleteSnapshot on the gateway's
// snapshots; another key's are not found.
func TestE2BSnapshots(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal","metadata":{"k":"v"},"network":{"allowPublicTraffic":false}}`)
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", keyBob, `{}`, nil); code != 404 {
		t.Errorf("bob's snapshot = %d %s, want 404", code, data)
	}
	var info e2bwire.SnapshotInfo
	code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", keyAlice, `{"name":"first"}`, nil)
	if err := json.Unmarshal(data, &info); code != 201 || err != nil || info.SnapshotID == "" || !slices.Equal(info.Names, []string{"first"}) {
		t.Fatalf("snapshot = %d %s", code, data)
	}
	list := func(key, query string) []string {
		t.Helper()
		code, data, _ := e.e2bCall(t, "GET", "/snapshots"+query, key, "", nil)
		var l []e2bwire.SnapshotInfo
		if err := json.Unmarshal(data, &l); code != 200 || err != nil {
			t.Fatalf("list = %d %s", code, data)
		}
		var ids []string
		for _, s := range l {
			ids = append(ids, s.SnapshotID)
		}
		return ids
	}
	if got := list(keyAlice, "?name=first"); !slices.Equal(got, []string{info.SnapshotID}) {
		t.Errorf("alice's snapshots named first = %v", got)
	}
	if got := list(keyAlice, "?sandboxID=other"); len(got) != 0 {
		t.Errorf("alice's snapshots of another sandbox = %v", got)
	}
	if got := list(keyBob, ""); len(got) != 0 {
		t.Errorf("bob's snapshots = %v", got)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes", keyBob, `{"templateID":"`+info.SnapshotID+`"}`, nil); code != 404 {
		t.Errorf("bob's create from alice's snapshot = %d %s, want 404", code, data)
	}
	from := e.e2bCreate(t, keyAlice, `{"templateID":"`+info.SnapshotID+`"}`)
	pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), from.SandboxID, metav1.GetOptions{})
	if err != nil || pod.Annotations[node.AnnotationSnapshot] != info.SnapshotID || from.TemplateID != "minimal" || from.EnvdAccessToken == "" {
		t.Errorf("sandbox from the snapshot = %+v, pod %v, %v", from, pod, err)
	}

	// A fork: the parent's E2B settings, a traffic token of each copy's
	// own; its snapshot is not listed.
	code, data, _ = e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/fork", keyAlice, `{"count":2,"timeout":60}`, nil)
	var fr []e2bForkResult
	if err := json.Unmarshal(data, &fr); code != 201 || err != nil || len(fr) != 2 || fr[0].Sandbox == nil || fr[1].Sandbox == nil {
		t.Fatalf("fork = %d %s", code, data)
	}
	for _, c := range fr {
		p, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), c.Sandbox.SandboxID, metav1.GetOptions{})
		if err != nil || p.Annotations[AnnotationE2BMetadata] != `{"k":"v"}` || c.Sandbox.TrafficAccessToken == nil || *c.Sandbox.TrafficAccessToken == *sb.TrafficAccessToken {
			t.Errorf("fork copy %+v: pod %v, %v", c.Sandbox, p, err)
		}
	}
	if got := list(keyAlice, ""); !slices.Equal(got, []string{info.SnapshotID}) {
		t.Errorf("alice's snapshots after the fork = %v, want the one she took", got)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/fork", keyAlice, `{"count":0}`, nil); code != 400 {
		t.Errorf("fork of 0 = %d %s, want 400", code, data)
	}

	if code, data, _ := e.e2bCall(t, "DELETE", "/templates/"+info.SnapshotID, keyBob, "", nil); code != 404 {
		t.Errorf("bob's delete = %d %s, want 404", code, data)
	}
	if code, data, _ := e.e2bCall(t, "DELETE", "/templates/"+info.SnapshotID, keyAlice, "", nil); code != 204 {
		t.Errorf("delete = %d %s, want 204", code, data)
	}
	if got := list(keyAlice, "?name=first"); len(got) != 0 {
		t.Errorf("alice's snapshots after the delete = %v", got)
	}
}

// TestSweepForks: the leader removes a fork's snapshot once the fork is
// done and no pod names it; one a pod still names, or whose fork is not
// done, stays, until an unmarked one is old enough to be abandoned.
func TestSweepForks(t *testing.T) {
	e := startGateway(t, false)
	ctx := t.Context()
	cms := e.kube.CoreV1().ConfigMaps(ns)
	for _, tc := range []struct {
		id   string
		done bool
	}{{"snapa", true}, {"snapb", true}, {"snapc", false}} {
		cm := snapshotRecord{snap: types.Snapshot{ID: tc.id, Template: "minimal", Fork: true}, node: "berth-a", settings: map[string]string{}}.configMap(ns)
		cm.CreationTimestamp = metav1.Now() // the API server's, which the fake leaves out
		if tc.done {
			cm.Annotations = map[string]string{AnnotationForkDone: "true"}
		}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", "", `{"snapshot":"snapb"}`, &sb); code != 201 {
		t.Fatalf("create from snapb = %d %+v", code, eb)
	}
	f := informers.NewSharedInformerFactoryWithOptions(e.kube, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSnapshotFork + "=true" }))
	forks := f.Core().V1().ConfigMaps()
	inf := forks.Informer()
	f.Start(ctx.Done())
	t.Cleanup(f.Shutdown)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("fork records cache did not fill")
	}
	left := func() []string {
		t.Helper()
		l, err := cms.List(ctx, metav1.ListOptions{LabelSelector: LabelSnapshotFork})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, cm := range l.Items {
			ids = append(ids, cm.Labels[LabelSnapshot])
		}
		slices.Sort(ids)
		return ids
	}
	tried := map[string]time.Time{}
	e.g.sweepForks(ctx, forks.Lister().ConfigMaps(ns), tried, time.Now())
	if got := left(); !slices.Equal(got, []string{"snapb", "snapc"}) {
		t.Errorf("after a sweep: %v, want snapb (a pod names it) and snapc (not done)", got)
	}
	e.g.sweepForks(ctx, forks.Lister().ConfigMaps(ns), tried, time.Now().Add(2*forkAbandoned))
	if got := left(); !slices.Equal(got, []string{"snapb"}) {
		t.Errorf("after a sweep past the abandon time: %v, want snapb", got)
	}
}

// podNodes are the nodes a pod's affinity lets it run on (nil: any).
func podNodes(p *corev1.Pod) []string {
	if p == nil || p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil || p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out []string
	for _, term := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == hostnameLabel && e.Operator == corev1.NodeSelectorOpIn {
				out = append(out, e.Values...)
			}
		}
	}
	return out
}

// TestSnapshotCopies: with SnapshotCopies 2 the leader's sweep copies a
// snapshot held by one Ready node to another under its ID (its export
// into the other's import) and records the copy; a create from it may
// run on either; a fork's snapshot is not copied. A holder whose Node is
// deleted leaves the record, a copy taking the snapshot's node's place.
func TestSnapshotCopies(t *testing.T) {
	e := startGateway(t, true)
	e.g.cfg.SnapshotCopies = 2
	ctx := t.Context()
	a, err := e.kube.CoreV1().Nodes().Get(ctx, "berth-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := a.DeepCopy()
	b.Name, b.ResourceVersion = "berth-b", ""
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, e.g, "berth-b", true)
	cms := e.kube.CoreV1().ConfigMaps(ns)
	for _, rec := range []snapshotRecord{
		{snap: types.Snapshot{ID: "sbcopy", Template: "minimal"}, node: "berth-a", owner: "alice", settings: map[string]string{}},
		{snap: types.Snapshot{ID: "sbfork", Template: "minimal", Fork: true}, node: "berth-a", owner: "alice", settings: map[string]string{}},
	} {
		if _, err := cms.Create(ctx, rec.configMap(ns), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func() {
		t.Helper()
		list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: LabelSnapshot})
		if err != nil {
			t.Fatal(err)
		}
		var recs []*corev1.ConfigMap
		for i := range list.Items {
			recs = append(recs, &list.Items[i])
		}
		s := newSyncWork(e.g.now)
		e.g.copySnapshots(ctx, s, recs)
		s.wg.Wait()
	}
	record := func(id string) snapshotRecord {
		t.Helper()
		cm, err := cms.Get(ctx, snapshotRecordName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := recordOf(cm)
		if err != nil {
			t.Fatal(err)
		}
		if cm.Labels[LabelSnapshotNode] != rec.node {
			t.Errorf("record %s: node label %q, node %q", id, cm.Labels[LabelSnapshotNode], rec.node)
		}
		return rec
	}
	sweep()
	if rec := record("sbcopy"); !slices.Equal(rec.holders(), []string{"berth-a", "berth-b"}) {
		t.Errorf("after a sweep sbcopy is held by %v, want berth-a and its copy on berth-b", rec.holders())
	}
	if rec := record("sbfork"); !slices.Equal(rec.holders(), []string{"berth-a"}) {
		t.Errorf("a fork's snapshot is held by %v, want berth-a only", rec.holders())
	}
	var got types.Snapshot
	if code, eb := e.call(t, "GET", "/v1/snapshots/sbcopy", keyAlice, "", &got); code != 200 || !slices.Equal(got.Nodes, []string{"berth-a", "berth-b"}) {
		t.Errorf("get sbcopy = %d %+v: nodes %v, want both", code, eb, got.Nodes)
	}
	sweep() // as many copies as asked for: nothing more to do
	if rec := record("sbcopy"); len(rec.holders()) != 2 {
		t.Errorf("after a second sweep sbcopy is held by %v", rec.holders())
	}
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"snapshot":"sbcopy"}`, &sb); code != 201 {
		t.Fatalf("create from sbcopy = %d %+v", code, eb)
	}
	if p, err := e.kube.CoreV1().Pods(ns).Get(ctx, sb.ID, metav1.GetOptions{}); err != nil || !slices.Equal(podNodes(p), []string{"berth-a", "berth-b"}) {
		t.Errorf("pod from sbcopy may run on %v (%v), want both holders", podNodes(p), err)
	}

	// berth-a's Node is deleted: berth-b's copy is the snapshot's node.
	if err := e.kube.CoreV1().Nodes().Delete(ctx, "berth-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, e.g, "berth-a", false)
	sweep()
	if rec := record("sbcopy"); !slices.Equal(rec.holders(), []string{"berth-b"}) {
		t.Errorf("with berth-a gone sbcopy is held by %v, want berth-b", rec.holders())
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"snapshot":"sbfork"}`, nil); code != 409 || eb.Field != "snapshot" {
		t.Errorf("create from a snapshot whose only node is gone = %d %+v, want 409 on snapshot", code, eb)
	}
}

// awaitNode waits until the gateway's node cache has node name (present)
// or has not.
func awaitNode(t *testing.T, g *Gateway, name string, present bool) {
	t.Helper()
	awaitNodeWith(t, g, name, present, func(*corev1.Node) bool { return true })
}

// awaitNodeWith waits until the gateway's node cache has node name with
// cond holding (present), or has not it (!present).
func awaitNodeWith(t *testing.T, g *Gateway, name string, present bool, cond func(*corev1.Node) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		g.mu.Lock()
		moved := g.nodesMoved
		g.mu.Unlock()
		n, err := g.nodes.Get(name)
		if (err == nil && cond(n)) == present {
			return
		}
		select {
		case <-moved:
		case <-ctx.Done():
			t.Fatalf("the gateway's node cache: %s present %v not seen", name, present)
		}
	}
}
