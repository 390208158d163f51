package e2bcompat

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// DefaultMetricsInterval is how often RecordMetrics samples each E2B
// sandbox, as E2B does.
const DefaultMetricsInterval = 5 * time.Second

// maxMetricSamples bounds one sandbox's history: four hours at the default
// interval, about 200 KiB. Older samples are dropped first.
const maxMetricSamples = 2880

// metricSample is one reading of a sandbox's usage.
type metricSample struct {
	at        time.Time
	cpu       time.Duration // cumulative CPU time, for the next sample's rate
	cpuPct    float64
	cpus      int64
	memUsed   int64
	memTotal  int64
	diskUsed  int64
	diskTotal int64
}

// metricsHistory keeps the samples of live E2B sandboxes, oldest first.
type metricsHistory struct {
	mu sync.Mutex
	by map[string][]metricSample
}

func (h *metricsHistory) last(id string) (metricSample, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := h.by[id]
	if len(ss) == 0 {
		return metricSample{}, false
	}
	return ss[len(ss)-1], true
}

func (h *metricsHistory) add(id string, m metricSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := append(h.by[id], m)
	if len(ss) > maxMetricSamples {
		ss = append(ss[:0:0], ss[len(ss)-maxMetricSamples:]...)
	}
	h.by[id] = ss
}

// retain forgets sandboxes not in live (ended ones).
func (h *metricsHistory) retain(live map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.by {
		if !live[id] {
			delete(h.by, id)
		}
	}
}

// between returns id's samples taken in [from, to] (whole seconds, as the
// API names them).
func (h *metricsHistory) between(id string, from, to int64) []metricSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []metricSample
	for _, m := range h.by[id] {
		if at := m.at.Unix(); at >= from && at <= to {
			out = append(out, m)
		}
	}
	return out
}

// RecordMetrics samples every running E2B sandbox each interval until ctx
// ends, keeping a bounded history per sandbox for getMetrics({start, end}).
// The daemon runs it beside the server.
func (s *Server) RecordMetrics(ctx context.Context) {
	t := time.NewTicker(s.cfg.MetricsInterval)
	defer t.Stop()
	for {
		s.sampleAll(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleAll records one sample of each running E2B sandbox and forgets the
// ones that ended.
func (s *Server) sampleAll(ctx context.Context, now time.Time) {
	sbs, err := s.cfg.Manager.List(ctx, sandbox.ListOptions{States: []string{string(sandbox.StateReady)}})
	if err != nil {
		s.log.Warn("metrics_list_failed", "err", err)
		return
	}
	live := map[string]bool{}
	for _, sb := range sbs {
		if sb.Owner == "" {
			continue // native sandboxes have their own metrics
		}
		live[sb.ID] = true
		full, err := s.cfg.Manager.Get(ctx, sb.ID)
		if err != nil || full.Usage == nil {
			continue // ended or busy meanwhile: no sample this round
		}
		s.history.add(sb.ID, s.measure(full, now))
	}
	s.history.retain(live)
}

// measure turns sb's usage into a sample; CPU use is over the interval
// since the sandbox's previous sample (or since it started).
func (s *Server) measure(sb sandbox.Sandbox, now time.Time) metricSample {
	m := metricSample{at: now, cpus: (sb.CPUMillis + 999) / 1000, memTotal: sb.MemoryBytes, diskTotal: sb.DiskBytes}
	u := sb.Usage
	if u == nil {
		return m
	}
	m.cpu, m.memUsed, m.diskUsed = u.CPUUsage, u.MemoryBytes, u.DiskUsedBytes
	if u.MemoryLimit > 0 {
		m.memTotal = u.MemoryLimit
	}
	if u.DiskBytes > 0 {
		m.diskTotal = u.DiskBytes
	}
	prev := metricSample{at: sb.CreatedAt}
	if p, ok := s.history.last(sb.ID); ok && now.Sub(p.at) > 100*time.Millisecond {
		prev = p
	}
	if wall := now.Sub(prev.at); wall > 0 && sb.CPUMillis > 0 {
		quota := float64(sb.CPUMillis) / 1000
		m.cpuPct = min(100, max(0, 100*(m.cpu-prev.cpu).Seconds()/wall.Seconds()/quota))
	}
	return m
}

func (m metricSample) body() e2bwire.MetricBody {
	return e2bwire.MetricBody{
		Timestamp: m.at.UTC().Format(time.RFC3339Nano), TimestampUnix: m.at.Unix(), CPUCount: m.cpus,
		CPUUsedPct: m.cpuPct, MemUsed: m.memUsed, MemTotal: m.memTotal, DiskUsed: m.diskUsed, DiskTotal: m.diskTotal,
	}
}

// metrics answers the sandbox's samples between start and end (unix
// seconds, inclusive; by default its whole life up to now), oldest first.
// A range without an end runs to the present and ends with a sample taken
// now, so a sandbox younger than one interval still reports its usage; a
// range with no samples is [].
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	now := time.Now()
	from, to := sb.CreatedAt.Unix(), now.Unix()
	if err := e2bwire.MetricsRange(r.URL.Query(), &from, &to); err != nil {
		writeErr(w, err)
		return
	}
	out := []e2bwire.MetricBody{}
	for _, m := range s.history.between(sb.ID, from, to) {
		out = append(out, m.body())
	}
	if !r.URL.Query().Has("end") && from <= now.Unix() {
		out = append(out, s.measure(sb, now).body())
	}
	writeJSON(w, http.StatusOK, out)
}
