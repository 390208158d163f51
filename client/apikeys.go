package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// APIKey is a key of the daemon's E2B-compatible API. Key, the secret
// ("e2b_…"), is set only by CreateAPIKey: the daemon stores a hash and
// cannot show it again.
type APIKey = types.APIKey

// CreateAPIKey issues an API key for the E2B-compatible API.
func (c *Client) CreateAPIKey(ctx context.Context, name string) (*APIKey, error) {
	var k APIKey
	if err := c.doJSON(ctx, http.MethodPost, "/v1/apikeys", nil, types.CreateAPIKeyRequest{Name: name}, &k); err != nil {
		return nil, fmt.Errorf("create api key: %w", err)
	}
	return &k, nil
}

// CreateAPIKeyRequest is a new key's name, admin flag and quota.
type CreateAPIKeyRequest = types.CreateAPIKeyRequest

// Quota bounds one key's live sandboxes.
type Quota = types.Quota

// UpdateAPIKeyRequest changes a key's quota.
type UpdateAPIKeyRequest = types.UpdateAPIKeyRequest

// CreateAPIKeyWith issues an API key with the options in req (an admin
// key, a quota).
func (c *Client) CreateAPIKeyWith(ctx context.Context, req CreateAPIKeyRequest) (*APIKey, error) {
	var k APIKey
	if err := c.doJSON(ctx, http.MethodPost, "/v1/apikeys", nil, req, &k); err != nil {
		return nil, fmt.Errorf("create api key: %w", err)
	}
	return &k, nil
}

// UpdateAPIKey changes a key's quota: the fields req sets replace the
// current ones.
func (c *Client) UpdateAPIKey(ctx context.Context, id string, req UpdateAPIKeyRequest) (*APIKey, error) {
	if id == "" {
		return nil, fmt.Errorf("api key id is empty: %w", errdefs.ErrInvalidArgument)
	}
	var k APIKey
	if err := c.doJSON(ctx, http.MethodPatch, "/v1/apikeys/"+url.PathEscape(id), nil, req, &k); err != nil {
		return nil, fmt.Errorf("update api key: %w", err)
	}
	return &k, nil
}

// ListAPIKeys returns every API key, revoked ones included.
func (c *Client) ListAPIKeys(ctx context.Context) ([]APIKey, error) {
	var out types.APIKeyList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/apikeys", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.APIKeys, nil
}

// RevokeAPIKey stops a key from authenticating.
func (c *Client) RevokeAPIKey(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("api key id is empty: %w", errdefs.ErrInvalidArgument)
	}
	return c.doJSON(ctx, http.MethodDelete, "/v1/apikeys/"+url.PathEscape(id), nil, nil, nil)
}
