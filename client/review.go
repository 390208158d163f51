package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// WorklogStream summarises one output stream of a recorded command: its
// size and its first and last KiB.
type WorklogStream struct {
	Bytes int64  `json:"bytes"`
	Head  []byte `json:"head,omitempty"`
	Tail  []byte `json:"tail,omitempty"`
}

// WorklogEntry is one action recorded in a sandbox's work log: a command
// (Kind "exec", or "attach" for a connection to a running one) or a file
// operation ("write", "mkdir", "move", "remove").
type WorklogEntry struct {
	ID       string        `json:"id"`
	Time     time.Time     `json:"time"`
	Sandbox  string        `json:"sandbox"`
	Kind     string        `json:"kind"`
	API      string        `json:"api,omitempty"`
	User     string        `json:"user,omitempty"`
	Cmd      string        `json:"cmd,omitempty"`
	Args     []string      `json:"args,omitempty"`
	Cwd      string        `json:"cwd,omitempty"`
	EnvNames []string      `json:"env_names,omitempty"`
	Tag      string        `json:"tag,omitempty"`
	PTY      bool          `json:"pty,omitempty"`
	PID      uint32        `json:"pid,omitempty"`
	End      time.Time     `json:"end,omitzero"`
	Done     bool          `json:"done,omitempty"`
	ExitCode int32         `json:"exit_code"`
	Exited   bool          `json:"exited,omitempty"`
	Status   string        `json:"status,omitempty"`
	Error    string        `json:"error,omitempty"`
	Stdout   WorklogStream `json:"stdout,omitzero"`
	Stderr   WorklogStream `json:"stderr,omitzero"`
	PTYOut   WorklogStream `json:"pty_out,omitzero"`
	Path     string        `json:"path,omitempty"`
	Paths    []string      `json:"paths,omitempty"`
	Dest     string        `json:"dest,omitempty"`
	Size     int64         `json:"size,omitempty"`
	// HTTPStatus is the agent's answer to a file operation.
	HTTPStatus int `json:"http_status,omitempty"`
}

// Worklog returns the sandbox's work log, oldest first. It stays readable
// after the sandbox is destroyed.
func (c *Client) Worklog(ctx context.Context, id string) ([]WorklogEntry, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out struct {
		Entries []WorklogEntry `json:"entries"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/worklog", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// Export formats.
const (
	ExportPatch  = "patch"
	ExportBundle = "bundle"
)

// Diff writes the binary-safe git diff of the checkout at path (default
// /workspace) against the commit it was checked out at: tracked changes
// and new files, committed or not.
func (c *Client) Diff(ctx context.Context, id, path string, w io.Writer) error {
	return c.stream(ctx, id, "/diff", url.Values{"path": {path}}, w)
}

// Export writes the work at path as a patch series ("patch": the commits
// since the base, then uncommitted changes as a last patch; apply with git
// am) or a git bundle ("bundle": the commits since the base; fetch it with
// git fetch).
func (c *Client) Export(ctx context.Context, id, path, format string, w io.Writer) error {
	return c.stream(ctx, id, "/export", url.Values{"path": {path}, "format": {format}}, w)
}

func (c *Client) stream(ctx context.Context, id, sub string, q url.Values, w io.Writer) error {
	if err := checkID(id); err != nil {
		return err
	}
	for k, v := range q {
		if len(v) == 1 && v[0] == "" {
			delete(q, k)
		}
	}
	resp, err := c.do(ctx, http.MethodGet, sandboxPath(id)+sub, q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("read %s: %w", sub, err)
	}
	return nil
}

// CommitRequest commits everything in a sandbox's checkout.
type CommitRequest struct {
	// Path is the checkout (default /workspace).
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	// Branch, when set, is created from HEAD and receives the commit.
	Branch string `json:"branch,omitempty"`
	// Author is "Name <email>"; empty takes the daemon's commit_author.
	Author string `json:"author,omitempty"`
}

// CommitResult is the commit made.
type CommitResult struct {
	Commit string `json:"commit"`
	Branch string `json:"branch,omitempty"`
	Author string `json:"author"`
}

// Commit stages everything in the checkout and commits it inside the
// sandbox.
func (c *Client) Commit(ctx context.Context, id string, req CommitRequest) (*CommitResult, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out CommitResult
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/commit", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
