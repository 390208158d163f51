package e2bcompat

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/dockerfile"
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
	// Built reports whether template name is built.
	Built(ctx context.Context, name string) (bool, error)
	// Copy makes template dst with src's layers and defaults.
	Copy(ctx context.Context, src, dst string) error
}

// defaultTag is the tag of a name given without one.
const defaultTag = "default"

// uploadLinkTTL is how long an upload link is good for.
const uploadLinkTTL = time.Hour

// baseImages are E2B's base image names, which mean Berth's base template.
var baseImages = []string{"e2bdev/base", "docker.io/e2bdev/base", "index.docker.io/e2bdev/base"}

var (
	validTag  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	validHash = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// templateAPI is the state of E2B's template API.
type templateAPI struct {
	b   TemplateBuilder
	dir string
	// secret signs upload links (they carry no API key).
	secret []byte
	ctx    context.Context

	mu     sync.Mutex
	builds map[string]*buildJob
}

// tagEntry is what one NAME:TAG names.
type tagEntry struct {
	BuildID  string    `json:"build_id"`
	Template string    `json:"template"`
	Created  time.Time `json:"created"`
}

// buildJob is one requested build.
type buildJob struct {
	name     string // E2B name (the templateID Berth answers)
	id       string
	tags     []string
	target   string // Berth template it writes
	status   string // waiting, building, ready, error
	entries  []logEntry
	reason   *buildReason
	triggerd bool
}

type logEntry struct {
	Timestamp string `json:"timestamp"`
	Level     string `json:"level"`
	Message   string `json:"message"`
	Step      string `json:"step,omitempty"`
}

type buildReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

func newTemplateAPI(ctx context.Context, b TemplateBuilder, dir string) *templateAPI {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	return &templateAPI{b: b, dir: dir, secret: secret, ctx: ctx, builds: map[string]*buildJob{}}
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
func splitName(s string) (name, tag string, err error) {
	name, tag, hasTag := strings.Cut(s, ":")
	if err := template.ValidName(name); err != nil {
		return "", "", err
	}
	if hasTag && !validTag.MatchString(tag) {
		return "", "", fmt.Errorf("tag %q: want [A-Za-z0-9._-], at most 64: %w", tag, errdefs.ErrInvalidArgument)
	}
	return name, tag, nil
}

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

type requestBody struct {
	Name     string   `json:"name"`
	Tags     []string `json:"tags"`
	CPUCount *int     `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
}

// request answers POST /v3/templates: a build, waiting for its trigger.
func (t *templateAPI) request(w http.ResponseWriter, r *http.Request) {
	var in requestBody
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	name, tag, err := splitName(in.Name)
	if err != nil {
		writeErr(w, fmt.Errorf("name: %w", err))
		return
	}
	tags := slices.Clone(in.Tags)
	if tag != "" {
		tags = append(tags, tag)
	}
	if msg := badTag(tags); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if len(tags) == 0 {
		tags = []string{defaultTag}
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	job := &buildJob{name: name, id: newBuildID(), tags: tags, status: "waiting"}
	job.target = name
	if !slices.Contains(tags, defaultTag) {
		job.target = name + "-" + job.id[:8]
		if err := template.ValidName(job.target); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("name %q: at most 54 characters when the build has no default tag (its template is NAME-<build>)", name))
			return
		}
	}
	t.mu.Lock()
	t.builds[job.id] = job
	t.mu.Unlock()
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": name, "buildID": job.id, "public": false,
		"aliases": []string{name}, "names": []string{name}, "tags": tags,
	})
}

func newBuildID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (t *templateAPI) uploadPath(hash string) string {
	return filepath.Join(t.dir, "files", hash)
}

func (t *templateAPI) sign(name, hash string, expires int64) string {
	m := hmac.New(sha256.New, t.secret)
	fmt.Fprintf(m, "%s\x00%s\x00%d", name, hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// uploadLink answers GET /templates/{id}/files/{hash}: present, or a link
// (on this daemon, signed, for an hour) to PUT the files' tar to.
func (t *templateAPI) uploadLink(w http.ResponseWriter, r *http.Request) {
	name, hash := r.PathValue("templateID"), r.PathValue("hash")
	if err := template.ValidName(name); err != nil {
		writeErr(w, fmt.Errorf("templateID: %w", err))
		return
	}
	if !validHash.MatchString(hash) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("hash %q: want 64 lowercase hex digits", hash))
		return
	}
	if _, err := os.Stat(t.uploadPath(hash)); err == nil {
		writeJSON(w, http.StatusCreated, map[string]any{"present": true})
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	exp := time.Now().Add(uploadLinkTTL).Unix()
	url := fmt.Sprintf("%s://%s/templates/%s/files/%s?expires=%d&signature=%s", scheme, r.Host, name, hash, exp, t.sign(name, hash, exp))
	writeJSON(w, http.StatusCreated, map[string]any{"present": false, "url": url})
}

// upload answers the PUT of an upload link: the signature is its only
// authentication. The tar (gzipped or not) is stored under its hash.
func (t *templateAPI) upload(w http.ResponseWriter, r *http.Request) {
	name, hash := r.PathValue("templateID"), r.PathValue("hash")
	exp, err := strconv.ParseInt(r.URL.Query().Get("expires"), 10, 64)
	if err != nil || !validHash.MatchString(hash) ||
		!hmac.Equal([]byte(r.URL.Query().Get("signature")), []byte(t.sign(name, hash, exp))) {
		writeError(w, http.StatusForbidden, "upload link: bad or missing signature (ask GET /templates/{templateID}/files/{hash} for a link)")
		return
	}
	if time.Now().Unix() > exp {
		writeError(w, http.StatusForbidden, "upload link expired: ask for a new one")
		return
	}
	if err := os.MkdirAll(filepath.Dir(t.uploadPath(hash)), 0o700); err != nil {
		writeErr(w, err)
		return
	}
	f, err := os.CreateTemp(filepath.Dir(t.uploadPath(hash)), ".upload-")
	if err != nil {
		writeErr(w, err)
		return
	}
	defer os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(r.Body, dockerfile.MaxContext+1))
	if err == nil && n > dockerfile.MaxContext {
		err = fmt.Errorf("upload is larger than %d bytes: %w", int64(dockerfile.MaxContext), errdefs.ErrInvalidArgument)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), t.uploadPath(hash))
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
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

// trigger answers POST /v2/templates/{id}/builds/{build}: the steps, run
// in the background.
func (t *templateAPI) trigger(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	job := t.builds[r.PathValue("buildID")]
	ok := job != nil && job.name == r.PathValue("templateID") && !job.triggerd
	if ok {
		job.triggerd = true
	}
	t.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build %q of template %q not found, or already started", r.PathValue("buildID"), r.PathValue("templateID")))
		return
	}
	var in triggerBody
	err := decode(r, &in)
	var req dockerfile.Request
	var ctxDir string
	if err == nil {
		req, ctxDir, err = t.plan(job, in)
	}
	if err != nil {
		t.mu.Lock()
		job.triggerd = false
		t.mu.Unlock()
		if errors.Is(err, errNotImplemented) {
			writeError(w, http.StatusNotImplemented, err.Error())
			return
		}
		writeErr(w, err)
		return
	}
	t.mu.Lock()
	job.status = "building"
	t.mu.Unlock()
	go t.run(job, req, ctxDir)
	w.WriteHeader(http.StatusAccepted)
}

// plan turns the SDK's template into a build request; its copy steps'
// uploads are unpacked into a context directory, each under its hash.
func (t *templateAPI) plan(job *buildJob, in triggerBody) (dockerfile.Request, string, error) {
	req := dockerfile.Request{
		Name: job.target, Dockerfile: "e2b build " + job.id, NoCache: in.Force,
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
		plan.Steps = append(plan.Steps, step)
		// skipCache() on a step rebuilds it and what follows; the
		// builder's cache switch is per build.
		req.NoCache = req.NoCache || st.Force
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

// unpack extracts the upload hash into dir/hash, once.
func (t *templateAPI) unpack(dir, hash string) error {
	dst := filepath.Join(dir, hash)
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	f, err := os.Open(t.uploadPath(hash))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the files of hash %s were not uploaded (GET /templates/{templateID}/files/%s gives the link): %w", hash, hash, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	rd, err := maybeGunzip(f)
	if err != nil {
		return fmt.Errorf("upload %s: %v: %w", hash, err, errdefs.ErrInvalidArgument)
	}
	return dockerfile.ExtractContext(rd, dst)
}

// run runs a triggered build and records its end.
func (t *templateAPI) run(job *buildJob, req dockerfile.Request, ctxDir string) {
	defer os.RemoveAll(ctxDir)
	lw := &jobLog{t: t, job: job}
	_, err := t.b.BuildPlan(t.ctx, req, lw)
	lw.flush()
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		err = t.tagLocked(job.name, job.tags, tagEntry{BuildID: job.id, Template: job.target, Created: time.Now().UTC()})
	}
	if err != nil {
		step := ""
		var se *dockerfile.StepError
		if errors.As(err, &se) {
			step = "base"
			if se.Line > 0 {
				step = strconv.Itoa(se.Line)
			}
		}
		msg := err.Error()
		job.entries = append(job.entries, logEntry{Timestamp: now(), Level: "error", Message: msg, Step: step})
		tail := job.entries[max(0, len(job.entries)-20):]
		job.reason = &buildReason{Message: msg, Step: step, LogEntries: append([]logEntry{}, tail...)}
		job.status = "error"
		return
	}
	job.status = "ready"
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

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// jobLog turns a build's log into E2B log entries, a line each.
type jobLog struct {
	t       *templateAPI
	job     *buildJob
	partial []byte
}

func (l *jobLog) Write(p []byte) (int, error) {
	l.partial = append(l.partial, p...)
	for {
		i := slices.Index(l.partial, '\n')
		if i < 0 {
			break
		}
		l.add(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	return len(p), nil
}

func (l *jobLog) flush() {
	if len(l.partial) > 0 {
		l.add(string(l.partial))
		l.partial = nil
	}
}

func (l *jobLog) add(line string) {
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	l.job.entries = append(l.job.entries, logEntry{Timestamp: now(), Level: "info", Message: line})
}

// status answers GET /templates/{id}/builds/{build}/status: the state and
// the log entries from ?logsOffset= on.
func (t *templateAPI) status(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	job := t.builds[r.PathValue("buildID")]
	if job == nil || job.name != r.PathValue("templateID") {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build %q of template %q not found (builds are kept until the daemon restarts)", r.PathValue("buildID"), r.PathValue("templateID")))
		return
	}
	off := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("logsOffset %q: want a number >= 0", v))
			return
		}
		off = min(n, len(job.entries))
	}
	// Never null: the SDK maps logEntries without a nil check, and a
	// build polled before its first log line has none yet.
	entries := append([]logEntry{}, job.entries[off:]...)
	logs := make([]string, len(entries))
	for i, e := range entries {
		logs[i] = e.Message
	}
	body := map[string]any{
		"templateID": job.name, "buildID": job.id, "status": job.status,
		"logEntries": entries, "logs": logs,
	}
	if job.reason != nil {
		body["reason"] = job.reason
	}
	writeJSON(w, http.StatusOK, body)
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
	built, err := t.b.Built(r.Context(), target)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		writeErr(w, err)
		return
	}
	if !built {
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
func badTag(tags []string) string {
	for _, tg := range tags {
		if !validTag.MatchString(tg) {
			return fmt.Sprintf("tags: %q: want [A-Za-z0-9._-], at most 64", tg)
		}
	}
	return ""
}

// maybeGunzip reads r as gzip when it starts like gzip (the SDK gzips
// uploads unless told not to).
func maybeGunzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(2)
	if err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		return gzip.NewReader(br)
	}
	return br, nil
}
