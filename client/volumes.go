package client

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

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

// VolumeEntry is one file in a volume; owners are the sandboxes' ids.
type VolumeEntry = types.VolumeEntry

// volumeQuery is the query of a volume file call: the path, and the mode
// (octal) when one is given.
func volumeQuery(path string, mode fs.FileMode) url.Values {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	}
	return q
}

// ListVolume lists directory path of volume ref (its ID or name) and
// below it to depth levels (1: its entries), depth first in name order.
func (c *Client) ListVolume(ctx context.Context, ref, path string, depth int) ([]VolumeEntry, error) {
	p, err := volumePath(ref)
	if err != nil {
		return nil, err
	}
	q := volumeQuery(path, 0)
	q.Set("depth", strconv.Itoa(depth))
	var out types.VolumeListing
	if err := c.doJSON(ctx, http.MethodGet, p+"/list", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// ReadVolumeFile copies file path of volume ref to w.
func (c *Client) ReadVolumeFile(ctx context.Context, ref, path string, w io.Writer) error {
	p, err := volumePath(ref)
	if err != nil {
		return err
	}
	return c.download(ctx, p+"/files", volumeQuery(path, 0), w, "read "+path+" of volume "+ref)
}

// WriteVolumeFile writes r to file path of volume ref, replacing what it
// held, with permissions mode (0: 0644) owned by the sandboxes' root; its
// missing parent directories are made.
func (c *Client) WriteVolumeFile(ctx context.Context, ref, path string, r io.Reader, mode fs.FileMode) (*VolumeEntry, error) {
	p, err := volumePath(ref)
	if err != nil {
		return nil, err
	}
	var e VolumeEntry
	if err := c.send(ctx, "write "+path+" of volume "+ref, http.MethodPut, p+"/files", "application/octet-stream", volumeQuery(path, mode), r, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// MakeVolumeDir makes directory path of volume ref and its missing
// parents, with permissions mode (0: 0755); an existing one is no error.
func (c *Client) MakeVolumeDir(ctx context.Context, ref, path string, mode fs.FileMode) (*VolumeEntry, error) {
	p, err := volumePath(ref)
	if err != nil {
		return nil, err
	}
	var e VolumeEntry
	if err := c.doJSON(ctx, http.MethodPost, p+"/dirs", volumeQuery(path, mode), nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// RemoveVolumePath removes file or directory path of volume ref, with
// everything in it.
func (c *Client) RemoveVolumePath(ctx context.Context, ref, path string) error {
	p, err := volumePath(ref)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p+"/files", volumeQuery(path, 0), nil, nil)
}
