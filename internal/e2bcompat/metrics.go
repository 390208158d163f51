package e2bcompat

import (
	"math"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// History is the sandboxes' usage over time (usage.History, which the
// native API's metrics read too).
type History interface {
	Series(sb sandbox.Sandbox, since, until, now time.Time) []types.MetricSample
}

// metrics answers the sandbox's samples between start and end (unix
// seconds, inclusive; by default its whole life up to now), oldest first.
// A range without an end runs to the present and ends with a sample taken
// now, so a sandbox younger than one interval still reports its usage; a
// range with no samples is [].
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	from, to := int64(math.MinInt64), int64(math.MaxInt64)
	if err := e2bwire.MetricsRange(r.URL.Query(), &from, &to); err != nil {
		writeErr(w, err)
		return
	}
	out := []e2bwire.MetricBody{}
	if s.cfg.History == nil || from > to {
		writeJSON(w, http.StatusOK, out)
		return
	}
	since, until := e2bwire.MetricsBounds(from, to)
	for _, m := range s.cfg.History.Series(sb, since, until, time.Now()) {
		out = append(out, e2bwire.Metric(m))
	}
	writeJSON(w, http.StatusOK, out)
}
