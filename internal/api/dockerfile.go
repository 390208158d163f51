package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/dockerfile"
	"github.com/berth-sandbox/berth/internal/template"
)

// Dockerfiles runs Dockerfile builds (the daemon's dockerfile.Build).
type Dockerfiles interface {
	BuildDockerfile(ctx context.Context, req dockerfile.Request, log io.Writer) (template.Template, error)
}

// buildDockerfile makes a template from a Dockerfile
// (POST /v1/templates/{name}/dockerfile): the body is the build context as
// a tar, holding the Dockerfile at ?dockerfile= (default "Dockerfile");
// ?build_arg=K=V (repeated), ?no_cache=true, and the start command and
// ready check (?start_cmd=, ?ready_cmd=, ?ready_port=, ?ready_file=,
// ?ready_timeout_seconds=). The answer streams like a build.
func (s *Server) buildDockerfile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	q := r.URL.Query()
	req := dockerfile.Request{Name: name, Dockerfile: q.Get("dockerfile"), BuildArgs: map[string]string{}, NoCache: q.Get("no_cache") == "true"}
	if req.Dockerfile == "" {
		req.Dockerfile = "Dockerfile"
	}
	for _, kv := range q["build_arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			writeError(w, badField("build_arg", fmt.Errorf("build_arg %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)))
			return
		}
		req.BuildArgs[k] = v
	}
	req.Start.Cmd = q.Get("start_cmd")
	if q.Get("ready_cmd") != "" || q.Get("ready_port") != "" || q.Get("ready_file") != "" {
		rc := &template.ReadyCheck{Cmd: q.Get("ready_cmd"), File: q.Get("ready_file")}
		var err error
		if v := q.Get("ready_port"); v != "" {
			if rc.Port, err = strconv.Atoi(v); err != nil {
				writeError(w, badField("ready", fmt.Errorf("ready_port %q: %w", v, errdefs.ErrInvalidArgument)))
				return
			}
		}
		if v := q.Get("ready_timeout_seconds"); v != "" {
			if rc.TimeoutSeconds, err = strconv.Atoi(v); err != nil {
				writeError(w, badField("ready", fmt.Errorf("ready_timeout_seconds %q: %w", v, errdefs.ErrInvalidArgument)))
				return
			}
		}
		req.Start.Ready = rc
	}
	if err := req.Start.Validate(); err != nil {
		writeError(w, badField("ready", err))
		return
	}
	dir, err := os.MkdirTemp("", "berth-build-context-")
	if err != nil {
		writeError(w, err)
		return
	}
	defer os.RemoveAll(dir)
	if err := dockerfile.ExtractContext(r.Body, dir); err != nil {
		writeError(w, badField("context", err))
		return
	}
	req.Context = dir
	log := newNDJSONLog(w)
	t, err := s.cfg.Dockerfiles.BuildDockerfile(r.Context(), req, log)
	log.finish(t, err)
}
