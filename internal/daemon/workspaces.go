package daemon

import (
	"log/slog"
	"path/filepath"

	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/secret"
	"github.com/berth-sandbox/berth/internal/template"
	"github.com/berth-sandbox/berth/internal/workspace"
)

// newWorkspaces wires task workspaces: the secret store under the data dir,
// the environment cache in the template store, and the runc layout of a
// sandbox's writable layer (StateDir/<id>/disk/upper) for freezing it.
func newWorkspaces(cfg Config, mgr *sandbox.Manager, link *agentlink.Link, tpl *template.Store, log *slog.Logger) (*workspace.Service, error) {
	secrets, err := secret.New(filepath.Join(cfg.DataDir, "secrets"))
	if err != nil {
		return nil, err
	}
	stateDir := filepath.Join(cfg.DataDir, "sandboxes")
	return workspace.New(mgr, workspace.Config{
		Agent:     link,
		Templates: tpl,
		Secrets:   secrets,
		Cache:     tpl,
		UpperDir:  func(id string) string { return filepath.Join(stateDir, id, "disk", "upper") },
		Logger:    log.With("component", "workspace"),
	})
}
