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

// MetricSample is one reading of a sandbox's usage over time.
type MetricSample = types.MetricSample

// MetricsOptions bound the readings Metrics returns; a zero bound is
// open. A range open at its end ends with a reading taken now.
type MetricsOptions struct {
	Since, Until time.Time
}

// Metrics returns sandbox id's usage readings, oldest first: one every
// 5 s while it runs (coarser as it ages; the daemon keeps at most 720 per
// sandbox, in memory).
func (c *Client) Metrics(ctx context.Context, id string, opts MetricsOptions) ([]MetricSample, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	q := url.Values{}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339Nano))
	}
	if !opts.Until.IsZero() {
		q.Set("until", opts.Until.UTC().Format(time.RFC3339Nano))
	}
	var out []MetricSample
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/metrics", q, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}
