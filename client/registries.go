package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// RegistryLogin is a registry the daemon has credentials for.
type RegistryLogin = types.RegistryLogin

// LoginRegistry gives the daemon credentials for pulling from a registry
// (host[:port]); the daemon checks them against the registry first, and a
// refusal is errdefs.ErrUnauthenticated.
func (c *Client) LoginRegistry(ctx context.Context, host, username, password string) (*RegistryLogin, error) {
	if host == "" {
		return nil, fmt.Errorf("registry host is empty: %w", errdefs.ErrInvalidArgument)
	}
	var out RegistryLogin
	if err := c.doJSON(ctx, http.MethodPut, "/v1/registries/"+url.PathEscape(host), nil, types.RegistryLoginRequest{Username: username, Password: password}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// LogoutRegistry makes the daemon forget its credentials for a registry.
func (c *Client) LogoutRegistry(ctx context.Context, host string) error {
	if host == "" {
		return fmt.Errorf("registry host is empty: %w", errdefs.ErrInvalidArgument)
	}
	return c.doJSON(ctx, http.MethodDelete, "/v1/registries/"+url.PathEscape(host), nil, nil, nil)
}

// Registries lists the registries the daemon has credentials for.
func (c *Client) Registries(ctx context.Context) ([]RegistryLogin, error) {
	var out types.RegistryList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/registries", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Registries, nil
}
