package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// The cluster's templates. Each node's daemon keeps its own; what the
// cluster should have is recorded in one ConfigMap of the gateway's
// namespace (TemplatesConfigMap), a key per template made, built,
// imported or deleted through the gateway. The leader brings the Ready
// nodes to it (syncTemplates):
//   - a template recorded as present is copied to each Ready node that
//     lacks it (a node that joined later, or was not Ready when it was
//     made), from a node that has it: one node's export streamed into the
//     other's import, the same bits, with no registry and no build;
//   - so is a template built (or rebuilt) through the gateway to each
//     Ready node whose build of it is older than that build's start (a
//     node that was not Ready or failed during a rebuild, by its
//     node.AnnotationTemplateBuilds), from a node whose build is not:
//     the import takes the old one's place (replace), as a rebuild on
//     that node would;
//   - a template recorded as deleted is removed from each Ready node that
//     still has it (a node that was not Ready at the delete, or that
//     refused it while a sandbox used the template), once it can be.
//
// Templates made on a node's daemon directly, and the built-in ones, have
// no record and are left as they are.

// TemplatesConfigMap is the ConfigMap recording the cluster's templates.
const TemplatesConfigMap = "berth-templates"

// templateState is one template's entry in TemplatesConfigMap.
type templateState struct {
	// Deleted is set when the template was deleted through the gateway.
	Deleted bool `json:"deleted,omitempty"`
	// How says how it was made ("image REF", "dockerfile", "import",
	// "build"), for whoever reads the ConfigMap.
	How string    `json:"how,omitempty"`
	At  time.Time `json:"at"`
	// Built is when the last build of it through the gateway began: a
	// node's build from before then is an older one.
	Built time.Time `json:"built,omitzero"`
	// BuildIDs are the builds of it the cluster counts as current (each
	// node's of a build on every node; one build's, copied): a node that
	// has another build has an older one. Where they are known they
	// decide, not the clocks.
	BuildIDs []string `json:"build_ids,omitempty"`
}

// stale reports whether node n's build of template name is older than
// the recorded build st: not one of its BuildIDs, or (a node or a
// record that names no build) from before Built. A node that says
// neither counts as current.
func (st templateState) stale(n *corev1.Node, name string) bool {
	if id, ok := node.TemplateBuildID(n, name); ok && len(st.BuildIDs) > 0 {
		return !slices.Contains(st.BuildIDs, id)
	}
	if st.Built.IsZero() {
		return false
	}
	at, ok := node.TemplateBuiltAt(n, name)
	return ok && at.Before(st.Built)
}

// recordTemplate sets template name's entry; a failure is logged (the
// change stands on the nodes it was made on).
func (g *Gateway) recordTemplate(ctx context.Context, name string, st templateState) {
	st.At = g.now().UTC().Truncate(time.Second)
	b, err := json.Marshal(st)
	if err != nil {
		return
	}
	err = g.updateConfigMap(ctx, TemplatesConfigMap, func(data map[string]string) bool {
		data[name] = string(b)
		return true
	})
	if err != nil {
		g.log.Warn("template_record_failed", "template", name, "deleted", st.Deleted, "err", err)
	}
}

// recordDeleting records template name as deleted ahead of its removal
// from the nodes, and returns what puts its entry back as it was (none:
// removed) if no node removes it; a failure either way is logged.
func (g *Gateway) recordDeleting(ctx context.Context, name string) (undo func()) {
	b, err := json.Marshal(templateState{Deleted: true, At: g.now().UTC().Truncate(time.Second)})
	if err != nil {
		return func() {}
	}
	deleted := string(b)
	var prev string
	var had bool
	err = g.updateConfigMap(ctx, TemplatesConfigMap, func(data map[string]string) bool {
		prev, had = data[name]
		data[name] = deleted
		return true
	})
	if err != nil {
		g.log.Warn("template_record_failed", "template", name, "deleted", true, "err", err)
		return func() {}
	}
	return func() {
		err := g.updateConfigMap(ctx, TemplatesConfigMap, func(data map[string]string) bool {
			if data[name] != deleted {
				return false // changed since: a later change stands
			}
			if had {
				data[name] = prev
			} else {
				delete(data, name)
			}
			return true
		})
		if err != nil {
			g.log.Warn("template_record_failed", "template", name, "deleted", false, "err", err)
		}
	}
}

// updateConfigMap has change edit the data of ConfigMap name of the
// gateway's namespace, made if it does not exist, again on a conflict;
// change reports whether it changed anything (nothing is written if not).
func (g *Gateway) updateConfigMap(ctx context.Context, name string, change func(data map[string]string) bool) error {
	cms := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			data := map[string]string{}
			if !change(data) {
				return nil
			}
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.cfg.Namespace, Labels: map[string]string{LabelManagedBy: ManagedBy}},
				Data:       data,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if !change(cm.Data) {
			return nil
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// buildIDs are the build IDs of the templates got[i] of the nodes whose
// outcome res[i] is a success.
func buildIDs(got []apitypes.Template, res []*nodeOutcome) []string {
	var ids []string
	for i, o := range res {
		if o.err == nil && got[i].BuildID != "" {
			ids = append(ids, got[i].BuildID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// templateStates reads TemplatesConfigMap's entries (none when it does
// not exist); an entry that does not decode is skipped.
func templateStates(cm *corev1.ConfigMap) map[string]templateState {
	out := map[string]templateState{}
	if cm == nil {
		return out
	}
	for name, v := range cm.Data {
		var st templateState
		if apitypes.ValidTemplateName(name) != nil || json.Unmarshal([]byte(v), &st) != nil {
			continue
		}
		out[name] = st
	}
	return out
}

// nodeHasTemplate reports whether n's annotation lists template name.
func nodeHasTemplate(n *corev1.Node, name string) bool {
	return slices.Contains(strings.Split(n.Annotations[node.AnnotationTemplates], ","), name)
}

// exportTemplate is GET /v1/templates/{name}/export (admin): the template
// as a node's daemon exports it, from the first Ready node (by name) that
// has it and answers; a node that refuses (the template not built there)
// hands over to the next.
func (g *Gateway) exportTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, ok := templateChange(w, r, p, "a template export")
	if !ok {
		return
	}
	nodes, err := g.nodesWith(name)
	if err != nil {
		writeError(w, err)
		return
	}
	var tried []*nodeOutcome
	for _, n := range nodes {
		o := &nodeOutcome{node: n.Name}
		tried = append(tried, o)
		t, err := g.nodeAt(n.Name)
		if err == nil {
			o.resp, err = g.nodeOpen(r.Context(), t, http.MethodGet, "/v1/templates/"+name+"/export", nil)
		}
		if o.err = err; err != nil {
			continue
		}
		defer o.resp.Body.Close()
		for _, h := range []string{"Content-Type", "Content-Disposition", "Content-Length"} {
			if v := o.resp.Header.Get(h); v != "" {
				w.Header().Set(h, v)
			}
		}
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, o.resp.Body); err != nil {
			g.log.Warn("template_export_cut", "template", name, "node", n.Name, "err", err)
		}
		return
	}
	writeError(w, nodesFailed("template "+name+" export", tried))
}

// importTemplate is POST /v1/templates/import[?name=NAME] (admin): an
// archive a daemon's (or the gateway's) export wrote, made a template on
// every Ready node. The archive (at most maxImport bytes) is kept in a
// file of the gateway's while the nodes read it, each its own copy. When
// every node refuses (a damaged archive, a name each has), the answer is
// the first refusal, plain; when some do, the error names them and the
// nodes it was made on. A node that joins later gets it from the others
// (syncTemplates).
func (g *Gateway) importTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := adminOnly(p, "a template import"); err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "name" {
			writeError(w, fieldErr(k, errdefs.ErrInvalidArgument, "unknown query parameter %q (want name)", k))
			return
		}
	}
	path := "/v1/templates/import"
	if name := q.Get("name"); name != "" {
		if err := apitypes.ValidTemplateName(name); err != nil {
			writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "name", Message: err.Error()})
			return
		}
		path += "?name=" + name
	}
	nodes, err := g.readyNodes()
	if err != nil {
		writeError(w, err)
		return
	}
	spool, err := os.CreateTemp("", "berth-gateway-template-")
	if err != nil {
		writeError(w, err)
		return
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	if _, err := io.Copy(spool, http.MaxBytesReader(w, r.Body, maxImport)); err != nil {
		writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "file", Message: fmt.Sprintf("read the archive: %v", err)})
		return
	}
	// Once uploaded, the import runs to its end on every node even if the
	// caller has gone, so the nodes agree.
	ctx := context.WithoutCancel(r.Context())
	got := make([]apitypes.Template, len(nodes))
	res := g.eachNode(nodes, func(i int, t nodeTarget) (*http.Response, error) {
		f, err := os.Open(spool.Name())
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return nil, g.nodeCall(ctx, t, http.MethodPost, path, f, &got[i])
	})
	var answers []nodeTemplates
	for i, o := range res {
		if o.err == nil {
			answers = append(answers, nodeTemplates{node: o.node, tpls: []apitypes.Template{got[i]}})
		}
	}
	if len(answers) == 0 {
		writeError(w, nodesFailed("template import", res))
		return
	}
	merged := mergeTemplates(answers).Templates[0]
	g.recordTemplate(ctx, merged.Name, templateState{How: "import", BuildIDs: buildIDs(got, res)})
	g.log.Info("template_imported", "template", merged.Name, "nodes", merged.Nodes)
	if err := g.awaitNodeTemplates(ctx, merged.Name, merged.Nodes, true); err != nil {
		g.log.Warn("template_imported_unreported", "template", merged.Name, "err", err)
	}
	if len(answers) < len(res) {
		writeError(w, nodesFailed("template "+merged.Name+" import", res))
		return
	}
	writeJSON(w, http.StatusCreated, merged)
}

// syncRetry is how long the leader waits before it tries a piece of its
// background work (a template's copy or removal, a snapshot's copy) again
// after a failure.
const syncRetry = 30 * time.Second

// syncSettle is how long work that succeeded is not started
// again, while the caches (a node's annotation, a record) catch up with it.
const syncSettle = 10 * time.Second

// syncConcurrency bounds the copies in flight at once (per kind of
// work): each streams a whole template or snapshot through the gateway.
const syncConcurrency = 2

// syncWork is the leader's background work for its term (the template
// sync, the snapshot copies): a piece of work per key, at most one in
// flight, waiting out a failure before it is tried again.
type syncWork struct {
	mu sync.Mutex
	// busy holds each key in flight; retry when one may be started
	// again.
	busy  map[string]bool
	retry map[string]time.Time
	sem   chan struct{}
	wg    sync.WaitGroup
	now   func() time.Time
}

func newSyncWork(now func() time.Time) *syncWork {
	return &syncWork{busy: map[string]bool{}, retry: map[string]time.Time{}, sem: make(chan struct{}, syncConcurrency), now: now}
}

// start runs fn for key in the background unless work for key is in
// flight or waiting, at most syncConcurrency of those limited at
// once. A failure (reported to failed) is tried again after
// syncRetry; a success is not started again before
// syncSettle, while the caches catch up with it.
func (s *syncWork) start(key string, limited bool, fn func() error, failed func(error)) {
	s.mu.Lock()
	skip := s.busy[key] || s.now().Before(s.retry[key])
	if !skip {
		s.busy[key] = true
	}
	s.mu.Unlock()
	if skip {
		return
	}
	s.wg.Go(func() {
		if limited {
			s.sem <- struct{}{}
		}
		err := fn()
		if limited {
			<-s.sem
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.busy, key)
		if err != nil {
			s.retry[key] = s.now().Add(syncRetry)
			failed(err)
			return
		}
		s.retry[key] = s.now().Add(syncSettle)
	})
}

// syncTemplates starts what brings the Ready nodes to the recorded
// templates (cm, nil when there is none): a copy to each node that lacks
// a present one, a removal from each that has a deleted one. Work in
// flight or waiting out a failure is not started again.
func (g *Gateway) syncTemplates(ctx context.Context, s *syncWork, cm *corev1.ConfigMap) {
	states := templateStates(cm)
	if len(states) == 0 {
		return
	}
	nodes, err := g.nodes.List(everything())
	if err != nil {
		return
	}
	nodes = slices.DeleteFunc(slices.Clone(nodes), func(n *corev1.Node) bool { return !nodeReady(n) })
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	names := make([]string, 0, len(states))
	for name := range states {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		st := states[name]
		var from []string
		for _, n := range nodes {
			if nodeHasTemplate(n, name) && !st.stale(n, name) {
				from = append(from, n.Name)
			}
		}
		for _, n := range nodes {
			has := nodeHasTemplate(n, name)
			replace := has && !st.Deleted && st.stale(n, name)
			if (has != st.Deleted && !replace) || (!st.Deleted && len(from) == 0) {
				continue // as recorded, or present nowhere to copy from
			}
			s.start(name+"/"+n.Name, !st.Deleted, func() error {
				if st.Deleted {
					return g.syncRemove(ctx, name, n.Name)
				}
				return g.syncCopy(ctx, name, from, n.Name, replace)
			}, func(err error) {
				g.log.Warn("template_sync_failed", "template", name, "node", n.Name, "deleted", st.Deleted, "err", err)
			})
		}
	}
}

// syncCopy copies template name to node to from the first of nodes from
// that exports it: its export streamed into to's import, which replaces
// to's own (older) build when replace is set. A node that has it by now
// (the annotation was behind) counts as done.
func (g *Gateway) syncCopy(ctx context.Context, name string, from []string, to string, replace bool) error {
	var t apitypes.Template
	path := "/v1/templates/import"
	if replace {
		path += "?replace=true"
	}
	f, err := g.streamCopy(ctx, from, "/v1/templates/"+name+"/export", to, path, &t)
	switch {
	case errdefs.Code(err) == errdefs.CodeAlreadyExists:
		return nil
	case err != nil:
		return err
	}
	g.log.Info("template_synced", "template", name, "from", f, "to", to, "replaced", replace, "size_bytes", t.SizeBytes)
	return nil
}

// streamCopy streams the export at exportPath of the first of nodes from
// that gives it into the import at importPath on node to, decoding the
// import's answer into out, and returns the node it copied from. An
// export refused hands over to the next node; an import refused is the
// error (with its class).
func (g *Gateway) streamCopy(ctx context.Context, from []string, exportPath, to, importPath string, out any) (string, error) {
	dst, err := g.nodeAt(to)
	if err != nil {
		return "", err
	}
	var errs []string
	for _, f := range from {
		src, err := g.nodeAt(f)
		var resp *http.Response
		if err == nil {
			resp, err = g.nodeOpen(ctx, src, http.MethodGet, exportPath, nil)
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("export from %s: %v", f, err))
			continue
		}
		err = g.nodeCall(ctx, dst, http.MethodPost, importPath, resp.Body, out)
		resp.Body.Close()
		if err != nil {
			return f, fmt.Errorf("import on %s from %s: %w", to, f, err)
		}
		return f, nil
	}
	return "", fmt.Errorf("no node exported it: %s: %w", strings.Join(errs, "; "), errdefs.ErrUnavailable)
}

// syncRemove removes template name, recorded as deleted, from node on;
// its daemon refuses while a sandbox uses it (the next try may not).
func (g *Gateway) syncRemove(ctx context.Context, name, on string) error {
	t, err := g.nodeAt(on)
	if err != nil {
		return err
	}
	err = g.nodeCall(ctx, t, http.MethodDelete, "/v1/templates/"+name, nil, nil)
	if err != nil && errdefs.Code(err) != errdefs.CodeNotFound {
		return err
	}
	g.log.Info("template_sync_removed", "template", name, "node", on)
	return nil
}
