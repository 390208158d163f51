package e2bcompat

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/dockerfile"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/template"
)

// E2B's template API (the SDK's Template() builder): a build is requested
// (POST /v3/templates), the files of its copy steps are uploaded to links
// it asks for per content hash, it is triggered with its steps
// (POST /v2/templates/{id}/builds/{build}) and polled for status and logs.
// The steps become a dockerfile.Plan run by the same builder, step cache
// and build sandboxes as Dockerfile builds. A name is a Berth template: the
// build tagged "default" (a name without a tag) is the template NAME
// itself; a build with only other tags is NAME-<first 8 of its build id>,
// and tags.json maps NAME:TAG to it.

// TemplateBuilder is what E2B's template API needs from the daemon.
type TemplateBuilder interface {
	// BuildPlan runs a build of req.Plan with the daemon's builder.
	BuildPlan(ctx context.Context, req dockerfile.Request, log io.Writer) (template.Template, error)
	// Template is the daemon's template name (ErrNotFound: none).
	Template(ctx context.Context, name string) (template.Template, error)
	// Copy makes template dst with src's layers and defaults.
	Copy(ctx context.Context, src, dst string) error
}

// defaultTag is the tag of a name given without one.
const defaultTag = e2bwire.DefaultTag

// uploadLinkTTL is how long an upload link is good for.
const uploadLinkTTL = time.Hour

// baseImages are E2B's base image names, which mean Berth's base template.
var baseImages = []string{"e2bdev/base", "docker.io/e2bdev/base", "index.docker.io/e2bdev/base"}

var validHash = regexp.MustCompile(`^[0-9a-f]{64}$`)

// templateAPI is the state of E2B's template API.
type templateAPI struct {
	b   TemplateBuilder
	dir string
	// secret signs upload links (they carry no API key).
	secret []byte
	ctx    context.Context
	// store keeps the builds and their logs (builds.go).
	store BuildStore
	log   *slog.Logger

	// mu guards tags.json and what follows.
	mu sync.Mutex
	// starting holds the builds whose trigger is being handled, so a
	// second trigger of one is refused.
	starting map[string]bool
	// waiting counts each name's builds requested and not yet
	// triggered, and files the uploads (uploads.go).
	waiting map[string]int
	files   map[string]*upload
}

// tagEntry is what one NAME:TAG names.
type tagEntry = e2bwire.TagEntry

func newTemplateAPI(ctx context.Context, b TemplateBuilder, st BuildStore, dir string, log *slog.Logger) *templateAPI {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	t := &templateAPI{b: b, dir: dir, secret: secret, ctx: ctx, store: st, log: log,
		starting: map[string]bool{}, waiting: map[string]int{}, files: map[string]*upload{}}
	// A build that was running when the daemon died ran in it: say so.
	if n, err := st.InterruptBuilds(ctx, interruptedReason, time.Now().UTC()); err != nil {
		log.Error("interrupt_builds", "err", err)
	} else if n > 0 {
		log.Info("builds_interrupted", "builds", n)
	}
	t.adoptUploads()
	return t
}

func (s *Server) templateRoutes() {
	m := s.mux
	t := s.tpl
	m.HandleFunc("POST /v3/templates", s.auth(s.admin(t.request)))
	m.HandleFunc("GET /templates/{templateID}/files/{hash}", s.auth(s.admin(t.uploadLink)))
	m.HandleFunc("PUT /templates/{templateID}/files/{hash}", t.upload)
	m.HandleFunc("POST /v2/templates/{templateID}/builds/{buildID}", s.auth(s.admin(t.trigger)))
	m.HandleFunc("GET /templates/{templateID}/builds/{buildID}/status", s.auth(s.admin(t.status)))
	// /templates/aliases/{alias} and /templates/{id}/tags overlap as
	// patterns; one handler tells them apart.
	m.HandleFunc("GET /templates/{a}/{b}", s.auth(t.aliasOrTags))
	m.HandleFunc("POST /templates/tags", s.auth(s.admin(t.assignTags)))
	m.HandleFunc("DELETE /templates/tags", s.auth(s.admin(t.removeTags)))
}

// admin lets only admin keys (and the operator) through: templates are
// the host's, as on the native API.
func (s *Server) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !callerOf(r).Admin() {
			writeError(w, http.StatusForbidden, "template builds need an admin API key (`berth apikey create --admin`): templates are shared by every key on the host")
			return
		}
		next(w, r)
	}
}

// splitName splits "name[:tag]".
func splitName(s string) (name, tag string, err error) { return e2bwire.SplitTemplateRef(s) }

func (t *templateAPI) tagsPath() string { return filepath.Join(t.dir, "tags.json") }

// loadTags reads tags.json: name -> tag -> entry. The caller holds mu.
func (t *templateAPI) loadTags() (map[string]map[string]tagEntry, error) {
	out := map[string]map[string]tagEntry{}
	b, err := os.ReadFile(t.tagsPath())
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", t.tagsPath(), err)
	}
	return out, nil
}

// saveTags writes tags.json atomically. The caller holds mu.
func (t *templateAPI) saveTags(tags map[string]map[string]tagEntry) error {
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(tags, "", "  ")
	tmp := t.tagsPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, t.tagsPath())
}

// resolve maps an E2B template reference ("name" or "name:tag") to the
// Berth template it names; ok is false when the tag registry does not
// know it (the reference is then a Berth template name as it is).
func (t *templateAPI) resolve(ref string) (string, bool) {
	name, tag, err := splitName(ref)
	if err != nil {
		return "", false
	}
	if tag == "" {
		tag = defaultTag
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tags, err := t.loadTags()
	if err != nil {
		return "", false
	}
	e, ok := tags[name][tag]
	return e.Template, ok
}

// stepBody is one of the SDK's serialized instructions.
type stepBody struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	Force     bool     `json:"force"`
	FilesHash string   `json:"filesHash"`
}

type triggerBody struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Steps             []stepBody      `json:"steps"`
	Force             bool            `json:"force"`
}

// errNotImplemented marks what the trigger cannot do (501).
var errNotImplemented = errors.New("not implemented by Berth")

// plan turns the SDK's template into a build request; its copy steps'
// uploads are unpacked into a context directory, each under its hash.
func (t *templateAPI) plan(job core.TemplateBuild, in triggerBody) (dockerfile.Request, string, error) {
	req := dockerfile.Request{
		Name: job.Target, Dockerfile: "e2b build " + job.ID, NoCache: in.Force,
		PreferUser: DefaultUser,
	}
	if len(in.FromImageRegistry) > 0 && string(in.FromImageRegistry) != "null" {
		return req, "", fmt.Errorf("registry credentials in a template (fromImage with credentials, fromAWSRegistry, fromGCPRegistry) are %w: log in once with `berth registry login HOST`", errNotImplemented)
	}
	plan := &dockerfile.Plan{Unit: "step"}
	switch {
	case in.FromTemplate != "":
		base := in.FromTemplate
		if tgt, ok := t.resolve(base); ok {
			base = tgt
		} else if _, _, err := splitName(base); err != nil {
			return req, "", fmt.Errorf("fromTemplate: %w", err)
		}
		plan.FromRef = "berth:" + base
	case in.FromImage != "":
		plan.FromRef = in.FromImage
		img, _, _ := strings.Cut(in.FromImage, ":")
		if slices.Contains(baseImages, img) {
			// E2B's base image is Berth's base template.
			plan.FromRef = "berth:base"
		}
	default:
		return req, "", fmt.Errorf("fromImage or fromTemplate is required: %w", errdefs.ErrInvalidArgument)
	}
	plan.From = dockerfile.Step{Text: "FROM " + plan.FromRef}
	if in.StartCmd != "" || in.ReadyCmd != "" {
		req.Start.Cmd = in.StartCmd
		if in.ReadyCmd != "" {
			req.Start.Ready = &template.ReadyCheck{Cmd: in.ReadyCmd}
		}
		if err := req.Start.Validate(); err != nil {
			return req, "", err
		}
	}
	dir, err := os.MkdirTemp("", "berth-e2b-build-")
	if err != nil {
		return req, "", err
	}
	fail := func(err error) (dockerfile.Request, string, error) {
		os.RemoveAll(dir)
		return req, "", err
	}
	req.Context = dir
	for i, st := range in.Steps {
		step, err := t.step(dir, st)
		if err != nil {
			return fail(fmt.Errorf("step %d (%s): %w", i+1, st.Type, err))
		}
		step.Line = i + 1
		// The SDK marks every step from skipCache() on: the builder
		// rebuilds from the first one marked, and takes those before
		// from the cache. (The template's own force, skipCache()
		// before its base or build's skipCache option, is NoCache.)
		step.NoCache = st.Force
		plan.Steps = append(plan.Steps, step)
	}
	req.Plan = plan
	return req, dir, nil
}

// step maps one SDK instruction onto the builder's.
func (t *templateAPI) step(dir string, st stepBody) (dockerfile.Step, error) {
	arg := func(i int) string {
		if i < len(st.Args) {
			return st.Args[i]
		}
		return ""
	}
	text := st.Type + " " + strings.Join(st.Args, " ")
	switch st.Type {
	case "RUN":
		if arg(0) == "" {
			return dockerfile.Step{}, fmt.Errorf("a command is required: %w", errdefs.ErrInvalidArgument)
		}
		return dockerfile.Step{Text: text, Cmd: &dockerfile.RunAs{Shell: arg(0), User: arg(1)}}, nil
	case "COPY":
		src, dest := arg(0), arg(1)
		if src == "" || dest == "" || !validHash.MatchString(st.FilesHash) {
			return dockerfile.Step{}, fmt.Errorf("source, destination and filesHash are required: %w", errdefs.ErrInvalidArgument)
		}
		if err := t.unpack(dir, st.FilesHash); err != nil {
			return dockerfile.Step{}, err
		}
		return dockerfile.Step{Text: "COPY " + src + " " + dest, Cmd: &instructions.CopyCommand{
			SourcesAndDest: instructions.SourcesAndDest{SourcePaths: []string{st.FilesHash + "/" + src}, DestPath: dest},
			Chown:          arg(2), Chmod: arg(3),
		}}, nil
	case "WORKDIR":
		return dockerfile.Step{Text: text, Cmd: &instructions.WorkdirCommand{Path: arg(0)}}, nil
	case "USER":
		return dockerfile.Step{Text: text, Cmd: &instructions.UserCommand{User: arg(0)}}, nil
	case "ENV":
		if len(st.Args)%2 != 0 {
			return dockerfile.Step{}, fmt.Errorf("want KEY VALUE pairs: %w", errdefs.ErrInvalidArgument)
		}
		c := &instructions.EnvCommand{}
		for i := 0; i < len(st.Args); i += 2 {
			c.Env = append(c.Env, instructions.KeyValuePair{Key: st.Args[i], Value: st.Args[i+1]})
		}
		return dockerfile.Step{Text: text, Cmd: c}, nil
	}
	return dockerfile.Step{}, fmt.Errorf("step type %q is %w", st.Type, errNotImplemented)
}

// tagLocked points name's tags at e. The caller holds mu.
func (t *templateAPI) tagLocked(name string, tags []string, e tagEntry) error {
	all, err := t.loadTags()
	if err != nil {
		return err
	}
	if all[name] == nil {
		all[name] = map[string]tagEntry{}
	}
	for _, tg := range tags {
		all[name][tg] = e
	}
	return t.saveTags(all)
}

// aliasOrTags answers GET /templates/aliases/{alias} (Template.exists) and
// GET /templates/{id}/tags.
func (t *templateAPI) aliasOrTags(w http.ResponseWriter, r *http.Request) {
	a, b := r.PathValue("a"), r.PathValue("b")
	switch {
	case a == "aliases":
		t.alias(w, r, b)
	case b == "tags":
		t.listTags(w, a)
	default:
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not implemented by Berth: %s", r.Method, r.URL.Path, templatesMissing))
	}
}

func (t *templateAPI) alias(w http.ResponseWriter, r *http.Request, alias string) {
	name, _, err := splitName(alias)
	if err != nil {
		writeErr(w, fmt.Errorf("alias: %w", err))
		return
	}
	target := name
	if tgt, ok := t.resolve(alias); ok {
		target = tgt
	} else if name != alias {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", alias))
		return
	}
	tpl, err := t.b.Template(r.Context(), target)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		writeErr(w, err)
		return
	}
	if !tpl.Built {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", alias))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
}

func (t *templateAPI) listTags(w http.ResponseWriter, ref string) {
	name, _, err := splitName(ref)
	if err != nil {
		writeErr(w, fmt.Errorf("templateID: %w", err))
		return
	}
	t.mu.Lock()
	all, err := t.loadTags()
	t.mu.Unlock()
	if err != nil {
		writeErr(w, err)
		return
	}
	tags, ok := all[name]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template %q has no tags (it was not built through the E2B API)", name))
		return
	}
	out := []map[string]any{}
	for _, tg := range slices.Sorted(maps.Keys(tags)) {
		e := tags[tg]
		out = append(out, map[string]any{"tag": tg, "buildID": e.BuildID, "createdAt": e.Created.Format(time.RFC3339Nano)})
	}
	writeJSON(w, http.StatusOK, out)
}

// assignTags answers POST /templates/tags {target: "name:tag", tags}.
func (t *templateAPI) assignTags(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	name, tag, err := splitName(in.Target)
	if err != nil {
		writeErr(w, fmt.Errorf("target: %w", err))
		return
	}
	if tag == "" {
		tag = defaultTag
	}
	if len(in.Tags) == 0 {
		writeError(w, http.StatusBadRequest, "tags: at least one is required")
		return
	}
	if msg := badTag(in.Tags); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	t.mu.Lock()
	all, err := t.loadTags()
	t.mu.Unlock()
	if err != nil {
		writeErr(w, err)
		return
	}
	src, ok := all[name][tag]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template %s:%s not found", name, tag))
		return
	}
	e := src
	e.Created = time.Now().UTC()
	if slices.Contains(in.Tags, defaultTag) && src.Template != name {
		// The default tag is the template NAME itself.
		if err := t.b.Copy(r.Context(), src.Template, name); err != nil {
			writeErr(w, err)
			return
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	all, err = t.loadTags()
	if err == nil {
		if all[name] == nil {
			all[name] = map[string]tagEntry{}
		}
		for _, tg := range in.Tags {
			ne := e
			if tg == defaultTag {
				ne.Template = name
			}
			all[name][tg] = ne
		}
		err = t.saveTags(all)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": src.BuildID, "tags": in.Tags})
}

// removeTags answers DELETE /templates/tags {name, tags}. The templates
// stay (`berth template rm` removes them).
func (t *templateAPI) removeTags(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	name, _, err := splitName(in.Name)
	if err != nil {
		writeErr(w, fmt.Errorf("name: %w", err))
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	all, err := t.loadTags()
	if err != nil {
		writeErr(w, err)
		return
	}
	for _, tg := range in.Tags {
		if _, ok := all[name][tg]; !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("template %s has no tag %q", name, tg))
			return
		}
	}
	for _, tg := range in.Tags {
		delete(all[name], tg)
	}
	if len(all[name]) == 0 {
		delete(all, name)
	}
	if err := t.saveTags(all); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// badTag names the first of tags that is not a valid tag ("" if none is).
func badTag(tags []string) string { return e2bwire.BadTag(tags) }
