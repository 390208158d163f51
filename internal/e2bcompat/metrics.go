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

// manyMetrics is GET /sandboxes/metrics?sandbox_ids=…: a reading taken
// now of each sandbox asked for that runs and is the caller's. Others (a
// paused one, an unknown one, another key's) are left out, as E2B leaves
// out what it has no metrics of.
func (s *Server) manyMetrics(w http.ResponseWriter, r *http.Request) {
	ids, err := e2bwire.MetricsIDs(r.URL.Query())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := e2bwire.ManyMetricsBody{Sandboxes: map[string]e2bwire.MetricBody{}}
	now := time.Now()
	for _, id := range ids {
		if s.cfg.History == nil || !validID(id) {
			continue
		}
		sb, err := s.cfg.Manager.Get(r.Context(), id)
		if err != nil || !callerOf(r).Sees(sb.Owner) || !live(sb.State) {
			continue
		}
		if ms := s.cfg.History.Series(sb, now, time.Time{}, now); len(ms) > 0 {
			out.Sandboxes[id] = e2bwire.Metric(ms[len(ms)-1])
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// logs is E2B's GET /sandboxes/{id}/logs (v1: start, limit) and
// /v2/sandboxes/{id}/logs (cursor, direction, level, limit, search):
// what the host recorded of the sandbox, its lifecycle events and its
// work log, as e2bwire.SandboxLogs makes them entries.
func (s *Server) logs(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := e2bwire.ParseLogQuery(r.URL.Query(), v2)
		if err != nil {
			writeErr(w, err)
			return
		}
		events, work, err := s.cfg.Records(r.Context(), sandboxOf(r).ID)
		if err != nil {
			writeErr(w, err)
			return
		}
		entries := e2bwire.SandboxLogs(events, work, q)
		if v2 {
			writeJSON(w, http.StatusOK, e2bwire.LogsV2Body{Logs: entries})
			return
		}
		writeJSON(w, http.StatusOK, e2bwire.LogsV1(entries))
	}
}
