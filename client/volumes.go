package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Volume is a named, size-capped filesystem that outlives sandboxes; bind
// it into one with CreateRequest.Volumes.
type Volume = types.Volume

// VolumeMount binds a volume into a sandbox (CreateRequest.Volumes).
type VolumeMount = types.VolumeMount

func volumePath(ref string) (string, error) {
	if ref == "" {
		return "", &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: "volume: want an ID or a name", Field: "volume"}
	}
	return "/v1/volumes/" + url.PathEscape(ref), nil
}

// CreateVolume makes a volume called name; size is a size string ("10G";
// "" takes the daemon's default).
func (c *Client) CreateVolume(ctx context.Context, name, size string) (*Volume, error) {
	var v Volume
	if err := c.doJSON(ctx, http.MethodPost, "/v1/volumes", nil, types.VolumeRequest{Name: name, Size: size}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Volumes lists the volumes the caller sees, oldest first.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out types.VolumeList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/volumes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// GetVolume returns a volume by ID or name, with the sandboxes that bind
// it.
func (c *Client) GetVolume(ctx context.Context, ref string) (*Volume, error) {
	p, err := volumePath(ref)
	if err != nil {
		return nil, err
	}
	var v Volume
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// RemoveVolume deletes a volume and its files; the daemon refuses while a
// sandbox that binds it exists.
func (c *Client) RemoveVolume(ctx context.Context, ref string) error {
	p, err := volumePath(ref)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}
