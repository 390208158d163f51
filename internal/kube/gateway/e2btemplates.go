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
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// E2B's template build API on the gateway. A build runs on one node, the
// first Ready one by name when it is asked for (its builder): the
// request, the uploads of its copy steps, its trigger and its status
// polls all go to that node's daemon, whose own E2B builder runs it (its
// step cache, build sandboxes and build network), through the node's data
// plane (node.E2BPrefix). What it made is then the cluster's: the first
// status poll that finds the build ready records its template in
// TemplatesConfigMap, as built when the build was asked for, and the
// leader copies it to every other Ready node (templatesync.go); the
// status says "building" until every Ready node has it, so a create right
// after lands on any node. A build's tags are the cluster's too, in
// E2BTagsConfigMap: a create, fromTemplate, Template.exists and the tag
// routes read them there, from any gateway replica.

// E2BTagsConfigMap records E2B's template tags: a key per template name,
// its tags' entries (tag → e2bwire.TagEntry) as JSON.
const E2BTagsConfigMap = "berth-e2b-tags"

// e2bBuildSpread bounds how long a build's status says "building" after
// its node built it, while the leader copies it to the other nodes: past
// it, the build is reported ready as its node has it (the copies go on).
const e2bBuildSpread = 10 * time.Minute

// maxE2BStatus bounds a build status the gateway reads (its log lines).
const maxE2BStatus = 128 << 20

// e2bTemplateRoutes registers E2B's template build and tag routes.
func (g *Gateway) e2bTemplateRoutes() {
	m := g.mux
	m.HandleFunc("POST /v3/templates", g.e2bAuthed(e2bAdmin(g.e2bBuildRequest)))
	m.HandleFunc("GET /templates/{templateID}/files/{hash}", g.e2bAuthed(e2bAdmin(g.e2bUploadLink)))
	m.HandleFunc("PUT /templates/{templateID}/files/{hash}", g.e2bUpload)
	m.HandleFunc("POST /v2/templates/{templateID}/builds/{buildID}", g.e2bAuthed(e2bAdmin(g.e2bBuildTrigger)))
	m.HandleFunc("GET /templates/{templateID}/builds/{buildID}/status", g.e2bAuthed(e2bAdmin(g.e2bBuildStatus)))
	// /templates/aliases/{alias} and /templates/{id}/tags overlap as
	// patterns; one handler tells them apart.
	m.HandleFunc("GET /templates/{a}/{b}", g.e2bAuthed(g.e2bAliasOrTags))
	m.HandleFunc("POST /templates/tags", g.e2bAuthed(e2bAdmin(g.e2bAssignTags)))
	m.HandleFunc("DELETE /templates/tags", g.e2bAuthed(e2bAdmin(g.e2bRemoveTags)))
}

type e2bHandler = func(http.ResponseWriter, *http.Request, auth.Principal)

// e2bAdmin lets only admin keys through, as a daemon's E2B template API:
// templates are every key's.
func e2bAdmin(h e2bHandler) e2bHandler {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		if !p.Admin() {
			e2bwire.WriteError(w, http.StatusForbidden, "template builds need an admin API key (`berth apikey create --admin`): templates are shared by every key of the cluster")
			return
		}
		h(w, r, p)
	}
}

// e2bNodeDo sends an E2B template request to node t's daemon and returns
// its answer, whatever its status (the caller closes its body).
func (g *Gateway) e2bNodeDo(ctx context.Context, t nodeTarget, method, path, rawQuery string, body io.Reader) (*http.Response, error) {
	u := "https://" + t.addr + node.DataPlanePrefix + node.E2BPrefix + path
	if rawQuery != "" {
		u += "?" + rawQuery
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Transport: g.cfg.NodeTransport}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s unreachable: %v: %w", t.node, err, errdefs.ErrUnavailable)
	}
	return resp, nil
}

// e2bBuilders is the nodes a build of the cluster may be on, its builder
// (the first Ready one by name) first.
func (g *Gateway) e2bBuilders() ([]nodeTarget, error) {
	nodes, err := g.readyNodes()
	if err != nil {
		return nil, err
	}
	var out []nodeTarget
	var errs []error
	for _, n := range nodes {
		t, err := g.nodeAt(n.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// e2bOnBuildNode sends a request about a build to its node: the builder
// first, then, while the answer is 404, each other Ready node (the
// builder may have changed since the build was asked for). The last
// answer is returned.
func (g *Gateway) e2bOnBuildNode(ctx context.Context, method, path, rawQuery string, body []byte) (*http.Response, nodeTarget, error) {
	nodes, err := g.e2bBuilders()
	if err != nil {
		return nil, nodeTarget{}, err
	}
	var last *http.Response
	var lastNode nodeTarget
	var errs []error
	for _, t := range nodes {
		var in io.Reader
		if body != nil {
			in = bytes.NewReader(body)
		}
		resp, err := g.e2bNodeDo(ctx, t, method, path, rawQuery, in)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if resp.StatusCode != http.StatusNotFound {
			if last != nil {
				last.Body.Close()
			}
			return resp, t, nil
		}
		if last != nil {
			last.Body.Close()
		}
		last, lastNode = resp, t
	}
	if last == nil {
		return nil, nodeTarget{}, errors.Join(errs...)
	}
	return last, lastNode, nil
}

// e2bTemplateID is the path's templateID, a template name; ok is false
// (and the refusal answered) when it is none.
func e2bTemplateID(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("templateID")
	if err := apitypes.ValidTemplateName(name); err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("templateID: %w", err))
		return "", false
	}
	return name, true
}

// e2bBody reads a request's body (at most maxBody), to send on to a
// node; ok is false (and the refusal answered) when it cannot.
func e2bBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		e2bwire.WriteError(w, http.StatusBadRequest, fmt.Sprintf("read request body: %v", err))
		return nil, false
	}
	return body, true
}

// passOn answers with a node's answer as it is.
func passOn(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	for k, v := range resp.Header {
		switch k {
		case "Connection", "Content-Length", "Transfer-Encoding", "Keep-Alive":
		default:
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body) // the client went away: nobody to tell
}

// e2bBuildRequest is POST /v3/templates: a build asked of the builder.
func (g *Gateway) e2bBuildRequest(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	body, ok := e2bBody(w, r)
	if !ok {
		return
	}
	nodes, err := g.e2bBuilders()
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	resp, err := g.e2bNodeDo(r.Context(), nodes[0], http.MethodPost, "/v3/templates", "", bytes.NewReader(body))
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	passOn(w, resp)
}

// e2bUploadLink is GET /templates/{id}/files/{hash}: the builder's answer,
// its link made the gateway's (naming the node, whose signature it is).
func (g *Gateway) e2bUploadLink(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	name, ok := e2bTemplateID(w, r)
	if !ok {
		return
	}
	hash := r.PathValue("hash")
	nodes, err := g.e2bBuilders()
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	t := nodes[0]
	resp, err := g.e2bNodeDo(r.Context(), t, http.MethodGet, "/templates/"+name+"/files/"+url.PathEscape(hash), "", nil)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if resp.StatusCode != http.StatusCreated {
		passOn(w, resp)
		return
	}
	defer resp.Body.Close()
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url,omitempty"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&link); err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("node %s: upload link: %v: %w", t.node, err, errdefs.ErrUnavailable))
		return
	}
	if link.URL != "" {
		u, err := url.Parse(link.URL)
		if err != nil {
			e2bwire.WriteErr(w, fmt.Errorf("node %s: upload link %q: %v: %w", t.node, link.URL, err, errdefs.ErrUnavailable))
			return
		}
		q := u.Query()
		q.Set("node", t.node)
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		link.URL = (&url.URL{Scheme: scheme, Host: r.Host, Path: u.Path, RawQuery: q.Encode()}).String()
	}
	e2bwire.WriteJSON(w, http.StatusCreated, link)
}

// e2bUpload is the PUT of an upload link: to the node it names, whose
// daemon checks the signature (the link's only authentication).
func (g *Gateway) e2bUpload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("node")
	q.Del("node")
	n, err := g.nodes.Get(name)
	if err != nil || !nodeReady(n) {
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("upload link: node %q is not a Ready Berth node: ask for a new link", name))
		return
	}
	t, err := g.nodeAt(name)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	path := "/templates/" + url.PathEscape(r.PathValue("templateID")) + "/files/" + url.PathEscape(r.PathValue("hash"))
	resp, err := g.e2bNodeDo(r.Context(), t, http.MethodPut, path, q.Encode(), r.Body)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	passOn(w, resp)
}

// e2bBuildTrigger is POST /v2/templates/{id}/builds/{build}: the steps, to
// the build's node. A fromTemplate that is one of the cluster's tags goes
// as the template it names.
func (g *Gateway) e2bBuildTrigger(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	name, ok := e2bTemplateID(w, r)
	if !ok {
		return
	}
	build := r.PathValue("buildID")
	body, ok := e2bBody(w, r)
	if !ok {
		return
	}
	var in map[string]json.RawMessage
	if json.Unmarshal(body, &in) == nil {
		var from string
		if json.Unmarshal(in["fromTemplate"], &from) == nil && strings.Contains(from, ":") {
			target, ok, err := g.e2bResolve(r.Context(), from)
			if err != nil {
				e2bwire.WriteErr(w, err)
				return
			}
			if ok {
				in["fromTemplate"], _ = json.Marshal(target)
				body, _ = json.Marshal(in)
			}
		}
	}
	resp, _, err := g.e2bOnBuildNode(r.Context(), http.MethodPost, "/v2/templates/"+name+"/builds/"+url.PathEscape(build), "", body)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	passOn(w, resp)
}

// e2bBuildStatus is GET /templates/{id}/builds/{build}/status: the build
// node's answer; a build it finished is recorded as the cluster's and
// reported ready once every Ready node has it.
func (g *Gateway) e2bBuildStatus(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	name, ok := e2bTemplateID(w, r)
	if !ok {
		return
	}
	build := r.PathValue("buildID")
	resp, t, err := g.e2bOnBuildNode(r.Context(), http.MethodGet, "/templates/"+name+"/builds/"+url.PathEscape(build)+"/status", r.URL.RawQuery, nil)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if resp.StatusCode != http.StatusOK {
		passOn(w, resp)
		return
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxE2BStatus))
	resp.Body.Close()
	var body map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(data, &body)
	}
	if err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("node %s: build status: %v: %w", t.node, err, errdefs.ErrUnavailable))
		return
	}
	var st struct {
		Status, Template, BuildID string
		Tags                      []string
		Requested, Updated        time.Time
	}
	// The fields Berth's daemons add to E2B's (checked below).
	for k, v := range map[string]any{"status": &st.Status, e2bwire.BuildTemplateField: &st.Template, e2bwire.BuildTagsField: &st.Tags,
		e2bwire.BuildRequestedField: &st.Requested, e2bwire.BuildUpdatedField: &st.Updated, e2bwire.BuildIDField: &st.BuildID} {
		if raw, ok := body[k]; ok {
			_ = json.Unmarshal(raw, v)
		}
	}
	if st.Status == "ready" {
		if apitypes.ValidTemplateName(st.Template) != nil || st.Requested.IsZero() {
			e2bwire.WriteErr(w, fmt.Errorf("node %s: build status names no template: %w", t.node, errdefs.ErrUnavailable))
			return
		}
		everywhere, err := g.e2bBuilt(r.Context(), t.node, name, build, st.Template, st.BuildID, st.Tags, st.Requested)
		if err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
		if !everywhere && g.now().Sub(st.Updated) < e2bBuildSpread {
			body["status"], _ = json.Marshal("building")
		}
	}
	e2bwire.WriteJSON(w, http.StatusOK, body)
}

// e2bBuilt makes a finished build, on node builder, the cluster's: its
// template recorded (as build buildID of it, which the builder reports,
// and built when the build was asked for, so a node's other build of it
// is replaced) and its tags pointed at it. It reports whether every
// Ready node has the template as that build made it.
func (g *Gateway) e2bBuilt(ctx context.Context, builder, name, build, target, buildID string, tags []string, requested time.Time) (bool, error) {
	built := requested.UTC().Truncate(time.Second)
	n, err := g.nodes.Get(builder)
	if err != nil || !nodeHasTemplate(n, target) {
		// Its node's annotation has not caught up yet (the poll asked
		// it to): the next poll records it.
		return false, nil
	}
	var ids []string
	if id, ok := node.TemplateBuildID(n, target); ok {
		if buildID != "" && id != buildID {
			// Still the build before this one (a rebuild of the
			// name): the next poll records it.
			return false, nil
		}
		ids = []string{id}
	}
	cm, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Get(ctx, TemplatesConfigMap, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("read %s: %v: %w", TemplatesConfigMap, err, errdefs.ErrUnavailable)
	}
	if err != nil {
		cm = nil
	}
	st, ok := templateStates(cm)[target]
	if !ok || st.Deleted || st.Built.Before(built) || !slices.Equal(st.BuildIDs, ids) {
		st = templateState{How: "e2b build " + build, Built: built, BuildIDs: ids}
		g.recordTemplate(ctx, target, st)
	}
	err = g.updateE2BTags(ctx, name, func(entries map[string]e2bwire.TagEntry) bool {
		changed := false
		for _, tg := range tags {
			if e, ok := entries[tg]; ok && e.BuildID == build {
				continue
			}
			entries[tg] = e2bwire.TagEntry{BuildID: build, Template: target, Created: g.now().UTC()}
			changed = true
		}
		return changed
	})
	if err != nil {
		return false, err
	}
	nodes, err := g.readyNodes()
	if err != nil {
		return false, err
	}
	for _, n := range nodes {
		if !nodeHasTemplate(n, target) || st.stale(n, target) {
			return false, nil
		}
	}
	return true, nil
}

// e2bTags reads the cluster's tags of template name (none: empty).
func (g *Gateway) e2bTags(ctx context.Context, name string) (map[string]e2bwire.TagEntry, error) {
	cm, err := g.cfg.Kube.CoreV1().ConfigMaps(g.cfg.Namespace).Get(ctx, E2BTagsConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return map[string]e2bwire.TagEntry{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %v: %w", E2BTagsConfigMap, err, errdefs.ErrUnavailable)
	}
	return decodeTags(cm.Data[name]), nil
}

func decodeTags(v string) map[string]e2bwire.TagEntry {
	out := map[string]e2bwire.TagEntry{}
	if v != "" {
		_ = json.Unmarshal([]byte(v), &out) // an entry that does not decode is no tag
	}
	return out
}

// updateE2BTags has change edit template name's tags.
func (g *Gateway) updateE2BTags(ctx context.Context, name string, change func(map[string]e2bwire.TagEntry) bool) error {
	err := g.updateConfigMap(ctx, E2BTagsConfigMap, func(data map[string]string) bool {
		entries := decodeTags(data[name])
		if !change(entries) {
			return false
		}
		if len(entries) == 0 {
			delete(data, name)
			return true
		}
		b, _ := json.Marshal(entries)
		data[name] = string(b)
		return true
	})
	if err != nil {
		return fmt.Errorf("record tags of %s: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	return nil
}

// e2bResolve maps an E2B template reference to the Berth template its
// tag names (a name alone: its default tag); ok is false when no tag of
// the cluster's is that reference.
func (g *Gateway) e2bResolve(ctx context.Context, ref string) (string, bool, error) {
	name, tag, err := e2bwire.SplitTemplateRef(ref)
	if err != nil {
		return "", false, nil
	}
	if tag == "" {
		tag = e2bwire.DefaultTag
	}
	tags, err := g.e2bTags(ctx, name)
	if err != nil {
		return "", false, err
	}
	e, ok := tags[tag]
	return e.Template, ok, nil
}

// e2bAliasOrTags answers GET /templates/aliases/{alias} (Template.exists)
// and GET /templates/{id}/tags.
func (g *Gateway) e2bAliasOrTags(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	a, b := r.PathValue("a"), r.PathValue("b")
	switch {
	case a == "aliases":
		g.e2bAlias(w, r, b)
	case b == "tags":
		g.e2bListTags(w, r, a)
	default:
		e2bwire.WriteError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not served by the Kubernetes gateway (berth serve --kubernetes): templates are listed with the native API", r.Method, r.URL.Path))
	}
}

func (g *Gateway) e2bAlias(w http.ResponseWriter, r *http.Request, alias string) {
	name, tag, err := e2bwire.SplitTemplateRef(alias)
	if err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("alias: %w", err))
		return
	}
	target, ok, err := g.e2bResolve(r.Context(), alias)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if !ok {
		if tag != "" {
			e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", alias))
			return
		}
		target = name
	}
	tpls, err := g.templates()
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if !tpls[target] {
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", alias))
		return
	}
	e2bwire.WriteJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
}

func (g *Gateway) e2bListTags(w http.ResponseWriter, r *http.Request, ref string) {
	name, _, err := e2bwire.SplitTemplateRef(ref)
	if err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("templateID: %w", err))
		return
	}
	tags, err := g.e2bTags(r.Context(), name)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if len(tags) == 0 {
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("template %q has no tags (it was not built through the E2B API)", name))
		return
	}
	out := []map[string]any{}
	for _, tg := range slices.Sorted(maps.Keys(tags)) {
		e := tags[tg]
		out = append(out, map[string]any{"tag": tg, "buildID": e.BuildID, "createdAt": e.Created.Format(time.RFC3339Nano)})
	}
	e2bwire.WriteJSON(w, http.StatusOK, out)
}

// e2bAssignTags is POST /templates/tags {target: "name:tag", tags}. The
// default tag moved to another build makes template NAME a copy of that
// build's on every Ready node that has it (its export imported there
// under NAME, in place of the old), recorded as the cluster's.
func (g *Gateway) e2bAssignTags(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	var in struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := e2bwire.Decode(r, &in); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	name, tag, err := e2bwire.SplitTemplateRef(in.Target)
	if err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("target: %w", err))
		return
	}
	if tag == "" {
		tag = e2bwire.DefaultTag
	}
	if len(in.Tags) == 0 {
		e2bwire.WriteError(w, http.StatusBadRequest, "tags: at least one is required")
		return
	}
	if msg := e2bwire.BadTag(in.Tags); msg != "" {
		e2bwire.WriteError(w, http.StatusBadRequest, msg)
		return
	}
	tags, err := g.e2bTags(r.Context(), name)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	src, ok := tags[tag]
	if !ok {
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("template %s:%s not found", name, tag))
		return
	}
	if slices.Contains(in.Tags, e2bwire.DefaultTag) && src.Template != name {
		if err := g.copyTemplateOnNodes(r.Context(), src.Template, name); err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
	}
	err = g.updateE2BTags(r.Context(), name, func(entries map[string]e2bwire.TagEntry) bool {
		for _, tg := range in.Tags {
			e := src
			e.Created = g.now().UTC()
			if tg == e2bwire.DefaultTag {
				e.Template = name
			}
			entries[tg] = e
		}
		return true
	})
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	e2bwire.WriteJSON(w, http.StatusCreated, map[string]any{"buildID": src.BuildID, "tags": in.Tags})
}

// copyTemplateOnNodes makes template dst a copy of src on every Ready
// node that has src (src's export imported there as dst, replacing the
// old dst) and records dst as the cluster's, built when src was: the
// leader brings the other nodes to it.
func (g *Gateway) copyTemplateOnNodes(ctx context.Context, src, dst string) error {
	nodes, err := g.readyNodes()
	if err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		errs  []string
		done  []string
		ids   []string
		built time.Time
		wg    sync.WaitGroup
	)
	for _, n := range nodes {
		if !nodeHasTemplate(n, src) {
			continue
		}
		if at, ok := node.TemplateBuiltAt(n, src); ok && (built.IsZero() || at.Before(built)) {
			built = at
		}
		// Each copy keeps its source's build.
		if id, ok := node.TemplateBuildID(n, src); ok && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
		wg.Go(func() {
			err := g.copyTemplateOn(ctx, n.Name, src, dst)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", n.Name, err))
				return
			}
			done = append(done, n.Name)
		})
	}
	wg.Wait()
	if len(done) == 0 && len(errs) == 0 {
		return fmt.Errorf("template %s: no Ready Berth node has it: %w", src, errdefs.ErrNotFound)
	}
	if len(done) > 0 {
		slices.Sort(ids)
		g.recordTemplate(ctx, dst, templateState{How: "e2b tag of " + src, Built: built, BuildIDs: ids})
		// A create right after finds it.
		if err := g.awaitNodeTemplates(ctx, dst, done, true); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		slices.Sort(done)
		return fmt.Errorf("copy template %s to %s: %s (done on: %s): %w", src, dst, strings.Join(errs, "; "), strings.Join(done, ", "), errdefs.ErrUnavailable)
	}
	return nil
}

// copyTemplateOn makes template dst a copy of src on node on.
func (g *Gateway) copyTemplateOn(ctx context.Context, on, src, dst string) error {
	_, err := g.streamCopy(ctx, []string{on}, "/v1/templates/"+src+"/export", on,
		"/v1/templates/import?"+url.Values{"name": {dst}, "replace": {"true"}}.Encode(), nil)
	return err
}

// e2bRemoveTags is DELETE /templates/tags {name, tags}. The templates stay.
func (g *Gateway) e2bRemoveTags(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	var in struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := e2bwire.Decode(r, &in); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	name, _, err := e2bwire.SplitTemplateRef(in.Name)
	if err != nil {
		e2bwire.WriteErr(w, fmt.Errorf("name: %w", err))
		return
	}
	var missing string
	err = g.updateE2BTags(r.Context(), name, func(entries map[string]e2bwire.TagEntry) bool {
		missing = ""
		for _, tg := range in.Tags {
			if _, ok := entries[tg]; !ok {
				missing = tg
				return false
			}
		}
		for _, tg := range in.Tags {
			delete(entries, tg)
		}
		return len(in.Tags) > 0
	})
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if missing != "" {
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("template %s has no tag %q", name, missing))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
