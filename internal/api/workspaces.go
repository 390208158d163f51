package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/berth-sandbox/berth/api/types"
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

// workspaceRequest is the wire WorkspaceRequest with createRequest's CPU.
type workspaceRequest struct {
	types.WorkspaceRequest
	CPU *float64 `json:"cpu"`
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
	sreq, err := parseCreate(createRequest{CreateRequest: in.CreateRequest, CPU: in.CPU})
	if err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	sreq.Owner, sreq.Quota = p.Owner(), p.Key.Quota
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
	send := func(v types.WorkspaceLine) {
		mu.Lock()
		defer mu.Unlock()
		// A client that went away misses the rest; the create goes on.
		_ = enc.Encode(v)
		_ = rc.Flush()
	}
	sb, err := s.cfg.Workspaces.Create(r.Context(), req, func(p workspace.Progress) {
		send(types.WorkspaceLine{Progress: &types.WorkspaceProgress{Type: p.Type, Message: p.Message, Step: p.Step}})
	})
	if err != nil {
		body := errorBody{Code: errdefs.Code(err), Message: err.Error()}
		var sfe *sandbox.FieldError
		if errors.As(err, &sfe) {
			body.Field = sfe.Field
		}
		out := types.WorkspaceLine{Error: &body}
		if sb.ID != "" {
			failed := toJSON(sb)
			out.Sandbox = &failed
		}
		send(out)
		return
	}
	ready := toJSON(sb)
	send(types.WorkspaceLine{Sandbox: &ready})
}

func (s *Server) checkEnvironment(w http.ResponseWriter, r *http.Request) {
	var in types.EnvironmentCheckRequest
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
		out := make([]types.EnvironmentProblem, len(pe.Problems))
		for i, p := range pe.Problems {
			out[i] = types.EnvironmentProblem{Line: p.Line, Column: p.Column, Field: p.Field, Message: p.Message}
		}
		writeJSON(w, http.StatusBadRequest, types.EnvironmentError{
			Code: errdefs.CodeInvalidArgument, Message: err.Error(), Field: "environment", Problems: out,
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
	writeJSON(w, http.StatusOK, types.EnvironmentCheck{
		Valid: true, Template: env.Template, Isolation: env.Isolation, Steps: steps, Secrets: env.Secrets, MissingSecrets: missing,
		SetupNetwork: string(env.SetupPolicy.Mode), AgentNetwork: string(env.AgentPolicy.Mode),
	})
}

func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) {
	envs, err := s.cfg.Workspaces.Environments(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := types.EnvironmentList{Environments: make([]types.CachedEnvironment, 0, len(envs))}
	for _, e := range envs {
		out.Environments = append(out.Environments, types.CachedEnvironment{Key: e.Key, Template: e.Template, Repo: e.Repo, Commit: e.Commit, Created: rfc3339(e.Created), LastUsed: rfc3339(e.LastUsed), SizeBytes: e.SizeBytes})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) pruneEnvironments(w http.ResponseWriter, r *http.Request) {
	var in types.PruneRequest
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
	writeJSON(w, http.StatusOK, types.PruneResult{Removed: removed})
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.cfg.Workspaces.ListSecrets()
	if err != nil {
		writeError(w, err)
		return
	}
	out := types.SecretList{Secrets: make([]types.SecretInfo, 0, len(list))}
	for _, i := range list {
		out.Secrets = append(out.Secrets, types.SecretInfo{Name: i.Name, UpdatedAt: rfc3339(i.UpdatedAt), SizeBytes: i.SizeBytes})
	}
	writeJSON(w, http.StatusOK, out)
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
	writeJSON(w, http.StatusOK, types.SecretInfo{Name: name, SizeBytes: int64(len(value))})
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
