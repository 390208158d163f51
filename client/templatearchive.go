package client

import (
	"context"
	"io"
	"net/url"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// ExportTemplate writes template name as a portable archive to w (admin
// keys only). Templates made from an image, build steps or a Dockerfile
// can be exported; built-in ones are built by each daemon.
func (c *Client) ExportTemplate(ctx context.Context, name string, w io.Writer) error {
	if err := checkTemplateName(name); err != nil {
		return err
	}
	return c.download(ctx, "/v1/templates/"+url.PathEscape(name)+"/export", nil, w, "export template "+name)
}

// ImportTemplate uploads an archive ExportTemplate wrote (on this or
// another daemon) and returns the new template, named as in the archive,
// or name when it is set. On a Kubernetes gateway it goes to every Ready
// node.
func (c *Client) ImportTemplate(ctx context.Context, r io.Reader, name string) (*Template, error) {
	return c.importTemplate(ctx, r, name, false)
}

// ReplaceTemplate is ImportTemplate in place of a template the daemon has
// (not a built-in one), as a rebuild would replace it: sandboxes made
// from the old one keep it, the next ones get the archive's. A daemon's
// only (a gateway refuses it).
func (c *Client) ReplaceTemplate(ctx context.Context, r io.Reader, name string) (*Template, error) {
	return c.importTemplate(ctx, r, name, true)
}

func (c *Client) importTemplate(ctx context.Context, r io.Reader, name string, replace bool) (*Template, error) {
	q := url.Values{}
	if name != "" {
		if err := checkTemplateName(name); err != nil {
			return nil, err
		}
		q.Set("name", name)
	}
	if replace {
		q.Set("replace", "true")
	}
	var t Template
	if err := c.upload(ctx, "import template", "/v1/templates/import", q, r, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// checkTemplateName refuses a name no daemon would take before a request
// is sent.
func checkTemplateName(name string) error {
	if err := types.ValidTemplateName(name); err != nil {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: "template: " + err.Error(), Field: "name"}
	}
	return nil
}
