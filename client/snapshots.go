package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Snapshot is a snapshot of a sandbox: its files plus what a sandbox made
// from it gets (template, isolation, limits, env, labels, network policy).
type Snapshot = types.Snapshot

// What a snapshot holds (Snapshot.Kind).
const (
	SnapshotFilesystem = types.SnapshotFilesystem
	SnapshotMemory     = types.SnapshotMemory
)

// ForkResult is what a fork made: the copies and their snapshot.
type ForkResult struct {
	Snapshot  Snapshot
	Sandboxes []*Sandbox
}

func snapshotPath(id string) string { return "/v1/snapshots/" + url.PathEscape(id) }

func checkSnapshotID(id string) error {
	if err := types.ValidSandboxID(id); err != nil {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: "snapshot: " + err.Error(), Field: "snapshot"}
	}
	return nil
}

// Snapshot takes a snapshot of running sandbox id (which keeps running)
// named name ("" for none). Create one from it with
// CreateRequest.Snapshot.
func (c *Client) Snapshot(ctx context.Context, id, name string) (*Snapshot, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var s Snapshot
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/snapshots", nil, types.SnapshotRequest{Name: name}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists the snapshots the caller sees, oldest first.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out types.SnapshotList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	if err := checkSnapshotID(id); err != nil {
		return nil, err
	}
	var s Snapshot
	if err := c.doJSON(ctx, http.MethodGet, snapshotPath(id), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// RemoveSnapshot removes a snapshot; the daemon refuses while a sandbox
// or another snapshot sits on it.
func (c *Client) RemoveSnapshot(ctx context.Context, id string) error {
	if err := checkSnapshotID(id); err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, snapshotPath(id), nil, nil, nil)
}

// Fork makes n live copies of running sandbox id; it keeps running.
func (c *Client) Fork(ctx context.Context, id string, n int) (*ForkResult, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("count %d: want at least 1", n), Field: "count"}
	}
	var out struct {
		Snapshot  Snapshot   `json:"snapshot"`
		Sandboxes []*Sandbox `json:"sandboxes"`
	}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/fork", nil, types.ForkRequest{Count: n}, &out); err != nil {
		return nil, err
	}
	for _, sb := range out.Sandboxes {
		c.bind(sb)
	}
	return &ForkResult{Snapshot: out.Snapshot, Sandboxes: out.Sandboxes}, nil
}

// ExportSnapshot writes snapshot id as a portable archive to w.
func (c *Client) ExportSnapshot(ctx context.Context, id string, w io.Writer) error {
	if err := checkSnapshotID(id); err != nil {
		return err
	}
	return c.download(ctx, snapshotPath(id)+"/export", nil, w, "export snapshot "+id)
}

// download copies the answer to a GET of path to w; what names the call
// in an error that cut the copy short.
func (c *Client) download(ctx context.Context, path string, q url.Values, w io.Writer, what string) error {
	resp, err := c.do(ctx, http.MethodGet, path, q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// ImportSnapshot uploads an archive ExportSnapshot wrote (on this or
// another daemon) and returns the new snapshot.
func (c *Client) ImportSnapshot(ctx context.Context, r io.Reader) (*Snapshot, error) {
	return c.ImportSnapshotWith(ctx, r, ImportOptions{})
}

// ImportOptions are an import's settings besides the archive.
type ImportOptions struct {
	// Labels are set on the new snapshot over those the archive carries.
	Labels map[string]string
	// Node, on a Kubernetes gateway, names the Berth node the snapshot
	// goes to (by default the Ready node holding the fewest).
	Node string
	// ID, on a daemon, is the ID the snapshot is imported under (by
	// default a new one); an ID the daemon has is an error.
	ID string
}

// ImportSnapshotWith is ImportSnapshot with options.
func (c *Client) ImportSnapshotWith(ctx context.Context, r io.Reader, opts ImportOptions) (*Snapshot, error) {
	q := url.Values{}
	for k, v := range opts.Labels {
		q.Add("label", k+"="+v)
	}
	if opts.Node != "" {
		q.Set("node", opts.Node)
	}
	if opts.ID != "" {
		q.Set("id", opts.ID)
	}
	var s Snapshot
	if err := c.upload(ctx, "import snapshot", "/v1/snapshots/import", q, r, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// upload posts an archive (application/x-tar) to path and decodes the JSON
// answer into out. The server's errors come back as they are; what names
// the call in the client's own.
func (c *Client) upload(ctx context.Context, what, path string, q url.Values, r io.Reader, out any) error {
	return c.send(ctx, what, http.MethodPost, path, "application/x-tar", q, r, out)
}

// send sends r as a body of type contentType and decodes the JSON answer
// into out, as upload does.
func (c *Client) send(ctx context.Context, what, method, path, contentType string, q url.Values, r io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.endpoint(path, q), r)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return decodeError(resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: decode the answer: %w", what, err)
	}
	return nil
}
