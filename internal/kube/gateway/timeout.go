package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/internal/quota"
	"github.com/berth-sandbox/berth/internal/units"
)

// A sandbox's deadline is its pod's node.AnnotationDeadline, an RFC 3339
// time. Its node enforces it: it makes it the sandbox's deadline at create
// and again each time the annotation changes, so a deadline holds while
// no gateway runs, and the pod then fails with DeadlineExceeded. The pod
// has no activeDeadlineSeconds: the API server lets that only shrink, so
// it could not follow a deadline moved later.

// deadlineAt is the annotation's value for d from now, rounded up to the
// second (the annotation has no finer grain).
func deadlineAt(now time.Time, d time.Duration) string {
	t := now.Add(d)
	if r := t.Truncate(time.Second); !r.Equal(t) {
		t = r.Add(time.Second)
	}
	return t.UTC().Format(time.RFC3339)
}

// timeoutSandbox is POST /v1/sandboxes/{id}/timeout: {"timeout":"30m"}
// moves the deadline to that long from now, as on a daemon.
func (g *Gateway) timeoutSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in apitypes.SetTimeoutRequest
	if err := decodeBody(r, &in, false, `{"timeout":"30m"}`); err != nil {
		writeError(w, err)
		return
	}
	if in.Timeout == "" {
		writeError(w, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout is required, a duration such as 30m"))
		return
	}
	d, err := units.ParseDuration(in.Timeout)
	if err != nil {
		writeError(w, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout %q: want a duration such as 30m", in.Timeout))
		return
	}
	pod, err := g.setTimeout(r.Context(), p, r.PathValue("id"), d)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toSandbox(pod))
}

// setTimeout moves the deadline of the caller's sandbox id to d from now
// (between 1s and the gateway's MaxTimeout) and returns its pod as
// patched. A running sandbox's deadline moves; a paused one gets d once
// resumed, as on a daemon.
func (g *Gateway) setTimeout(ctx context.Context, p auth.Principal, id string, d time.Duration) (*corev1.Pod, error) {
	if d < time.Second || d > g.cfg.MaxTimeout {
		return nil, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout %s is out of range [1s, %s]", d, g.cfg.MaxTimeout)
	}
	if err := quota.Timeout(p.Key.Quota, d); err != nil {
		return nil, fieldErr("timeout", errdefs.ErrResourceExhausted, "%v", err)
	}
	pod, err := g.sandboxPod(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if pod.Annotations[node.AnnotationOnTimeout] == apitypes.OnTimeoutPause && state(pod) == apitypes.StateReady {
		if dl, err := time.Parse(time.RFC3339, pod.Annotations[node.AnnotationDeadline]); err == nil && !g.now().Before(dl) {
			// Its node's daemon pauses it at the deadline, which this
			// replica's cache may not show yet: the API server's copy
			// decides.
			if pod, err = g.freshPod(ctx, pod); err != nil {
				return nil, err
			}
		}
	}
	deadline := deadlineAt(g.now(), d)
	switch st := state(pod); st {
	case apitypes.StateReady:
	case apitypes.StatePaused:
		// Its clock is stopped: d is what it gets once resumed, which
		// the resume reckons from the time of the pause (pause.go).
		at, err := time.Parse(time.RFC3339Nano, pod.Annotations[node.AnnotationPaused])
		if err != nil {
			// Paused at its deadline (or by a `kubectl annotate`
			// without a time): a new deadline would resume it.
			return nil, fmt.Errorf("sandbox %s was paused at its deadline (or without a time in %s), and a new deadline would resume it: resume it with a timeout instead (POST …/resume {\"timeout\":…}): %w", id, node.AnnotationPaused, errdefs.ErrFailedPrecondition)
		}
		deadline = deadlineAt(at, d)
	default:
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	changed, stop := g.watch(id)
	defer stop()
	// What this replica answers next shows the new deadline.
	written := false
	defer func() {
		if written {
			g.awaitCache(ctx, id, changed, func(p *corev1.Pod) bool { return p.Annotations[node.AnnotationDeadline] == deadline })
		}
	}()
	if claimed(pod) {
		// Set on the claim, from which agent-sandbox keeps the pod's.
		if err := g.claims.setAnnotation(ctx, id, node.AnnotationDeadline, deadline); err != nil {
			return nil, err
		}
		g.log.Info("sandbox_timeout_set", "sandbox_id", id, "deadline", deadline)
		written = true
		got := pod.DeepCopy()
		got.Annotations[node.AnnotationDeadline] = deadline
		return got, nil
	}
	// The UID in the patch is a precondition: a pod made again under the
	// same name in the meantime is not touched.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID,
		"annotations": map[string]string{node.AnnotationDeadline: deadline},
	}})
	if err != nil {
		return nil, err
	}
	got, err := g.cfg.Kube.CoreV1().Pods(g.cfg.Namespace).Patch(ctx, pod.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, kubeErr("set the deadline of sandbox "+id, err)
	}
	g.log.Info("sandbox_timeout_set", "sandbox_id", id, "deadline", got.Annotations[node.AnnotationDeadline])
	written = true
	return got, nil
}

// cacheLag bounds how long a write waits for the informer to show it.
const cacheLag = 10 * time.Second

// awaitCache waits until the informer's copy of the sandbox id's pod
// satisfies done (or the pod is gone), at most cacheLag: a caller's next
// read on this replica then shows its own write. changed is a watch of id
// taken before the write.
func (g *Gateway) awaitCache(ctx context.Context, id string, changed <-chan struct{}, done func(*corev1.Pod) bool) {
	ctx, cancel := context.WithTimeout(ctx, cacheLag)
	defer cancel()
	for {
		pod, err := g.podByID(id)
		if err != nil || done(pod) {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			g.log.Warn("gateway_cache_lagging", "sandbox_id", id, "after", cacheLag)
			return
		}
	}
}
