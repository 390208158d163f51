package gateway

import (
	"context"
	"math"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
)

// A sandbox's usage is its node's daemon's to measure (its cgroup, its
// disk, the egress services' counters): the gateway's get of one sandbox
// asks the node for it (GET /berth/v1/sandboxes/<node sandbox>), and E2B's
// metrics are a sample of it taken at the request. The gateway keeps no
// history of samples.

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

// e2bMetrics is E2B's GET /sandboxes/{id}/metrics: one sample, taken now
// from the node's daemon, when the range (start and end, unix seconds,
// both optional) holds now, else none. CPU use is the average since the
// sandbox started (the gateway keeps no earlier sample to take a rate
// over); totals are the daemon's limits.
func (g *Gateway) e2bMetrics(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, ok := g.e2bPod(w, p, r.PathValue("id"))
	if !ok {
		return
	}
	now := g.now()
	from, to := int64(math.MinInt64), int64(math.MaxInt64)
	if err := e2bwire.MetricsRange(r.URL.Query(), &from, &to); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	out := []e2bwire.MetricBody{}
	if state(pod) != apitypes.StateReady || now.Unix() < from || now.Unix() > to {
		e2bwire.WriteJSON(w, http.StatusOK, out)
		return
	}
	sb, err := g.nodeSandbox(r.Context(), pod)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	e2bwire.WriteJSON(w, http.StatusOK, append(out, e2bwire.SampleNow(sb, now)))
}
