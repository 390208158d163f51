package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/template"
)

func templateToJSON(t template.Template) types.Template {
	return types.Template{
		Name: t.Name, Description: t.Description, Built: t.Built, BuiltAt: utc(t.BuiltAt), BuildID: t.BuildID, SizeBytes: t.SizeBytes,
		Source: t.Source, Layers: len(t.Layers), SharedLayers: t.SharedLayers,
		Isolation: t.Isolation,
		Env:       t.Defaults.Env, Workdir: t.Defaults.Workdir, User: t.Defaults.User, Command: t.Defaults.Command,
		StartCmd: t.Defaults.Start, Ready: readyToJSON(t.Defaults.Ready),
	}
}

func readyToJSON(r *template.ReadyCheck) *types.ReadyCheck {
	if r == nil {
		return nil
	}
	return &types.ReadyCheck{Cmd: r.Cmd, Port: r.Port, File: r.File, TimeoutSeconds: r.TimeoutSeconds}
}

// startOptions turns a create request's start command and ready check
// into the store's, validated (errors name the field).
func startOptions(req types.TemplateCreateRequest) (template.StartOptions, error) {
	o := template.StartOptions{Cmd: req.StartCmd, FromImage: req.StartFromImage}
	if r := req.Ready; r != nil {
		o.Ready = &template.ReadyCheck{Cmd: r.Cmd, Port: r.Port, File: r.File, TimeoutSeconds: r.TimeoutSeconds}
	}
	if err := o.Validate(); err != nil {
		field := "start_cmd"
		if o.Ready != nil && o.Ready.Validate() != nil {
			field = "ready"
		}
		return o, badField(field, err)
	}
	return o, nil
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.cfg.Templates.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	var warm map[sandbox.WarmKey]sandbox.WarmStatus
	if s.cfg.Warm != nil {
		warm = s.cfg.Warm.Warm()
	}
	out := types.TemplateList{Templates: make([]types.Template, 0, len(ts))}
	for _, t := range ts {
		j := templateToJSON(t)
		if w, ok := warm[sandbox.WarmKey{Template: t.Name}]; ok {
			j.Warm = &types.WarmPool{Target: w.Target, Ready: w.Ready}
		}
		if w, ok := warm[sandbox.WarmKey{Template: t.Name, AllowSudo: true}]; ok {
			j.WarmSudo = &types.WarmPool{Target: w.Target, Ready: w.Ready, AllowSudo: true}
		}
		out.Templates = append(out.Templates, j)
	}
	writeJSON(w, http.StatusOK, out)
}

// ndjsonLog turns build output into {"log": "..."} lines on a stream. The
// stream (status 200) starts with the first line, so a build that fails
// before it logs anything (a bad image reference, a registry that cannot
// be reached) is answered with a plain error and its status.
type ndjsonLog struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	enc     *json.Encoder
	rc      *http.ResponseController
	started bool
}

func newNDJSONLog(w http.ResponseWriter) *ndjsonLog {
	return &ndjsonLog{w: w, enc: json.NewEncoder(w), rc: http.NewResponseController(w)}
}

// start sends the stream's header; the caller holds mu.
func (l *ndjsonLog) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/x-ndjson")
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *ndjsonLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start()
	line := string(p)
	if err := l.enc.Encode(types.BuildLine{Log: &line}); err != nil {
		return 0, err
	}
	_ = l.rc.Flush()
	return len(p), nil
}

// finish ends the stream with the template or the error.
func (l *ndjsonLog) finish(t template.Template, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil && !l.started {
		writeError(l.w, err)
		return
	}
	l.start()
	if err != nil {
		_ = l.enc.Encode(types.BuildLine{Error: &types.Error{Code: errdefs.Code(err), Message: err.Error()}})
		return
	}
	out := templateToJSON(t)
	_ = l.enc.Encode(types.BuildLine{Template: &out}) // client gone: the build stands
}

func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	log := newNDJSONLog(w)
	// Built-in builds stream from their first line; start the stream at
	// once so a client sees the build begin.
	log.mu.Lock()
	log.start()
	_ = log.rc.Flush()
	log.mu.Unlock()
	t, err := s.cfg.Templates.Build(r.Context(), name, log)
	if err == nil {
		s.templateChanged(r, name)
	}
	log.finish(t, err)
}

// createTemplate makes a template from an image (POST /v1/templates).
func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) {
	var req types.TemplateCreateRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := template.ValidName(req.Name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	if req.Image == "" {
		writeError(w, badField("image", fmt.Errorf("image is required (an OCI/Docker image reference): %w", errdefs.ErrInvalidArgument)))
		return
	}
	if err := s.cfg.Templates.CheckImageRef(req.Image); err != nil {
		writeError(w, badField("image", err))
		return
	}
	start, err := startOptions(req)
	if err != nil {
		writeError(w, err)
		return
	}
	log := newNDJSONLog(w)
	t, err := s.cfg.Templates.BuildImage(r.Context(), req.Name, req.Image, start, log)
	if err == nil {
		s.templateChanged(r, req.Name)
	}
	log.finish(t, err)
}

// liveStates are the states in which a sandbox still has its root
// filesystem mounted.
var liveStates = []string{types.StateCreating, types.StateReady, types.StatePaused, types.StateStopping}

// deleteTemplate removes a template. It refuses while a sandbox of the
// template is live: its layers are that sandbox's root file system.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	live, err := s.cfg.Manager.List(r.Context(), sandbox.ListOptions{States: liveStates})
	if err != nil {
		writeError(w, err)
		return
	}
	var users []string
	for _, sb := range live {
		if sb.Template == name {
			users = append(users, sb.ID)
		}
	}
	if len(users) > 0 {
		writeError(w, fmt.Errorf("template %q is in use by %d sandbox(es) (%s); destroy them first: %w", name, len(users), strings.Join(users, ", "), errdefs.ErrFailedPrecondition))
		return
	}
	// Its warm pools stand on its layers: drained first and dropped.
	if s.cfg.Warm != nil {
		for _, sudo := range []bool{false, true} {
			if _, err := s.cfg.Warm.SetWarm(r.Context(), sandbox.WarmKey{Template: name, AllowSudo: sudo}, 0); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				writeError(w, err)
				return
			}
		}
		if err := s.cfg.Warm.TemplateChanged(r.Context(), name); err != nil {
			writeError(w, err)
			return
		}
	}
	if err := s.cfg.Templates.Remove(r.Context(), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pruneTemplates removes layers no template uses. A live sandbox created
// before its template's last build may stand on layers of the older build,
// which no manifest names any more: prune refuses while there is one.
func (s *Server) pruneTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.cfg.Templates.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	live, err := s.cfg.Manager.List(r.Context(), sandbox.ListOptions{States: liveStates})
	if err != nil {
		writeError(w, err)
		return
	}
	var stale []string
	for _, sb := range live {
		i := slices.IndexFunc(ts, func(t template.Template) bool { return t.Name == sb.Template })
		// BuiltAt has whole seconds: a sandbox in the same second counts as older.
		if i < 0 || sb.CreatedAt.Before(ts[i].BuiltAt.Add(time.Second)) {
			stale = append(stale, sb.ID)
		}
	}
	if len(stale) > 0 {
		writeError(w, fmt.Errorf("sandbox(es) %s may use layers of an older build of their template (removed or rebuilt since they started); destroy them first: %w", strings.Join(stale, ", "), errdefs.ErrFailedPrecondition))
		return
	}
	n, freed, err := s.cfg.Templates.PruneLayers(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, types.TemplatePruneResult{RemovedLayers: n, FreedBytes: freed})
}

// setTemplateIsolation records the isolation level a template's sandboxes
// get when their request names none. Only levels Berth knows are taken; a
// level this daemon cannot run is accepted (the template may be shared
// with daemons that can) and refused at create.
func (s *Server) setTemplateIsolation(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	var in types.TemplateIsolationRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	if in.Isolation != "" && !slices.Contains(core.Isolations(), in.Isolation) {
		writeError(w, badField("isolation", fmt.Errorf("isolation %q: want one of %s (or empty for the daemon's default): %w",
			in.Isolation, strings.Join(core.Isolations(), ", "), errdefs.ErrInvalidArgument)))
		return
	}
	t, err := s.cfg.Templates.SetIsolation(r.Context(), name, in.Isolation)
	if err != nil {
		writeError(w, err)
		return
	}
	s.templateChanged(r, name)
	writeJSON(w, http.StatusOK, templateToJSON(t))
}

// templateChanged drains a template's warm pool after its build or
// isolation level changed; the pool refills from the template as it is.
func (s *Server) templateChanged(r *http.Request, name string) {
	if s.cfg.Warm == nil {
		return
	}
	if err := s.cfg.Warm.TemplateChanged(r.Context(), name); err != nil {
		s.log.Warn("warm_pool_drain", "template", name, "err", err)
	}
}

// setWarm sets a template's warm pool target (PUT
// /v1/templates/{name}/warm).
func (s *Server) setWarm(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	var in types.WarmRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	if in.Target == nil {
		writeError(w, badField("target", fmt.Errorf("target is required (0 to %d): %w", sandbox.MaxWarm, errdefs.ErrInvalidArgument)))
		return
	}
	st, err := s.cfg.Warm.SetWarm(r.Context(), sandbox.WarmKey{Template: name, AllowSudo: in.AllowSudo}, *in.Target)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, types.WarmPool{Target: st.Target, Ready: st.Ready, AllowSudo: in.AllowSudo})
}

// maxTemplateImport bounds an uploaded template archive.
const maxTemplateImport = 64 << 30

// exportTemplate writes a template as a portable archive (GET
// /v1/templates/{name}/export). The store packs every layer before the
// first byte, so any refusal is a plain error.
func (s *Server) exportTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.tar"`)
	ew := &startedWriter{w: w}
	if err := s.cfg.Templates.Export(r.Context(), name, ew); err != nil {
		if !ew.started {
			w.Header().Del("Content-Disposition")
			writeError(w, badField("name", err))
			return
		}
		s.log.Warn("export_template", "template", name, "err", err)
	}
}

// importTemplate makes a template from a portable archive (POST
// /v1/templates/import[?name=NAME][&replace=true]); replace lets it take
// the place of a template of that name, as a rebuild would.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "name" && k != "replace" {
			writeError(w, badField(k, fmt.Errorf("unknown query parameter %q (want name or replace): %w", k, errdefs.ErrInvalidArgument)))
			return
		}
	}
	replace, err := boolParam(q, "replace")
	if err != nil {
		writeError(w, err)
		return
	}
	name := q.Get("name")
	if name != "" {
		if err := template.ValidName(name); err != nil {
			writeError(w, badField("name", err))
			return
		}
	}
	body := http.MaxBytesReader(w, r.Body, maxTemplateImport)
	imp := s.cfg.Templates.Import
	if replace {
		imp = s.cfg.Templates.ImportOver
	}
	t, err := imp(r.Context(), body, name)
	if err != nil {
		switch {
		case errors.Is(err, errdefs.ErrAlreadyExists):
			err = badField("name", err)
		case errors.Is(err, errdefs.ErrInvalidArgument):
			err = badField("file", err)
		}
		writeError(w, err)
		return
	}
	s.templateChanged(r, t.Name)
	writeJSON(w, http.StatusCreated, templateToJSON(t))
}
