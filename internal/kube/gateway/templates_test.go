package gateway

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/node"
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
	if minimal.Name != "minimal" || !minimal.Built || minimal.SizeBytes != 1<<20 || !slices.Equal(minimal.Nodes, []string{"berth-a"}) ||
		minimal.Warm == nil || *minimal.Warm != (types.WarmPool{Target: 1, Ready: 1}) {
		t.Errorf("minimal = %+v, want built, 1 MiB, on berth-a, with the node's warm pool", minimal)
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
	// Changes take an admin key (none of these keys is one).
	for _, rt := range []struct{ method, path string }{
		{"POST", "/v1/templates"},
		{"POST", "/v1/templates/base/build"},
		{"DELETE", "/v1/templates/base"},
		{"POST", "/v1/templates/prune"},
		{"GET", "/v1/templates/base/export"},
		{"POST", "/v1/templates/import"},
	} {
		if code, eb := e.call(t, rt.method, rt.path, keyAlice, `{"name":"py","image":"python:3"}`, nil); code != 403 || eb.Code != errdefs.CodePermissionDenied {
			t.Errorf("%s %s by a plain key = %d %+v, want permission_denied", rt.method, rt.path, code, eb)
		}
	}
	if code, eb := e.call(t, "PUT", "/v1/templates/minimal/warm", keyAlice, `{"target":1}`, nil); code != 403 {
		t.Errorf("PUT warm by a plain key = %d %+v, want permission_denied", code, eb)
	}
}

// TestTemplateChanges: the operator makes, builds and removes a template
// on the nodes through the gateway; the answer streams like a daemon's,
// each log line naming its node, and ends with the template; refusals
// before any build are plain errors naming the field.
func TestTemplateChanges(t *testing.T) {
	e := startGateway(t, false)
	stream := func(method, path, body string) (int, []types.BuildLine) {
		t.Helper()
		code, data, _ := e.e2bCall(t, method, path, "", body, nil)
		var lines []types.BuildLine
		for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
			var bl types.BuildLine
			if err := json.Unmarshal([]byte(l), &bl); err != nil {
				t.Fatalf("%s %s: line %q: %v", method, path, l, err)
			}
			lines = append(lines, bl)
		}
		return code, lines
	}
	// The node reports what its daemon has in its annotation; the fake
	// one does as a real one would once these are made (a build answers
	// once the annotation shows its template).
	report := func(names string) {
		t.Helper()
		n, err := e.kube.CoreV1().Nodes().Get(t.Context(), "berth-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Annotations[node.AnnotationTemplates] = names
		if _, err := e.kube.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	report("base,df,minimal,py")
	code, lines := stream("POST", "/v1/templates", `{"name":"py","image":"python:3"}`)
	if code != 200 || len(lines) != 2 || lines[0].Log == nil || *lines[0].Log != "[berth-a] pulling python:3\n" {
		t.Fatalf("create from an image = %d %+v", code, lines)
	}
	if tpl := lines[1].Template; tpl == nil || tpl.Name != "py" || !tpl.Built || tpl.Source != "image python:3" || !slices.Equal(tpl.Nodes, []string{"berth-a"}) {
		t.Errorf("created template = %+v", lines[1])
	}
	code, lines = stream("POST", "/v1/templates/base/build", "")
	if code != 200 || len(lines) != 2 || lines[1].Template == nil || lines[1].Template.Name != "base" {
		t.Errorf("build = %d %+v", code, lines)
	}
	// What was made is the cluster's (templatesync.go); a build of what
	// a node has records nothing.
	record := func() map[string]templateState {
		t.Helper()
		cm, err := e.kube.CoreV1().ConfigMaps(ns).Get(t.Context(), TemplatesConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the template record: %v", err)
		}
		return templateStates(cm)
	}
	if rec := record(); len(rec) != 1 || rec["py"].How != "image python:3" || rec["py"].Deleted || rec["py"].At.IsZero() {
		t.Errorf("record after a create and a build = %+v, want py, made from its image", rec)
	}
	// A Dockerfile build: the context and the query reach the node as
	// they came.
	code, lines = stream("POST", "/v1/templates/df/dockerfile?dockerfile=Dockerfile&build_arg=A%3D1", "tar bytes")
	if code != 200 || len(lines) != 2 || lines[0].Log == nil || *lines[0].Log != "[berth-a] context \"tar bytes\" (application/x-tar), query dockerfile=Dockerfile&build_arg=A%3D1\n" ||
		lines[1].Template == nil || lines[1].Template.Name != "df" {
		t.Errorf("Dockerfile build = %d %+v", code, lines)
	}
	// A build that fails on the node ends the stream with its error.
	code, lines = stream("POST", "/v1/templates/broken/build", "")
	if last := lines[len(lines)-1]; code != 200 || last.Error == nil || last.Error.Code != errdefs.CodeInternal || !strings.Contains(last.Error.Message, "berth-a: step 2 failed") {
		t.Errorf("failed build = %d %+v", code, lines)
	}
	// Refused by every node before a build starts: plain, as a daemon's.
	if code, eb := e.call(t, "POST", "/v1/templates", "", `{"name":"py","image":"registry.example/nope:1"}`, nil); code != 404 || eb.Code != errdefs.CodeNotFound || eb.Field != "image" {
		t.Errorf("create from an image that does not exist = %d %+v, want not_found on image", code, eb)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"name":"Bad Name","image":"python:3"}`, "name"},
		{`{"name":"py"}`, "image"},
		{`{"name":"py","image":"python:3","colour":"red"}`, "body"},
	} {
		if code, eb := e.call(t, "POST", "/v1/templates", "", tc.body, nil); code != 400 || eb.Field != tc.field {
			t.Errorf("create %s = %d %+v, want invalid_argument on %s", tc.body, code, eb, tc.field)
		}
	}
	// A template's default isolation and warm pool, set on the nodes
	// that have it.
	var tpl types.Template
	if code, eb := e.call(t, "PUT", "/v1/templates/minimal/isolation", "", `{"isolation":"gvisor"}`, &tpl); code != 200 || tpl.Isolation != "gvisor" || !slices.Equal(tpl.Nodes, []string{"berth-a"}) {
		t.Errorf("set isolation = %d %+v %+v", code, eb, tpl)
	}
	var pool types.WarmPool
	if code, eb := e.call(t, "PUT", "/v1/templates/minimal/warm", "", `{"target":4,"allow_sudo":true}`, &pool); code != 200 || pool != (types.WarmPool{Target: 4, Ready: 2, AllowSudo: true}) {
		t.Errorf("set warm = %d %+v %+v", code, eb, pool)
	}
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/templates/minimal/isolation", `{"isolation":"vm"}`, "isolation"},
		{"/v1/templates/minimal/warm", `{}`, "target"},
		{"/v1/templates/minimal/warm", `{"target":65}`, "target"},
		{"/v1/templates/minimal/warm", `{"target":"x"}`, "target"},
	} {
		if code, eb := e.call(t, "PUT", tc.path, "", tc.body, nil); code != 400 || eb.Field != tc.field {
			t.Errorf("PUT %s %s = %d %+v, want invalid_argument on %s", tc.path, tc.body, code, eb, tc.field)
		}
	}
	if code, eb := e.call(t, "PUT", "/v1/templates/nope/warm", "", `{"target":1}`, nil); code != 404 || eb.Field != "name" {
		t.Errorf("warm pool of a template no node has = %d %+v, want not_found on name", code, eb)
	}

	var pruned types.TemplatePruneResult
	if code, eb := e.call(t, "POST", "/v1/templates/prune", "", "", &pruned); code != 200 || pruned != (types.TemplatePruneResult{RemovedLayers: 2, FreedBytes: 5 << 20}) {
		t.Errorf("prune = %d %+v %+v", code, eb, pruned)
	}

	report("base,df,minimal")
	// The record says deleted before a node is asked to remove it: the
	// leader must never take a node that has just removed it for one
	// that missed a copy.
	var mu sync.Mutex
	deletedFirst := map[string]bool{}
	seen := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		deletedFirst[name] = record()[name].Deleted
	}
	onTemplateDelete.Store(&seen)
	t.Cleanup(func() { onTemplateDelete.Store(nil) })
	if code, eb := e.call(t, "DELETE", "/v1/templates/py", "", "", nil); code != 204 {
		t.Errorf("delete = %d %+v", code, eb)
	}
	if rec := record(); !rec["py"].Deleted || rec["df"].How != "dockerfile" {
		t.Errorf("record after the delete = %+v, want py deleted, df from a Dockerfile", rec)
	}
	// A delete no node carries out leaves the record as it was: none
	// for a template nobody has, the recorded one for one in use.
	if code, eb := e.call(t, "DELETE", "/v1/templates/nope", "", "", nil); code != 404 || eb.Field != "name" {
		t.Errorf("delete of a template no node has = %d %+v, want not_found", code, eb)
	}
	if code, eb := e.call(t, "DELETE", "/v1/templates/inuse", "", "", nil); code != 409 || eb.Code != errdefs.CodeFailedPrecondition || !strings.Contains(eb.Message, "berth-a") {
		t.Errorf("delete of a template in use = %d %+v, want failed_precondition naming the node", code, eb)
	}
	mu.Lock()
	if !deletedFirst["py"] || !deletedFirst["nope"] || !deletedFirst["inuse"] {
		t.Errorf("recorded deleted as the node was asked: %v, want every one", deletedFirst)
	}
	mu.Unlock()
	rec := record()
	_, nope := rec["nope"]
	if _, inuse := rec["inuse"]; nope || inuse || !rec["py"].Deleted {
		t.Errorf("record after deletes no node carried out = %+v, want no nope or inuse, py deleted", rec)
	}
}

// TestNodesFailed: a change that failed on some nodes names each failure
// and the nodes it went through on, with the first failure's class.
func TestNodesFailed(t *testing.T) {
	err := nodesFailed("template py", []*nodeOutcome{
		{node: "a"},
		{node: "b", err: &errdefs.Error{Code: errdefs.CodeNotFound, Field: "image", Message: "node b: no such image"}},
		{node: "c", err: errors.New("unreachable")},
	})
	var e *errdefs.Error
	if !errors.As(err, &e) || e.Code != errdefs.CodeNotFound || e.Field != "image" ||
		e.Message != "template py: failed on 2 of 3 nodes (b: node b: no such image; c: unreachable); done on a" {
		t.Errorf("nodesFailed = %#v", err)
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
	if c.Name != "c" || !c.Built || c.Warm == nil || *c.Warm != (types.WarmPool{Target: 2}) || c.WarmSudo != nil {
		t.Errorf("c = %+v, want built, with n1's warm pool", c)
	}
	if empty := mergeTemplates(nil); empty.Templates == nil || len(empty.Templates) != 0 {
		t.Errorf("no answers: %+v, want an empty list (not null)", empty)
	}
}

// TestRegistries: registry logins are set on, listed from and removed from
// every Ready node, by admins only.
func TestRegistries(t *testing.T) {
	e := startGateway(t, false)
	var list types.RegistryList
	if code, eb := e.call(t, "GET", "/v1/registries", "", "", &list); code != 200 || len(list.Registries) != 1 || list.Registries[0] != (types.RegistryLogin{Registry: "ghcr.io", Username: "ci"}) {
		t.Errorf("list = %d %+v %+v", code, eb, list)
	}
	var login types.RegistryLogin
	if code, eb := e.call(t, "PUT", "/v1/registries/registry.example", "", `{"username":"bot","password":"s3cret"}`, &login); code != 200 || login != (types.RegistryLogin{Registry: "registry.example", Username: "bot"}) {
		t.Errorf("login = %d %+v %+v", code, eb, login)
	}
	if code, eb := e.call(t, "PUT", "/v1/registries/registry.example", "", `{"username":"bot","password":"wrong"}`, nil); code != 401 || eb.Code != errdefs.CodeUnauthenticated || !strings.Contains(eb.Message, "berth-a") {
		t.Errorf("refused login = %d %+v, want unauthenticated naming the node", code, eb)
	}
	if code, eb := e.call(t, "PUT", "/v1/registries/registry.example", "", `{"username":"bot"}`, nil); code != 400 || eb.Field != "password" {
		t.Errorf("login without a password = %d %+v, want invalid_argument on password", code, eb)
	}
	if code, eb := e.call(t, "DELETE", "/v1/registries/ghcr.io", "", "", nil); code != 204 {
		t.Errorf("logout = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "DELETE", "/v1/registries/none.example", "", "", nil); code != 404 || eb.Field != "host" {
		t.Errorf("logout without a login = %d %+v, want not_found on host", code, eb)
	}
	keyed := startGateway(t, true)
	if code, eb := keyed.call(t, "GET", "/v1/registries", keyAlice, "", nil); code != 403 {
		t.Errorf("list by a plain key = %d %+v, want permission_denied", code, eb)
	}
}

// TestTemplateStale: a node's build of a recorded template is stale when
// it is none of the record's builds; where the node or the record names
// no build, when it is older than the record's build start; a node that
// says neither is current.
func TestTemplateStale(t *testing.T) {
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	cur, old := strings.Repeat("c", 32), strings.Repeat("0", 32)
	nodeWith := func(builtAt time.Time, id string) *corev1.Node {
		ann := map[string]string{}
		if !builtAt.IsZero() {
			ann[node.AnnotationTemplateBuilds] = "py=" + strconv.FormatInt(builtAt.Unix(), 10)
		}
		if id != "" {
			ann[node.AnnotationTemplateBuildIDs] = "other=" + old + ",py=" + id
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}
	}
	byID := templateState{Built: at, BuildIDs: []string{cur, strings.Repeat("d", 32)}}
	byTime := templateState{Built: at}
	for _, c := range []struct {
		what  string
		st    templateState
		n     *corev1.Node
		stale bool
	}{
		{"the recorded build, built before the record says (clocks apart)", byID, nodeWith(at.Add(-time.Hour), cur), false},
		{"another build, built after the record says (clocks apart)", byID, nodeWith(at.Add(time.Hour), old), true},
		{"no build named: by the clock, older", byID, nodeWith(at.Add(-time.Second), ""), true},
		{"no build named: by the clock, not older", byID, nodeWith(at, ""), false},
		{"a record naming no build: by the clock", byTime, nodeWith(at.Add(-time.Second), cur), true},
		{"a node that says nothing", byID, nodeWith(time.Time{}, ""), false},
		{"a record with neither", templateState{}, nodeWith(at.Add(-time.Hour), old), false},
	} {
		if got := c.st.stale(c.n, "py"); got != c.stale {
			t.Errorf("%s: stale = %v, want %v", c.what, got, c.stale)
		}
	}
}
