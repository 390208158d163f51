package e2bwire

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// MetricBody is E2B's SandboxMetric: one sample of a sandbox's usage.
type MetricBody struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int64   `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// Metric is a native metrics reading as E2B shows it.
func Metric(m types.MetricSample) MetricBody {
	return MetricBody{
		Timestamp: m.Time.UTC().Format(time.RFC3339Nano), TimestampUnix: m.Time.Unix(), CPUCount: int64(math.Ceil(m.CPUs)),
		CPUUsedPct: m.CPUPercent, MemUsed: m.MemoryBytes, MemTotal: m.MemoryLimitBytes, DiskUsed: m.DiskUsedBytes, DiskTotal: m.DiskBytes,
	}
}

// MetricsBounds turns a range MetricsRange read (whole unix seconds,
// inclusive, math.MinInt64 and math.MaxInt64 where the request left it
// open) into the native API's since and until (zero where open).
func MetricsBounds(from, to int64) (since, until time.Time) {
	if from != math.MinInt64 {
		since = time.Unix(from, 0)
	}
	if to != math.MaxInt64 {
		until = time.Unix(to, 0).Add(time.Second - time.Nanosecond)
	}
	return since, until
}

// MetricsRange reads a metrics request's start and end (unix seconds,
// each optional) into from and to, which hold the defaults.
func MetricsRange(q url.Values, from, to *int64) error {
	for _, p := range []struct {
		name string
		to   *int64
	}{{"start", from}, {"end", to}} {
		raw := q.Get(p.name)
		if raw == "" {
			continue
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("%s %q: want unix seconds: %w", p.name, raw, errdefs.ErrInvalidArgument)
		}
		*p.to = n
	}
	return nil
}

// MaxMetricsIDs bounds the sandboxes of one GET /sandboxes/metrics, as
// E2B's API does.
const MaxMetricsIDs = 100

// ManyMetricsBody is E2B's SandboxesWithMetrics: the latest sample of
// each sandbox asked for that runs, by sandbox ID.
type ManyMetricsBody struct {
	Sandboxes map[string]MetricBody `json:"sandboxes"`
}

// MetricsIDs reads GET /sandboxes/metrics's sandbox_ids (comma-separated,
// repeated, or both): 1 to MaxMetricsIDs IDs, each once.
func MetricsIDs(q url.Values) ([]string, error) {
	var ids []string
	seen := map[string]bool{}
	for _, v := range q["sandbox_ids"] {
		for id := range strings.SplitSeq(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("sandbox_ids: want at least one sandbox ID: %w", errdefs.ErrInvalidArgument)
	case len(ids) > MaxMetricsIDs:
		return nil, fmt.Errorf("sandbox_ids: %d sandboxes, at most %d at once: %w", len(ids), MaxMetricsIDs, errdefs.ErrInvalidArgument)
	}
	return ids, nil
}
