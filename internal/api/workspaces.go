package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/secret"
	"github.com/berth-sandbox/berth/internal/template"
	"github.com/berth-sandbox/berth/internal/workspace"
)

// Workspaces is what the API needs for task workspaces: one-call create,
// environment files, the environment cache and the secret store.
type Workspaces interface {
	Create(ctx context.Context, req workspace.Request, progress func(workspace.Progress)) (sandbox.Sandbox, error)
	Environments(ctx context.Context) ([]template.Environment, error)
	PruneEnvironments(ctx context.Context, key string) ([]string, error)
	SetSecret(name string, value []byte) error
	HasSecret(name string) bool
	ListSecrets() ([]secret.Info, error)
	RemoveSecret(name string) error
}

// workspaceRoutes mounts the workspace API when the daemon provides it.
func (s *Server) workspaceRoutes() {
	if s.cfg.Workspaces == nil {
		return
	}
	m := s.mux
	m.HandleFunc("POST /v1/workspaces", s.createWorkspace)
	m.HandleFunc("POST /v1/environments/check", s.checkEnvironment)
	m.HandleFunc("GET /v1/environments", s.listEnvironments)
	m.HandleFunc("POST /v1/environments/prune", s.pruneEnvironments)
	m.HandleFunc("GET /v1/secrets", s.listSecrets)
	m.HandleFunc("PUT /v1/secrets/{name}", s.putSecret)
	m.HandleFunc("DELETE /v1/secrets/{name}", s.deleteSecret)
}

type workspaceRequest struct {
	createRequest
	Repo string `json:"repo"`
	Ref  string `json:"ref"`
	// Environment is an environment file's YAML; empty means the repo's.
	Environment *string `json:"environment"`
	NoCache     bool    `json:"no_cache"`
}

type progressJSON struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Step    int    `json:"step,omitempty"`
}

func (s *Server) createWorkspace(w http.ResponseWriter, r *http.Request) {
	var in workspaceRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	if in.Network != nil {
		writeError(w, badField("network", fmt.Errorf("a workspace's policies come from its environment file (network.setup, network.agent): %w", errdefs.ErrInvalidArgument)))
		return
	}
	if in.Repo == "" {
		writeError(w, badField("repo", fmt.Errorf("repo is required: %w", errdefs.ErrInvalidArgument)))
		return
	}
	sreq, err := parseCreate(in.createRequest)
	if err != nil {
		writeError(w, err)
		return
	}
	req := workspace.Request{Repo: in.Repo, Ref: in.Ref, Sandbox: sreq, NoCache: in.NoCache}
	if in.Environment != nil {
		req.Environment = []byte(*in.Environment)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	send := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(v)
		rc.Flush()
	}
	sb, err := s.cfg.Workspaces.Create(r.Context(), req, func(p workspace.Progress) {
		send(map[string]any{"progress": progressJSON{Type: p.Type, Message: p.Message, Step: p.Step}})
	})
	if err != nil {
		body := errorBody{Code: errdefs.Code(err), Message: err.Error()}
		var sfe *sandbox.FieldError
		if errors.As(err, &sfe) {
			body.Field = sfe.Field
		}
		out := map[string]any{"error": body}
		if sb.ID != "" {
			out["sandbox"] = toJSON(sb)
		}
		send(out)
		return
	}
	send(map[string]any{"sandbox": toJSON(sb)})
}

type problemJSON struct {
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (s *Server) checkEnvironment(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Environment string `json:"environment"`
	}
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	env, err := workspace.Parse([]byte(in.Environment))
	if err != nil {
		var pe *workspace.ParseError
		if !errors.As(err, &pe) {
			writeError(w, err)
			return
		}
		out := make([]problemJSON, len(pe.Problems))
		for i, p := range pe.Problems {
			out[i] = problemJSON{Line: p.Line, Column: p.Column, Field: p.Field, Message: p.Message}
		}
		writeJSON(w, http.StatusBadRequest, map[string]any{
			"code": errdefs.CodeInvalidArgument, "message": err.Error(), "field": "environment", "problems": out,
		})
		return
	}
	missing := []string{}
	for _, name := range env.Secrets {
		if !s.cfg.Workspaces.HasSecret(name) {
			missing = append(missing, name)
		}
	}
	steps := make([]string, len(env.Setup))
	for i, st := range env.Setup {
		steps[i] = st.Label(i)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"valid": true, "template": env.Template, "steps": steps, "secrets": env.Secrets, "missing_secrets": missing,
		"setup_network": env.SetupPolicy.Mode, "agent_network": env.AgentPolicy.Mode,
	})
}

type environmentJSON struct {
	Key       string `json:"key"`
	Template  string `json:"template"`
	Repo      string `json:"repo"`
	Commit    string `json:"commit"`
	Created   string `json:"created"`
	LastUsed  string `json:"last_used"`
	SizeBytes int64  `json:"size_bytes"`
}

func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) {
	envs, err := s.cfg.Workspaces.Environments(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]environmentJSON, 0, len(envs))
	for _, e := range envs {
		out = append(out, environmentJSON{Key: e.Key, Template: e.Template, Repo: e.Repo, Commit: e.Commit, Created: rfc3339(e.Created), LastUsed: rfc3339(e.LastUsed), SizeBytes: e.SizeBytes})
	}
	writeJSON(w, http.StatusOK, map[string]any{"environments": out})
}

func (s *Server) pruneEnvironments(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Key string `json:"key"`
	}
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	removed, err := s.cfg.Workspaces.PruneEnvironments(r.Context(), in.Key)
	if err != nil {
		writeError(w, err)
		return
	}
	if removed == nil {
		removed = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"removed": removed})
}

type secretJSON struct {
	Name      string `json:"name"`
	UpdatedAt string `json:"updated_at"`
	SizeBytes int64  `json:"size_bytes"`
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.cfg.Workspaces.ListSecrets()
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]secretJSON, 0, len(list))
	for _, i := range list {
		out = append(out, secretJSON{Name: i.Name, UpdatedAt: rfc3339(i.UpdatedAt), SizeBytes: i.SizeBytes})
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": out})
}

// putSecret stores the raw request body as the secret's value; the answer
// names the secret and never echoes the value.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := secret.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	value, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, secret.MaxSize+1))
	if err != nil {
		writeError(w, badField("body", fmt.Errorf("secret value: larger than %d bytes: %w", secret.MaxSize, errdefs.ErrInvalidArgument)))
		return
	}
	if err := s.cfg.Workspaces.SetSecret(name, value); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, secretJSON{Name: name, SizeBytes: int64(len(value))})
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := secret.ValidName(name); err != nil {
		writeError(w, badField("name", err))
		return
	}
	if err := s.cfg.Workspaces.RemoveSecret(name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
