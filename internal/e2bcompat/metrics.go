package e2bcompat

import (
	"net/http"
	"time"
)

// cpuSample is one reading of a sandbox's cumulative CPU time.
type cpuSample struct {
	at  time.Time
	cpu time.Duration
}

// metricBody is E2B's SandboxMetric.
type metricBody struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int64   `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// metrics answers with one current sample (Berth keeps no history yet, so
// start and end are accepted and a single point inside them is returned).
// CPU use is over the interval since the previous call for the sandbox, or
// since it started on the first call.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	now := time.Now().UTC()
	cpus := (sb.CPUMillis + 999) / 1000
	m := metricBody{
		Timestamp: now.Format(time.RFC3339Nano), TimestampUnix: now.Unix(), CPUCount: cpus,
		MemTotal: sb.MemoryBytes, DiskTotal: sb.DiskBytes,
	}
	if u := sb.Usage; u != nil {
		m.MemUsed, m.DiskUsed = u.MemoryBytes, u.DiskUsedBytes
		if u.MemoryLimit > 0 {
			m.MemTotal = u.MemoryLimit
		}
		if u.DiskBytes > 0 {
			m.DiskTotal = u.DiskBytes
		}
		prev := cpuSample{at: sb.CreatedAt, cpu: 0}
		s.cpuMu.Lock()
		if p, ok := s.cpu[sb.ID]; ok && now.Sub(p.at) > 100*time.Millisecond {
			prev = p
		}
		s.cpu[sb.ID] = cpuSample{at: now, cpu: u.CPUUsage}
		// Forget sandboxes that ended, so the map stays as small as the
		// set of live sandboxes someone asks about.
		for id, p := range s.cpu {
			if now.Sub(p.at) > time.Hour {
				delete(s.cpu, id)
			}
		}
		s.cpuMu.Unlock()
		if wall := now.Sub(prev.at); wall > 0 && sb.CPUMillis > 0 {
			quota := float64(sb.CPUMillis) / 1000
			m.CPUUsedPct = min(100, 100*(u.CPUUsage-prev.cpu).Seconds()/wall.Seconds()/quota)
			if m.CPUUsedPct < 0 {
				m.CPUUsedPct = 0
			}
		}
	}
	writeJSON(w, http.StatusOK, []metricBody{m})
}
