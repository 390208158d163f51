package gateway

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
)

// Templates on the gateway: each node's daemon has its own, and the
// gateway lists what the Ready nodes have and makes, builds, sets (default
// isolation, warm pool), removes and prunes templates on all of them at
// once, through each node's data plane (the daemon's template routes;
// registries.go does the same for registry logins). A create's template check reads the nodes'
// annotation instead (create.go), with no node call. What is made or
// deleted through the gateway is recorded as the cluster's, and the
// leader copies it to nodes that lack it, or removes it, later
// (templatesync.go).

// nodeConcurrency bounds the node calls of one fan-out (eachNode) in
// flight at once; templateNodeTimeout bounds each call of a list.
const (
	nodeConcurrency     = 16
	templateNodeTimeout = 10 * time.Second
)

// nodeTemplates is one node's answer to a template list.
type nodeTemplates struct {
	node string
	tpls []apitypes.Template
	err  error
}

// listTemplates is GET /v1/templates: every template of a Ready Berth
// node, once, with the nodes that have it (Template.Nodes). A node that
// does not answer is named in unreachable_nodes, and the list is the
// others'. No Ready node at all is unavailable.
func (g *Gateway) listTemplates(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	list, err := g.clusterTemplates(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// getTemplate is GET /v1/templates/{name}: the template as the list shows
// it; not_found when no Ready node that answered has it.
func (g *Gateway) getTemplate(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	name := r.PathValue("name")
	list, err := g.clusterTemplates(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	for _, t := range list.Templates {
		if t.Name == name {
			writeJSON(w, http.StatusOK, t)
			return
		}
	}
	msg := fmt.Sprintf("template %q: no Ready Berth node has it", name)
	if len(list.UnreachableNodes) > 0 {
		msg += fmt.Sprintf(" (nodes %v did not answer)", list.UnreachableNodes)
	}
	writeError(w, &errdefs.Error{Code: errdefs.CodeNotFound, Field: "name", Message: msg})
}

// clusterTemplates asks every Ready Berth node for its daemon's templates
// and merges the answers (mergeTemplates).
func (g *Gateway) clusterTemplates(ctx context.Context) (apitypes.TemplateList, error) {
	nodes, err := g.readyNodes()
	if err != nil {
		return apitypes.TemplateList{}, err
	}
	lists := make([]apitypes.TemplateList, len(nodes))
	outs := g.eachNode(nodes, func(i int, t nodeTarget) (*http.Response, error) {
		cctx, cancel := context.WithTimeout(ctx, templateNodeTimeout)
		defer cancel()
		return nil, g.nodeCall(cctx, t, http.MethodGet, "/v1/templates", nil, &lists[i])
	})
	answers := make([]nodeTemplates, len(nodes))
	for i, o := range outs {
		answers[i] = nodeTemplates{node: o.node, tpls: lists[i].Templates, err: o.err}
	}
	for _, a := range answers {
		if a.err != nil {
			g.log.Warn("node_templates_unreachable", "node", a.node, "err", a.err)
		}
	}
	return mergeTemplates(answers), nil
}

// mergeTemplates makes one list of the nodes' answers: a template once,
// as the first node (by name) that has it built shows it (else the first
// that has it), with Nodes the nodes that have it and Built true only if
// every one of them has it built. Its warm pools are the sums of the
// nodes' (each node keeps its own). Templates are sorted by name.
func mergeTemplates(answers []nodeTemplates) apitypes.TemplateList {
	slices.SortFunc(answers, func(a, b nodeTemplates) int { return cmp.Compare(a.node, b.node) })
	type merged struct {
		t              apitypes.Template
		nodes          []string
		allBuilt       bool
		warm, warmSudo *apitypes.WarmPool
	}
	byName := map[string]*merged{}
	var out apitypes.TemplateList
	for _, a := range answers {
		if a.err != nil {
			out.UnreachableNodes = append(out.UnreachableNodes, a.node)
			continue
		}
		for _, t := range a.tpls {
			m := byName[t.Name]
			switch {
			case m == nil:
				m = &merged{t: t, allBuilt: true}
				byName[t.Name] = m
			case !m.t.Built && t.Built:
				m.t = t
			}
			m.nodes = append(m.nodes, a.node)
			m.allBuilt = m.allBuilt && t.Built
			m.warm = addPool(m.warm, t.Warm)
			m.warmSudo = addPool(m.warmSudo, t.WarmSudo)
		}
	}
	out.Templates = make([]apitypes.Template, 0, len(byName))
	for _, m := range byName {
		t := m.t
		t.Warm, t.WarmSudo = m.warm, m.warmSudo
		t.Nodes, t.Built = m.nodes, m.allBuilt
		out.Templates = append(out.Templates, t)
	}
	slices.SortFunc(out.Templates, func(a, b apitypes.Template) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// readyNodes are the Ready Berth nodes, or unavailable when there are
// none.
func (g *Gateway) readyNodes() ([]*corev1.Node, error) {
	nodes, err := g.nodes.List(everything())
	if err != nil {
		return nil, err
	}
	nodes = slices.DeleteFunc(slices.Clone(nodes), func(n *corev1.Node) bool { return !nodeReady(n) })
	if len(nodes) == 0 {
		return nil, fmt.Errorf("no Berth node is Ready: %w", errdefs.ErrUnavailable)
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	return nodes, nil
}

// templateChange checks a change of the template the path names: an
// admin's (what names the change in a refusal), of a valid name. It
// answers the refusal itself; ok is false then.
func templateChange(w http.ResponseWriter, r *http.Request, p auth.Principal, what string) (name string, ok bool) {
	if err := adminOnly(p, what); err != nil {
		writeError(w, err)
		return "", false
	}
	name = r.PathValue("name")
	if err := apitypes.ValidTemplateName(name); err != nil {
		writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "name", Message: err.Error()})
		return "", false
	}
	return name, true
}

// adminOnly refuses a caller that is neither the operator nor an admin
// key, as a daemon refuses template changes (internal/api's adminOnly).
func adminOnly(p auth.Principal, what string) error {
	if p.Admin() {
		return nil
	}
	return fmt.Errorf("%s takes an admin key: %w", what, errdefs.ErrPermissionDenied)
}

// createTemplate is POST /v1/templates: the template made from an image
// on every Ready node, each pulling it (builds.go's stream).
func (g *Gateway) createTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := adminOnly(p, "a template create"); err != nil {
		writeError(w, err)
		return
	}
	var req apitypes.TemplateCreateRequest
	if err := decodeBody(r, &req, false, `{"name","image",…}`); err != nil {
		writeError(w, err)
		return
	}
	if err := apitypes.ValidTemplateName(req.Name); err != nil {
		writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "name", Message: err.Error()})
		return
	}
	if req.Image == "" {
		writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "image", Message: "image is required (an OCI/Docker image reference)"})
		return
	}
	body, err := json.Marshal(req)
	if err != nil {
		writeError(w, err)
		return
	}
	g.buildOnNodes(w, r, req.Name, "/v1/templates", "image "+req.Image, func() (any, error) { return json.RawMessage(body), nil })
}

// buildTemplate is POST /v1/templates/{name}/build: a built-in template
// (re)built on every Ready node.
func (g *Gateway) buildTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, ok := templateChange(w, r, p, "a template build")
	if !ok {
		return
	}
	g.buildOnNodes(w, r, name, "/v1/templates/"+name+"/build", "", func() (any, error) { return nil, nil })
}

// buildDockerfile is POST /v1/templates/{name}/dockerfile: a Dockerfile
// build on every Ready node, from the same context. The context (a tar
// stream, as the daemon takes it, at most apitypes.MaxBuildContext bytes) is
// kept in a file of the gateway's while the nodes read it, each its own
// copy; the query (which Dockerfile, build args, start command, ready
// check) goes to each node as it came.
func (g *Gateway) buildDockerfile(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, ok := templateChange(w, r, p, "a template build")
	if !ok {
		return
	}
	spool, err := os.CreateTemp("", "berth-gateway-context-")
	if err != nil {
		writeError(w, err)
		return
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	n, err := io.Copy(spool, io.LimitReader(r.Body, apitypes.MaxBuildContext+1))
	if err != nil {
		writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "context", Message: fmt.Sprintf("read the build context: %v", err)})
		return
	}
	if n > apitypes.MaxBuildContext {
		writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "context", Message: fmt.Sprintf("build context over %d bytes", int64(apitypes.MaxBuildContext))})
		return
	}
	path := "/v1/templates/" + name + "/dockerfile"
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	// Each node reads its own handle; the transport closes it.
	g.buildOnNodes(w, r, name, path, "dockerfile", func() (any, error) { return os.Open(spool.Name()) })
}

// nodeOutcome is one node's part of a change through the gateway.
type nodeOutcome struct {
	node string
	resp *http.Response
	// built is the template the node's stream ended with; err why the
	// node failed (refused, unreachable, or its stream's error).
	built *apitypes.Template
	err   error
}

// buildOnNodes sends one build request (path, with a body of body's
// making for each node: JSON, a tar stream, or none when nil) to
// every Ready node at once and answers as a daemon's build does: NDJSON
// lines, the nodes' log lines prefixed with "[node] " as they come, then
// the template as the list shows it (mergeTemplates) once every node
// built it, or an error naming the nodes that failed and those that
// built it. When every node refuses before its build starts (a bad
// field, an image that does not exist), the answer is that refusal,
// plain, as a daemon's, and nothing changed anywhere.
//
// how, when set, records the template as the cluster's (templatesync.go)
// once a node built it: the leader then copies it to the Ready nodes
// that failed and to those that join later.
func (g *Gateway) buildOnNodes(w http.ResponseWriter, r *http.Request, name, path, how string, body func() (any, error)) {
	// A node whose build of the template is older than this one's start
	// missed it (templatesync.go).
	began := g.now().UTC().Truncate(time.Second)
	nodes, err := g.readyNodes()
	if err != nil {
		writeError(w, err)
		return
	}
	builds := g.eachNode(nodes, func(_ int, t nodeTarget) (*http.Response, error) {
		in, err := body()
		if err != nil {
			return nil, err
		}
		return g.nodeOpen(r.Context(), t, http.MethodPost, path, in)
	})
	var wg sync.WaitGroup
	defer func() {
		for _, b := range builds {
			if b.resp != nil {
				b.resp.Body.Close()
			}
		}
	}()
	if !slices.ContainsFunc(builds, func(b *nodeOutcome) bool { return b.err == nil }) {
		// Every node refused: the first one's answer, naming them all.
		writeError(w, nodesFailed("template "+name, builds))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	emit := func(l apitypes.BuildLine) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
		_ = rc.Flush()
	}
	for _, b := range builds {
		if b.err != nil {
			line := fmt.Sprintf("[%s] refused: %v\n", b.node, b.err)
			emit(apitypes.BuildLine{Log: &line})
			continue
		}
		wg.Go(func() { b.built, b.err = followBuild(b.node, b.resp.Body, emit) })
	}
	wg.Wait()
	if how != "" && slices.ContainsFunc(builds, func(b *nodeOutcome) bool { return b.err == nil }) {
		var ids []string
		for _, b := range builds {
			if b.err == nil && b.built != nil && b.built.BuildID != "" {
				ids = append(ids, b.built.BuildID)
			}
		}
		slices.Sort(ids)
		g.recordTemplate(context.WithoutCancel(r.Context()), name, templateState{How: how, Built: began, BuildIDs: ids})
	}
	for _, b := range builds {
		if b.err != nil {
			emit(apitypes.BuildLine{Error: nodesFailed("template "+name, builds)})
			return
		}
	}
	answers := make([]nodeTemplates, len(builds))
	for i, b := range builds {
		answers[i] = nodeTemplates{node: b.node, tpls: []apitypes.Template{*b.built}}
	}
	merged := mergeTemplates(answers).Templates[0]
	g.log.Info("template_built", "template", name, "nodes", merged.Nodes)
	// A create checks the nodes' annotation: answered once it shows the
	// template, so a create right after the build finds it.
	if err := g.awaitNodeTemplates(r.Context(), name, merged.Nodes, true); err != nil {
		line := fmt.Sprintf("built, but %v: creates of it may be refused until they do\n", err)
		emit(apitypes.BuildLine{Log: &line})
	}
	emit(apitypes.BuildLine{Template: &merged})
}

// nodeTemplatesTimeout bounds the wait for the nodes to report a
// template change in their annotation (they do at once after a change
// through their data plane, else at their next health check).
const nodeTemplatesTimeout = 30 * time.Second

// awaitNodeTemplates waits until each of nodes lists template name in its
// node.AnnotationTemplates (has false: no longer lists it), as the node
// informer's cache shows them, or nodeTemplatesTimeout passes.
func (g *Gateway) awaitNodeTemplates(ctx context.Context, name string, nodes []string, has bool) error {
	ctx, cancel := context.WithTimeout(ctx, nodeTemplatesTimeout)
	defer cancel()
	for {
		g.mu.Lock()
		moved := g.nodesMoved
		g.mu.Unlock()
		var behind []string
		for _, n := range nodes {
			nd, err := g.nodes.Get(n)
			if err != nil {
				continue // gone: nothing to wait for
			}
			if nodeHasTemplate(nd, name) != has {
				behind = append(behind, n)
			}
		}
		if len(behind) == 0 {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("nodes %v have not reported it after %s", behind, nodeTemplatesTimeout)
		}
	}
}

// addPool adds a node's warm pool to the sum so far (nil: none).
func addPool(sum, p *apitypes.WarmPool) *apitypes.WarmPool {
	if p == nil {
		return sum
	}
	if sum == nil {
		sum = &apitypes.WarmPool{AllowSudo: p.AllowSudo}
	}
	sum.Target += p.Target
	sum.Ready += p.Ready
	return sum
}

// eachNode runs call on every one of nodes at once (at most
// nodeConcurrency calls at a time) with the node's index and
// data-plane address, and returns each node's outcome in the nodes'
// order.
func (g *Gateway) eachNode(nodes []*corev1.Node, call func(i int, t nodeTarget) (*http.Response, error)) []*nodeOutcome {
	out := make([]*nodeOutcome, len(nodes))
	sem := make(chan struct{}, nodeConcurrency)
	var wg sync.WaitGroup
	for i, n := range nodes {
		b := &nodeOutcome{node: n.Name}
		out[i] = b
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t, err := g.nodeAt(n.Name)
			if err == nil {
				b.resp, err = call(i, t)
			}
			b.err = err
		})
	}
	wg.Wait()
	return out
}

// maxBuildLine bounds one line of a node's build stream.
const maxBuildLine = 1 << 20

// followBuild reads a node's build stream, passing its log lines on with
// the node's name, and returns the template it ended with, or the error
// it ended with (or that cut it short).
func followBuild(node string, body io.Reader, emit func(apitypes.BuildLine)) (*apitypes.Template, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxBuildLine)
	for sc.Scan() {
		var l apitypes.BuildLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("build stream: %v: %w", err, errdefs.ErrUnavailable)
		}
		switch {
		case l.Log != nil:
			line := "[" + node + "] " + *l.Log
			emit(apitypes.BuildLine{Log: &line})
		case l.Error != nil:
			return nil, &errdefs.Error{Code: l.Error.Code, Field: l.Error.Field, Message: l.Error.Message}
		case l.Template != nil:
			return l.Template, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("build stream: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil, fmt.Errorf("build stream ended without a template: %w", errdefs.ErrUnavailable)
}

// nodesFailed is the error of a change of what ("template py") that
// failed on some nodes: the first failure's code and field, every
// failure named, and the nodes it went through on.
func nodesFailed(what string, builds []*nodeOutcome) *errdefs.Error {
	var failed, done []string
	var first *errdefs.Error
	for _, b := range builds {
		if b.err == nil {
			done = append(done, b.node)
			continue
		}
		failed = append(failed, fmt.Sprintf("%s: %v", b.node, b.err))
		if first == nil {
			first = &errdefs.Error{Code: errdefs.Code(b.err)}
			var e *errdefs.Error
			if errors.As(b.err, &e) {
				first.Field = e.Field
			}
		}
	}
	first.Message = fmt.Sprintf("%s: failed on %d of %d nodes (%s)", what, len(failed), len(builds), strings.Join(failed, "; "))
	if len(done) > 0 {
		first.Message += fmt.Sprintf("; done on %s", strings.Join(done, ", "))
	}
	return first
}

// deleteTemplate is DELETE /v1/templates/{name}: the template removed
// from every Ready node that has it. A node where a sandbox still uses it
// refuses (failed_precondition, as a daemon does); the answer then names
// it, and the nodes it was removed from. None having it is not_found.
func (g *Gateway) deleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, ok := templateChange(w, r, p, "a template delete")
	if !ok {
		return
	}
	nodes, err := g.readyNodes()
	if err != nil {
		writeError(w, err)
		return
	}
	// The cluster's record says deleted before any node removes it: the
	// leader then removes it from the nodes that refuse once they can, and
	// from nodes that were not Ready, and copies it nowhere. Recorded
	// after, a node that had just removed it looked to the leader like
	// one that missed a copy, and got it back from a node that refused.
	// If no node removes it, the record is put back as it was.
	rctx := context.WithoutCancel(r.Context())
	undo := g.recordDeleting(rctx, name)
	dels := g.eachNode(nodes, func(_ int, t nodeTarget) (*http.Response, error) {
		return nil, g.nodeCall(r.Context(), t, http.MethodDelete, "/v1/templates/"+name, nil, nil)
	})
	if !slices.ContainsFunc(dels, func(d *nodeOutcome) bool { return d.err == nil }) {
		undo()
	}
	if err := removedFromNodes(fmt.Sprintf("template %q", name), "name", dels); err != nil {
		writeError(w, err)
		return
	}
	g.log.Info("template_deleted", "template", name)
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if err := g.awaitNodeTemplates(r.Context(), name, names, false); err != nil {
		g.log.Warn("template_deleted_unreported", "template", name, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// nodesWith are the Ready Berth nodes whose annotation lists template
// name (as the cache shows them); not_found on name when none does.
func (g *Gateway) nodesWith(name string) ([]*corev1.Node, error) {
	nodes, err := g.readyNodes()
	if err != nil {
		return nil, err
	}
	nodes = slices.DeleteFunc(nodes, func(n *corev1.Node) bool {
		return !nodeHasTemplate(n, name)
	})
	if len(nodes) == 0 {
		return nil, &errdefs.Error{Code: errdefs.CodeNotFound, Field: "name", Message: fmt.Sprintf("template %q: no Ready Berth node has it", name)}
	}
	return nodes, nil
}

// callNodes sends one request (method, path, with in as its JSON body
// when not nil) to each of nodes at once and returns each node's JSON
// answer, in the nodes' order. A node that refused is named in the error
// (nodesFailed, for what), with the nodes it was done on.
func (g *Gateway) callNodes(ctx context.Context, nodes []*corev1.Node, what, method, path string, in any) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, len(nodes))
	res := g.eachNode(nodes, func(i int, t nodeTarget) (*http.Response, error) {
		return nil, g.nodeCall(ctx, t, method, path, in, &out[i])
	})
	if slices.ContainsFunc(res, func(b *nodeOutcome) bool { return b.err != nil }) {
		return nil, nodesFailed(what, res)
	}
	return out, nil
}

// decodeAll decodes each node's answer into a T.
func decodeAll[T any](raws []json.RawMessage) ([]T, error) {
	out := make([]T, len(raws))
	for i, raw := range raws {
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			return nil, fmt.Errorf("a node's answer: %v: %w", err, errdefs.ErrUnavailable)
		}
	}
	return out, nil
}

// setTemplateIsolation is PUT /v1/templates/{name}/isolation: the
// template's default level set on every Ready node that has it; the
// answer is the template as the list shows it.
func (g *Gateway) setTemplateIsolation(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, ok := templateChange(w, r, p, "a template's isolation")
	if !ok {
		return
	}
	var in apitypes.TemplateIsolationRequest
	if err := decodeBody(r, &in, false, `{"isolation"}`); err != nil {
		writeError(w, err)
		return
	}
	if in.Isolation != "" && !slices.Contains(core.Isolations(), in.Isolation) {
		writeError(w, fieldErr("isolation", errdefs.ErrInvalidArgument, "isolation %q: want one of %s (or empty for the daemons' default)", in.Isolation, strings.Join(core.Isolations(), ", ")))
		return
	}
	nodes, err := g.nodesWith(name)
	if err != nil {
		writeError(w, err)
		return
	}
	raws, err := g.callNodes(r.Context(), nodes, "template "+name, http.MethodPut, "/v1/templates/"+name+"/isolation", in)
	if err != nil {
		writeError(w, err)
		return
	}
	got, err := decodeAll[apitypes.Template](raws)
	if err != nil {
		writeError(w, err)
		return
	}
	answers := make([]nodeTemplates, len(nodes))
	for i, n := range nodes {
		answers[i] = nodeTemplates{node: n.Name, tpls: []apitypes.Template{got[i]}}
	}
	g.log.Info("template_isolation_set", "template", name, "isolation", in.Isolation, "nodes", len(nodes))
	writeJSON(w, http.StatusOK, mergeTemplates(answers).Templates[0])
}

// setWarm is PUT /v1/templates/{name}/warm: the daemons' warm pool of the
// template, target sandboxes on every Ready node that has it (a pod's
// create on a node claims from its node's pool, as any create of its
// daemon does). The answer sums the nodes' pools.
func (g *Gateway) setWarm(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name, ok := templateChange(w, r, p, "a warm pool")
	if !ok {
		return
	}
	var in apitypes.WarmRequest
	if err := decodeBody(r, &in, false, `{"target","allow_sudo"}`); err != nil {
		writeError(w, err)
		return
	}
	if in.Target == nil {
		writeError(w, fieldErr("target", errdefs.ErrInvalidArgument, "target is required: the warm sandboxes each node keeps"))
		return
	}
	nodes, err := g.nodesWith(name)
	if err != nil {
		writeError(w, err)
		return
	}
	raws, err := g.callNodes(r.Context(), nodes, "template "+name, http.MethodPut, "/v1/templates/"+name+"/warm", in)
	if err != nil {
		writeError(w, err)
		return
	}
	got, err := decodeAll[apitypes.WarmPool](raws)
	if err != nil {
		writeError(w, err)
		return
	}
	sum := apitypes.WarmPool{AllowSudo: in.AllowSudo}
	for _, wp := range got {
		sum.Target += wp.Target
		sum.Ready += wp.Ready
	}
	g.log.Info("template_warm_set", "template", name, "target", *in.Target, "allow_sudo", in.AllowSudo, "nodes", len(nodes))
	writeJSON(w, http.StatusOK, sum)
}

// pruneTemplates is POST /v1/templates/prune: every Ready node's daemon
// removes the layers none of its templates uses (each refuses while a
// sandbox stands on older layers, as a single daemon does); the answer
// sums what they removed.
func (g *Gateway) pruneTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	got, err := everyNode[apitypes.TemplatePruneResult](g, r.Context(), p, "a template prune", http.MethodPost, "/v1/templates/prune", nil)
	if err != nil {
		writeError(w, err)
		return
	}
	var sum apitypes.TemplatePruneResult
	for _, p := range got {
		sum.RemovedLayers += p.RemovedLayers
		sum.FreedBytes += p.FreedBytes
	}
	writeJSON(w, http.StatusOK, sum)
}

// everyNode is an admin's (what names it in a refusal) one request to
// every Ready node, each node's answer decoded into a T (callNodes).
func everyNode[T any](g *Gateway, ctx context.Context, p auth.Principal, what, method, path string, in any) ([]T, error) {
	if err := adminOnly(p, what); err != nil {
		return nil, err
	}
	nodes, err := g.readyNodes()
	if err != nil {
		return nil, err
	}
	raws, err := g.callNodes(ctx, nodes, what, method, path, in)
	if err != nil {
		return nil, err
	}
	return decodeAll[T](raws)
}
