package e2bwire

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
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

// SampleNow is a sample of a sandbox as a daemon's API shows it (with its
// usage) taken at now: its CPU use is the average since it was created,
// as a share of its CPU limit; its totals are its limits.
func SampleNow(sb *types.Sandbox, now time.Time) MetricBody {
	m := MetricBody{
		Timestamp: now.UTC().Format(time.RFC3339Nano), TimestampUnix: now.Unix(),
		CPUCount: int64(math.Ceil(sb.CPU)), MemTotal: sb.MemoryBytes, DiskTotal: sb.DiskBytes,
	}
	u := sb.Usage
	if u == nil {
		return m
	}
	m.MemUsed, m.DiskUsed = u.MemoryBytes, u.DiskUsedBytes
	if age := now.Sub(sb.CreatedAt).Seconds(); age > 0 && sb.CPU > 0 {
		m.CPUUsedPct = min(100, max(0, 100*u.CPUSeconds/age/sb.CPU))
	}
	return m
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
