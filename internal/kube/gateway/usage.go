package gateway

import (
	"context"
	"math"
	"net/http"
	"net/url"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
)

// A sandbox's usage is its node's daemon's to measure (its cgroup, its
// disk, the egress services' counters): the gateway's get of one sandbox
// asks the node for it (GET /berth/v1/sandboxes/<node sandbox>). The
// gateway keeps no history of it: the node's daemon keeps each sandbox's
// readings over time, and E2B's metrics read them there (GET
// /berth/v1/sandboxes/<node sandbox>/metrics).

// nodeUsageTimeout bounds the node's answer to a usage read: a get
// answers without usage rather than wait on a slow node.
const nodeUsageTimeout = 5 * time.Second

// nodeSandbox is the node's daemon's view of the sandbox of pod.
func (g *Gateway) nodeSandbox(ctx context.Context, pod *corev1.Pod) (*apitypes.Sandbox, error) {
	t, err := g.nodeOf(pod, "")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeUsageTimeout)
	defer cancel()
	var sb apitypes.Sandbox
	if err := g.nodeCall(ctx, t, http.MethodGet, "/v1/sandboxes/"+t.sandbox, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// withUsage adds the node's measure of the sandbox's usage to out, when
// the sandbox runs and its node answers; a node that does not leaves it
// out (the rest of the answer is the cluster's).
func (g *Gateway) withUsage(ctx context.Context, pod *corev1.Pod, out *apitypes.Sandbox) {
	if out.State != apitypes.StateReady {
		return
	}
	sb, err := g.nodeSandbox(ctx, pod)
	if err != nil {
		g.log.Debug("sandbox_usage_unavailable", "sandbox_id", out.ID, "err", err)
		return
	}
	out.Usage = sb.Usage
}

// e2bMetrics is E2B's GET /sandboxes/{id}/metrics: the readings the
// node's daemon keeps of the sandbox (native GET
// /v1/sandboxes/{id}/metrics) in the range (start and end, unix seconds,
// both optional), and a reading taken now when the range has no end. A
// sandbox not yet on a node has none.
func (g *Gateway) e2bMetrics(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, ok := g.e2bPod(r.Context(), w, p, r.PathValue("id"))
	if !ok {
		return
	}
	from, to := int64(math.MinInt64), int64(math.MaxInt64)
	if err := e2bwire.MetricsRange(r.URL.Query(), &from, &to); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	out := []e2bwire.MetricBody{}
	if _, err := sandboxOf(pod); err != nil || from > to {
		e2bwire.WriteJSON(w, http.StatusOK, out)
		return
	}
	ms, err := g.nodeMetrics(r.Context(), pod, from, to)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	for _, m := range ms {
		out = append(out, e2bwire.Metric(m))
	}
	e2bwire.WriteJSON(w, http.StatusOK, out)
}

// nodeMetrics is the node's daemon's readings of pod's sandbox in [from,
// to] (E2B's range, as e2bwire.MetricsRange reads it).
func (g *Gateway) nodeMetrics(ctx context.Context, pod *corev1.Pod, from, to int64) ([]apitypes.MetricSample, error) {
	t, err := g.nodeOf(pod, "")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	since, until := e2bwire.MetricsBounds(from, to)
	if !since.IsZero() {
		q.Set("since", since.Format(time.RFC3339Nano))
	}
	if !until.IsZero() {
		q.Set("until", until.Format(time.RFC3339Nano))
	}
	path := "/v1/sandboxes/" + t.sandbox + "/metrics"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, nodeUsageTimeout)
	defer cancel()
	var ms []apitypes.MetricSample
	if err := g.nodeCall(ctx, t, http.MethodGet, path, nil, &ms); err != nil {
		return nil, err
	}
	return ms, nil
}

// manyMetricsParallel bounds the node reads of one GET /sandboxes/metrics
// at once.
const manyMetricsParallel = 8

// e2bManyMetrics is E2B's GET /sandboxes/metrics?sandbox_ids=…: a reading
// taken now by its node's daemon of each sandbox asked for that runs and
// is the caller's; the others (paused, unknown, another key's, not yet on
// a node, on a node that does not answer) are left out, as a daemon
// leaves them out.
func (g *Gateway) e2bManyMetrics(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	ids, err := e2bwire.MetricsIDs(r.URL.Query())
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	now := g.now().Unix()
	var mu sync.Mutex
	out := e2bwire.ManyMetricsBody{Sandboxes: map[string]e2bwire.MetricBody{}}
	var eg errgroup.Group
	eg.SetLimit(manyMetricsParallel)
	for _, id := range ids {
		if apitypes.ValidSandboxID(id) != nil {
			continue
		}
		pod, err := g.podByID(id)
		if err != nil || !p.Sees(ownerOf(pod)) || !isE2B(pod) || !e2bLive(pod) || state(pod) != apitypes.StateReady {
			continue
		}
		if _, err := sandboxOf(pod); err != nil {
			continue
		}
		eg.Go(func() error {
			ms, err := g.nodeMetrics(r.Context(), pod, now, math.MaxInt64)
			if err != nil || len(ms) == 0 {
				return nil
			}
			mu.Lock()
			out.Sandboxes[id] = e2bwire.Metric(ms[len(ms)-1])
			mu.Unlock()
			return nil
		})
	}
	_ = eg.Wait() // the reads return nil: a node that fails leaves its sandbox out
	e2bwire.WriteJSON(w, http.StatusOK, out)
}

// e2bLogs is E2B's GET /sandboxes/{id}/logs and /v2/sandboxes/{id}/logs:
// what the sandbox's node recorded of it (its events and work log, read
// from the node's daemon as the review routes read them), as a daemon's
// E2B API answers them; none while it is not on a node yet.
func (g *Gateway) e2bLogs(v2 bool) func(http.ResponseWriter, *http.Request, auth.Principal) {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		pod, ok := g.e2bPod(r.Context(), w, p, r.PathValue("id"))
		if !ok {
			return
		}
		q, err := e2bwire.ParseLogQuery(r.URL.Query(), v2)
		if err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
		var events apitypes.EventList
		var work apitypes.WorklogEntryList
		if _, err := sandboxOf(pod); err == nil {
			t, err := g.nodeOf(pod, "")
			if err != nil {
				e2bwire.WriteErr(w, err)
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), nodeUsageTimeout)
			defer cancel()
			base := "/v1/sandboxes/" + t.sandbox
			if err := g.nodeCall(ctx, t, http.MethodGet, base+"/events", nil, &events); err != nil {
				e2bwire.WriteErr(w, err)
				return
			}
			if err := g.nodeCall(ctx, t, http.MethodGet, base+"/worklog", nil, &work); err != nil {
				e2bwire.WriteErr(w, err)
				return
			}
		}
		entries := e2bwire.SandboxLogs(events.Events, work.Entries, q)
		if v2 {
			e2bwire.WriteJSON(w, http.StatusOK, e2bwire.LogsV2Body{Logs: entries})
			return
		}
		e2bwire.WriteJSON(w, http.StatusOK, e2bwire.LogsV1(entries))
	}
}
