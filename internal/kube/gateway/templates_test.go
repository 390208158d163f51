package gateway

import (
	"errors"
	"slices"
	"testing"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// TestTemplates: the gateway lists the Ready nodes' templates, read only,
// with the nodes that have each; every other template route is
// not_implemented.
func TestTemplates(t *testing.T) {
	e := startGateway(t, true)
	var list types.TemplateList
	if code, eb := e.call(t, "GET", "/v1/templates", keyAlice, "", &list); code != 200 {
		t.Fatalf("list = %d %+v", code, eb)
	}
	if len(list.Templates) != 2 || len(list.UnreachableNodes) != 0 {
		t.Fatalf("list = %+v, want base and minimal", list)
	}
	base, minimal := list.Templates[0], list.Templates[1]
	if base.Name != "base" || base.Built || !slices.Equal(base.Nodes, []string{"berth-a"}) {
		t.Errorf("base = %+v, want not built, on berth-a", base)
	}
	if minimal.Name != "minimal" || !minimal.Built || minimal.SizeBytes != 1<<20 || !slices.Equal(minimal.Nodes, []string{"berth-a"}) || minimal.Warm != nil {
		t.Errorf("minimal = %+v, want built, 1 MiB, on berth-a, without the node's warm pool", minimal)
	}
	var one types.Template
	if code, eb := e.call(t, "GET", "/v1/templates/minimal", keyAlice, "", &one); code != 200 || one.Name != "minimal" || !one.Built {
		t.Errorf("get minimal = %d %+v %+v", code, eb, one)
	}
	if code, eb := e.call(t, "GET", "/v1/templates/nope", keyAlice, "", nil); code != 404 || eb.Code != errdefs.CodeNotFound || eb.Field != "name" {
		t.Errorf("get of a template no node has = %d %+v, want not_found on name", code, eb)
	}
	if code, eb := e.call(t, "GET", "/v1/templates", "", "", nil); code != 401 {
		t.Errorf("list without a key = %d %+v, want 401", code, eb)
	}
	for _, rt := range []struct{ method, path string }{
		{"POST", "/v1/templates"},
		{"POST", "/v1/templates/base/build"},
		{"PUT", "/v1/templates/base/warm"},
		{"DELETE", "/v1/templates/base"},
	} {
		if code, eb := e.call(t, rt.method, rt.path, keyAlice, "{}", nil); code != 501 || eb.Code != errdefs.CodeNotImplemented {
			t.Errorf("%s %s = %d %+v, want not_implemented", rt.method, rt.path, code, eb)
		}
	}
}

// TestMergeTemplates: one entry per template, as the first node (by name)
// with it built shows it, built only where every node has it built; a
// node that did not answer is named.
func TestMergeTemplates(t *testing.T) {
	got := mergeTemplates([]nodeTemplates{
		{node: "n3", err: errors.New("unreachable")},
		{node: "n2", tpls: []types.Template{{Name: "a", Built: true, SizeBytes: 2}, {Name: "b", Built: true}}},
		{node: "n1", tpls: []types.Template{{Name: "a", SizeBytes: 1}, {Name: "c", Built: true, Warm: &types.WarmPool{Target: 2}}}},
	})
	if !slices.Equal(got.UnreachableNodes, []string{"n3"}) || len(got.Templates) != 3 {
		t.Fatalf("merged = %+v", got)
	}
	a, b, c := got.Templates[0], got.Templates[1], got.Templates[2]
	if a.Name != "a" || a.Built || a.SizeBytes != 2 || !slices.Equal(a.Nodes, []string{"n1", "n2"}) {
		t.Errorf("a = %+v, want n2's record (built there), not built everywhere, on n1 and n2", a)
	}
	if b.Name != "b" || !b.Built || !slices.Equal(b.Nodes, []string{"n2"}) {
		t.Errorf("b = %+v", b)
	}
	if c.Name != "c" || !c.Built || c.Warm != nil {
		t.Errorf("c = %+v, want built, without n1's warm pool", c)
	}
	if empty := mergeTemplates(nil); empty.Templates == nil || len(empty.Templates) != 0 {
		t.Errorf("no answers: %+v, want an empty list (not null)", empty)
	}
}
