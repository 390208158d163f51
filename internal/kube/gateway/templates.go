package gateway

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
)

// Templates on the gateway are read only: each node's daemon has its own
// (built with `berth template build` on the node, or shipped with it), and
// the gateway lists what the Ready nodes have, asking each node's data
// plane (GET /v1/templates, the daemon's list). A create's template check
// reads the nodes' annotation instead (create.go), with no node call.

// templateListConcurrency bounds the node calls of one template list;
// templateNodeTimeout bounds each.
const (
	templateListConcurrency = 16
	templateNodeTimeout     = 10 * time.Second
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
	nodes, err := g.nodes.List(everything())
	if err != nil {
		return apitypes.TemplateList{}, err
	}
	nodes = slices.DeleteFunc(slices.Clone(nodes), func(n *corev1.Node) bool { return !nodeReady(n) })
	if len(nodes) == 0 {
		return apitypes.TemplateList{}, fmt.Errorf("no Berth node is Ready: %w", errdefs.ErrUnavailable)
	}
	answers := make([]nodeTemplates, len(nodes))
	sem := make(chan struct{}, templateListConcurrency)
	var wg sync.WaitGroup
	for i, n := range nodes {
		answers[i].node = n.Name
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t, err := g.nodeAt(n.Name)
			if err != nil {
				answers[i].err = err
				return
			}
			cctx, cancel := context.WithTimeout(ctx, templateNodeTimeout)
			defer cancel()
			var list apitypes.TemplateList
			answers[i].err = g.nodeCall(cctx, t, http.MethodGet, "/v1/templates", nil, &list)
			answers[i].tpls = list.Templates
		})
	}
	wg.Wait()
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
// every one of them has it built. Warm pools are a node's own and are
// left out. Templates are sorted by name.
func mergeTemplates(answers []nodeTemplates) apitypes.TemplateList {
	slices.SortFunc(answers, func(a, b nodeTemplates) int { return cmp.Compare(a.node, b.node) })
	type merged struct {
		t        apitypes.Template
		nodes    []string
		allBuilt bool
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
		}
	}
	out.Templates = make([]apitypes.Template, 0, len(byName))
	for _, m := range byName {
		t := m.t
		t.Warm, t.WarmSudo = nil, nil
		t.Nodes, t.Built = m.nodes, m.allBuilt
		out.Templates = append(out.Templates, t)
	}
	slices.SortFunc(out.Templates, func(a, b apitypes.Template) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
