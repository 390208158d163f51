package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/berth-sandbox/berth/api/types"
)

// UsageRecord is what one sandbox, or all sandboxes of one API key, used.
type UsageRecord = types.UsageRecord

// UsageOptions select usage records.
type UsageOptions struct {
	// By is "key" (the default) or "sandbox".
	By string
	// Since, when set, keeps sandboxes metered at or after it.
	Since time.Time
}

// Usage returns metered usage: per API key, or per sandbox. A plain key
// sees its own only.
func (c *Client) Usage(ctx context.Context, opts UsageOptions) ([]UsageRecord, error) {
	q := url.Values{}
	if opts.By != "" {
		q.Set("by", opts.By)
	}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339))
	}
	var out types.UsageList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/usage", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Usage, nil
}
