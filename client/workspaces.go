package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// WorkspaceRequest asks for a sandbox holding a repository at a ref, set up
// by an environment file (see docs/api.md, "Workspaces").
type WorkspaceRequest = types.WorkspaceRequest

// WorkspaceProgress is one line of a workspace create: a setup event
// (setup_started, setup_step, setup_done, setup_cached) or step output
// (Type "log").
type WorkspaceProgress = types.WorkspaceProgress

// WorkspaceError is a failed workspace create; Sandbox, when set, is the
// sandbox left in state failed (its Reason names the step, exit code and
// log tail).
type WorkspaceError struct {
	Err     error
	Sandbox *Sandbox
}

func (e *WorkspaceError) Error() string { return e.Err.Error() }
func (e *WorkspaceError) Unwrap() error { return e.Err }

// CreateWorkspace clones req.Repo at req.Ref into /workspace of a new
// sandbox, runs the environment's setup steps (progress, which may be nil,
// receives their events and output as they happen) and returns the ready
// sandbox. A failure is a *WorkspaceError.
func (c *Client) CreateWorkspace(ctx context.Context, req WorkspaceRequest, progress func(WorkspaceProgress)) (*Sandbox, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/workspaces", nil, req)
	if err != nil {
		return nil, &WorkspaceError{Err: err}
	}
	defer resp.Body.Close()
	var sb *Sandbox
	var werr *WorkspaceError
	err = readNDJSON(resp.Body, func(line []byte) error {
		var l types.WorkspaceLine
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("decode workspace line: %w", err)
		}
		switch {
		case l.Error != nil:
			werr = &WorkspaceError{Err: wireError(l.Error)}
			if l.Sandbox != nil {
				werr.Sandbox = c.bind(&Sandbox{Sandbox: *l.Sandbox})
			}
		case l.Sandbox != nil:
			sb = c.bind(&Sandbox{Sandbox: *l.Sandbox})
		case l.Progress != nil && progress != nil:
			progress(*l.Progress)
		}
		return nil
	})
	if werr != nil {
		return nil, werr
	}
	if err != nil {
		return nil, &WorkspaceError{Err: err}
	}
	if sb == nil {
		return nil, &WorkspaceError{Err: fmt.Errorf("workspace stream ended without a result: %w", errdefs.ErrUnavailable)}
	}
	return sb, nil
}

// EnvironmentCheck is what the daemon found in a valid environment file.
type EnvironmentCheck = types.EnvironmentCheck

// CheckEnvironment validates an environment file without running it. An
// invalid file is an invalid-argument error listing every problem with its
// line.
func (c *Client) CheckEnvironment(ctx context.Context, yaml []byte) (*EnvironmentCheck, error) {
	var out EnvironmentCheck
	if err := c.doJSON(ctx, http.MethodPost, "/v1/environments/check", nil, types.EnvironmentCheckRequest{Environment: string(yaml)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CachedEnvironment is a cached workspace environment.
type CachedEnvironment = types.CachedEnvironment

// Environments lists the cached environments.
func (c *Client) Environments(ctx context.Context) ([]CachedEnvironment, error) {
	var out types.EnvironmentList
	err := c.doJSON(ctx, http.MethodGet, "/v1/environments", nil, nil, &out)
	return out.Environments, err
}

// PruneEnvironments removes cached environments no sandbox uses: all, or
// only key when it is set. It returns the keys removed.
func (c *Client) PruneEnvironments(ctx context.Context, key string) ([]string, error) {
	var out types.PruneResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/environments/prune", nil, types.PruneRequest{Key: key}, &out)
	return out.Removed, err
}

// SecretInfo names a stored secret; values are never returned.
type SecretInfo = types.SecretInfo

// SetSecret stores a secret on the daemon's host.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.endpoint("/v1/secrets/"+url.PathEscape(name), nil), bytes.NewReader(value))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return decodeError(resp)
	}
	return nil
}

// Secrets lists the stored secrets' names.
func (c *Client) Secrets(ctx context.Context) ([]SecretInfo, error) {
	var out types.SecretList
	err := c.doJSON(ctx, http.MethodGet, "/v1/secrets", nil, nil, &out)
	return out.Secrets, err
}

// RemoveSecret deletes a secret.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}
