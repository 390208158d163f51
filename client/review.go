package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
)

// WorklogStream summarises one output stream of a recorded command.
type WorklogStream = types.WorklogStream

// WorklogEntry is one action recorded in a sandbox's work log.
type WorklogEntry = types.WorklogEntry

// Worklog returns the sandbox's work log, oldest first. It stays readable
// after the sandbox is destroyed.
func (c *Client) Worklog(ctx context.Context, id string) ([]WorklogEntry, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out types.WorklogEntryList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/worklog", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// Export formats.
const (
	ExportPatch  = types.ExportPatch
	ExportBundle = types.ExportBundle
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
	return c.download(ctx, sandboxPath(id)+sub, q, w, "read "+sub)
}

// CommitRequest commits everything in a sandbox's checkout.
type CommitRequest = types.CommitRequest

// CommitResult is the commit made.
type CommitResult = types.CommitResult

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
