package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/berth-sandbox/berth/api/types"
)

// Egress policy modes.
const (
	NetNone  = types.NetNone  // nothing leaves the sandbox, DNS included (default)
	NetAllow = types.NetAllow // only what the rules allow
	NetOpen  = types.NetOpen  // the public internet, never private or metadata addresses
	NetLearn = types.NetLearn // nothing, but every attempt is recorded for SuggestPolicy
)

// NetworkPolicy is a sandbox's egress policy (see types.NetworkPolicy).
type NetworkPolicy = types.NetworkPolicy

// HTTPRule allows Methods ("*" for any) on paths starting with Path at Host.
type HTTPRule = types.HTTPRule

// NetworkRecord is one egress decision from the sandbox's audit log.
type NetworkRecord = types.NetworkRecord

// NetworkLogFilter selects egress decisions.
type NetworkLogFilter struct {
	// Denied keeps denials only.
	Denied bool
	// Since, when set, keeps records from that time on.
	Since time.Time
}

func (f NetworkLogFilter) query(q url.Values) url.Values {
	if f.Denied {
		q.Set("denied", "true")
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	return q
}

// NetworkPolicy returns a running sandbox's egress policy.
func (c *Client) NetworkPolicy(ctx context.Context, id string) (*NetworkPolicy, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var p NetworkPolicy
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/network", nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SetNetworkPolicy replaces a running sandbox's egress policy. It is a
// kill switch: new connections and every further HTTP request follow it at
// once, and open connections it refuses are closed. A bad entry fails with
// invalid_argument naming it, and the old policy stays.
func (c *Client) SetNetworkPolicy(ctx context.Context, id string, p NetworkPolicy) (*NetworkPolicy, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out NetworkPolicy
	if err := c.doJSON(ctx, http.MethodPut, sandboxPath(id)+"/network", nil, p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NetworkLog returns a sandbox's egress decisions, oldest first.
func (c *Client) NetworkLog(ctx context.Context, id string, deniedOnly bool) ([]NetworkRecord, error) {
	return c.NetworkLogFiltered(ctx, id, NetworkLogFilter{Denied: deniedOnly})
}

// NetworkLogFiltered returns the sandbox's egress decisions f selects,
// oldest first.
func (c *Client) NetworkLogFiltered(ctx context.Context, id string, f NetworkLogFilter) ([]NetworkRecord, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out types.NetworkRecordList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/network/log", f.query(url.Values{}), nil, &out); err != nil {
		return nil, err
	}
	return out.Records, nil
}

// FollowNetworkLog calls fn for every decision, past and future, until
// ctx ends or fn fails.
func (c *Client) FollowNetworkLog(ctx context.Context, id string, deniedOnly bool, fn func(NetworkRecord) error) error {
	return c.FollowNetworkLogFiltered(ctx, id, NetworkLogFilter{Denied: deniedOnly}, fn)
}

// FollowNetworkLogFiltered is FollowNetworkLog for the decisions f selects.
func (c *Client) FollowNetworkLogFiltered(ctx context.Context, id string, f NetworkLogFilter, fn func(NetworkRecord) error) error {
	if err := checkID(id); err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodGet, sandboxPath(id)+"/network/log", f.query(url.Values{"follow": {"true"}}), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readNDJSON(resp.Body, func(line []byte) error {
		var r NetworkRecord
		if err := json.Unmarshal(line, &r); err != nil {
			return fmt.Errorf("decode network record: %w", err)
		}
		return fn(r)
	})
}

// SuggestNetworkPolicy returns the smallest allow policy covering what
// the sandbox was denied (run it in learn mode first).
func (c *Client) SuggestNetworkPolicy(ctx context.Context, id string) (*NetworkPolicy, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var p NetworkPolicy
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/network/suggest", nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
