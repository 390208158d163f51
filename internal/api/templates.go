package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/template"
)

func templateToJSON(t template.Template) types.Template {
	return types.Template{Name: t.Name, Description: t.Description, Built: t.Built, BuiltAt: utc(t.BuiltAt), SizeBytes: t.SizeBytes, Isolation: t.Isolation}
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.cfg.Templates.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := types.TemplateList{Templates: make([]types.Template, 0, len(ts))}
	for _, t := range ts {
		out.Templates = append(out.Templates, templateToJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
}

// ndjsonLog turns build output into {"log": "..."} lines on a stream.
type ndjsonLog struct {
	mu  sync.Mutex
	enc *json.Encoder
	rc  *http.ResponseController
}

func (l *ndjsonLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := string(p)
	if err := l.enc.Encode(types.BuildLine{Log: &line}); err != nil {
		return 0, err
	}
	l.rc.Flush()
	return len(p), nil
}

func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	log := &ndjsonLog{enc: json.NewEncoder(w), rc: rc}
	t, err := s.cfg.Templates.Build(r.Context(), name, log)
	log.mu.Lock()
	defer log.mu.Unlock()
	if err != nil {
		_ = log.enc.Encode(types.BuildLine{Error: &types.Error{Code: errdefs.Code(err), Message: err.Error()}})
		return
	}
	out := templateToJSON(t)
	_ = log.enc.Encode(types.BuildLine{Template: &out}) // client gone: the build stands
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
	writeJSON(w, http.StatusOK, templateToJSON(t))
}
