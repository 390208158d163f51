package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/internal/quota"
	"github.com/berth-sandbox/berth/internal/units"
)

// A sandbox is paused while its pod has node.AnnotationPaused (the time
// the pause was asked, RFC 3339): its node pauses the sandbox through its
// daemon and says so in the pod's node.ConditionPaused, and resumes it
// once the annotation is gone (pause.go in internal/kube/node). The pod
// keeps its node and its place there while paused: what a pause frees is
// the sandbox's CPU and memory on that host, not the pod's requests.
//
// A paused sandbox's deadline keeps the time it had left: a resume moves
// node.AnnotationDeadline to now plus what was left at the pause, in the
// same write that removes the pause, unless the resume names a timeout.
// A sandbox made with auto_resume (AnnotationAutoResume) is resumed by
// the next data-plane request through a gateway, which then goes on.

// AnnotationAutoResume "true" says a paused sandbox resumes on its next
// data-plane request (the API's auto_resume); only the gateway reads it.
const AnnotationAutoResume = "berth.dev/auto-resume"

// pauseApplyTimeout bounds how long a pause or resume waits for its
// node's word (a memory checkpoint of a large gVisor sandbox takes
// seconds per GiB).
const pauseApplyTimeout = 5 * time.Minute

// pauseSandbox is POST /v1/sandboxes/{id}/pause, as on a daemon: it
// answers once the sandbox is paused (pausing a paused one changes
// nothing).
func (g *Gateway) pauseSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, err := g.pause(r.Context(), p, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toSandbox(pod))
}

// resumeSandbox is POST /v1/sandboxes/{id}/resume, as on a daemon: an
// optional {"timeout":"30m"} sets the deadline from now; without it the
// sandbox gets the time it had left. It answers once the sandbox runs.
func (g *Gateway) resumeSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in apitypes.ResumeRequest
	if err := decodeBody(r, &in, true, `{} or {"timeout":"30m"}`); err != nil {
		writeError(w, err)
		return
	}
	var d time.Duration
	if in.Timeout != "" {
		var err error
		if d, err = units.ParseDuration(in.Timeout); err != nil || d <= 0 {
			writeError(w, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout %q: want a positive duration such as 30m", in.Timeout))
			return
		}
	}
	pod, err := g.resume(r.Context(), p, r.PathValue("id"), d)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toSandbox(pod))
}

// pause pauses the caller's sandbox id and returns its pod once its node
// paused it. A pause its node's daemon refused is taken back off the pod.
func (g *Gateway) pause(ctx context.Context, p auth.Principal, id string) (*corev1.Pod, error) {
	pod, err := g.sandboxPod(ctx, p, id)
	if err != nil {
		return nil, err
	}
	switch st := state(pod); st {
	case apitypes.StatePaused:
		return pod, nil
	case apitypes.StateReady, apitypes.StatePausing:
	default:
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	value := pod.Annotations[node.AnnotationPaused]
	changed, stop := g.watch(id)
	defer stop()
	if value == "" {
		value = g.now().UTC().Format(time.RFC3339Nano)
		if err := g.writeAnnotations(ctx, pod, id, map[string]*string{node.AnnotationPaused: &value}); err != nil {
			return nil, err
		}
		g.log.Info("sandbox_pause_requested", "sandbox_id", id)
	}
	got, err := g.waitPause(ctx, id, pod.UID, value, changed)
	var refused *nodeRefused
	if !errors.As(err, &refused) {
		if err == nil {
			g.log.Info("sandbox_paused", "sandbox_id", id, "pause", value)
		} else {
			// The pause stays asked for on the pod; the caller hears why
			// this request could not see it done (an E2B client only as
			// a 409, which its SDK reads as "already paused").
			g.log.Warn("sandbox_pause_wait_failed", "sandbox_id", id, "pause", value, "err", err)
		}
		return got, err
	}
	g.log.Warn("sandbox_pause_refused", "sandbox_id", id, "err", refused.err)
	g.undoAnnotation(ctx, pod, id, node.AnnotationPaused, value, map[string]*string{node.AnnotationPaused: nil})
	return nil, refused.err
}

// resume brings the caller's paused sandbox id back and returns its pod
// once its node resumed it: with d > 0 its deadline is d from now, else
// the time it had left at the pause. A running sandbox is returned as
// it is.
func (g *Gateway) resume(ctx context.Context, p auth.Principal, id string, d time.Duration) (*corev1.Pod, error) {
	if d != 0 && (d < time.Second || d > g.cfg.MaxTimeout) {
		return nil, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout %s is out of range [1s, %s]", d, g.cfg.MaxTimeout)
	}
	if err := quota.Timeout(p.Key.Quota, d); err != nil {
		return nil, fieldErr("timeout", errdefs.ErrResourceExhausted, "%v", err)
	}
	pod, err := g.sandboxPod(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if state(pod) == apitypes.StateReady && pod.Annotations[node.AnnotationPaused] == "" {
		// This replica's cache may trail a pause its node's daemon made
		// on its own (at the deadline, or idle): the API server says.
		if pod, err = g.fresh(ctx, pod); err != nil {
			return nil, err
		}
	}
	switch st := state(pod); st {
	case apitypes.StateReady:
		if pod.Annotations[node.AnnotationPaused] == "" {
			return pod, nil
		}
	case apitypes.StatePaused, apitypes.StatePausing, apitypes.StateResuming:
	default:
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	now := g.now()
	set := map[string]*string{node.AnnotationPaused: nil}
	if dl, ok := g.resumeDeadline(pod, now, d, p.Key.Quota.MaxTimeout); ok {
		set[node.AnnotationDeadline] = &dl
	}
	changed, stop := g.watch(id)
	defer stop()
	// A sandbox paused at its deadline has no pause annotation: its new
	// deadline resumes it.
	if pod.Annotations[node.AnnotationPaused] != "" || set[node.AnnotationDeadline] != nil {
		if err := g.writeAnnotations(ctx, pod, id, set); err != nil {
			return nil, err
		}
		g.log.Info("sandbox_resume_requested", "sandbox_id", id)
	}
	got, err := g.waitPause(ctx, id, pod.UID, "", changed)
	var refused *nodeRefused
	if errors.As(err, &refused) {
		// The sandbox is paused still (or failed): its pod says so.
		g.log.Warn("sandbox_resume_refused", "sandbox_id", id, "err", refused.err)
		return nil, refused.err
	}
	if err == nil {
		g.log.Info("sandbox_resumed", "sandbox_id", id, "deadline", got.Annotations[node.AnnotationDeadline])
	}
	return got, err
}

// resumeDeadline is the deadline annotation a resume at now writes: d
// from now, or what was left between the pause (the annotation's time,
// or the time its node's daemon paused it on its own) and the old
// deadline, or, when under a second was left (a pause at the deadline),
// the gateway's default timeout from now, as a daemon gives it; ok is
// false when the pod has no deadline of its own.
func (g *Gateway) resumeDeadline(pod *corev1.Pod, now time.Time, d, quotaMax time.Duration) (string, bool) {
	if d > 0 {
		return deadlineAt(now, d), true
	}
	old, err := time.Parse(time.RFC3339, pod.Annotations[node.AnnotationDeadline])
	if err != nil {
		return "", false
	}
	var left time.Duration
	if at, err := time.Parse(time.RFC3339Nano, pod.Annotations[node.AnnotationPaused]); err == nil {
		left = old.Sub(at)
	} else if at, ok := node.PausedByDaemon(pod); ok {
		// Paused by its node's daemon (idle, or at the deadline).
		left = old.Sub(at)
	}
	if left < time.Second {
		left = g.cfg.DefaultTimeout
		if quotaMax > 0 {
			// Within the key's quota, as its create's default was.
			left = min(left, quotaMax)
		}
	}
	return deadlineAt(now, left), true
}

// e2bLifecycle is E2B's lifecycle of a sandbox pod.
func e2bLifecycle(pod *corev1.Pod) e2bwire.LifecycleBody {
	l := e2bwire.LifecycleBody{OnTimeout: apitypes.OnTimeoutKill, AutoResume: pod.Annotations[AnnotationAutoResume] == "true"}
	if pod.Annotations[node.AnnotationOnTimeout] == apitypes.OnTimeoutPause {
		l.OnTimeout = apitypes.OnTimeoutPause
	}
	return l
}

// waitPause waits (nodeWait) until the sandbox's node did what the pause
// annotation value want states ("": running) and returns that pod, or the
// node's daemon refused it (*nodeRefused), the sandbox ended, another
// writer changed the annotation, or pauseApplyTimeout passed.
func (g *Gateway) waitPause(ctx context.Context, id string, uid ktypes.UID, want string, changed <-chan struct{}) (*corev1.Pod, error) {
	caught := false
	pod, err := g.nodeWait(ctx, id, uid, changed, pauseApplyTimeout, "the pause or resume", func(pod *corev1.Pod) (bool, error) {
		if pod.Annotations[node.AnnotationPaused] == want {
			caught = true
			if done, err := node.PauseStatus(pod, want); done {
				if err != nil {
					return true, &nodeRefused{err}
				}
				return true, nil
			}
		} else if caught {
			return true, fmt.Errorf("sandbox %s: another update paused or resumed it before its node did this: %w", id, errdefs.ErrFailedPrecondition)
		}
		switch st := state(pod); st {
		case apitypes.StateReady, apitypes.StatePausing, apitypes.StatePaused, apitypes.StateResuming:
			return false, nil
		default:
			return true, fmt.Errorf("sandbox %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
		}
	})
	if err != nil {
		return nil, err
	}
	return pod, nil
}

// awake returns the caller's sandbox pod ready for a data-plane request:
// a paused one made with auto_resume is resumed first, on its owner's
// behalf (asOwner); any other is returned as it is (target then says why
// it cannot be reached). Another replica may have paused or resumed it a
// moment ago, which this one's cache may not show yet: a pod the cache
// shows paused, or one made with auto_resume, is read from the API server
// (one GET) before it is refused, resumed or reached.
func (g *Gateway) awake(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	auto := pod.Annotations[AnnotationAutoResume] == "true"
	if !auto && !pausedish(state(pod)) {
		return pod, nil
	}
	fresh, err := g.freshPod(ctx, pod)
	if err != nil {
		return nil, err
	}
	// Paused by the annotation, even before its node's condition says so.
	st := state(fresh)
	if !pausedish(st) && fresh.Annotations[node.AnnotationPaused] == "" {
		return fresh, nil
	}
	if !auto {
		return nil, fmt.Errorf("sandbox %s is %s: resume it first (POST /v1/sandboxes/%s/resume), or create it with auto_resume: %w",
			sandboxID(pod), st, sandboxID(pod), errdefs.ErrFailedPrecondition)
	}
	g.log.Info("sandbox_auto_resume", "sandbox_id", sandboxID(pod))
	// The resume reads the pod from the cache, which may lag behind the
	// API server's copy just read: it waits for the cache to catch up.
	changed, stop := g.watch(sandboxID(pod))
	want := fresh.Annotations[node.AnnotationPaused]
	g.awaitCache(ctx, sandboxID(pod), changed, func(c *corev1.Pod) bool { return c.Annotations[node.AnnotationPaused] == want || c.UID != fresh.UID })
	stop()
	return g.resume(ctx, g.asOwner(pod), sandboxID(pod), 0)
}

// asOwner is the principal an automatic resume of pod acts as: its owner
// key, whose max_timeout then caps the deadline the resume gives, whoever
// sent the request that woke it (the sandbox's own token, an admin key).
// The operator where the gateway has no keys, or the owner's key has left
// the keys file (no quota is left to apply).
func (g *Gateway) asOwner(pod *corev1.Pod) auth.Principal {
	if ks, ok := g.cfg.Keys.(interface {
		ByID(string) (core.APIKey, bool)
	}); ok {
		if k, ok := ks.ByID(ownerOf(pod)); ok {
			return auth.Principal{Key: k}
		}
	}
	return auth.Principal{Operator: true}
}

// freshPod reads pod again from the API server (one GET), for a decision
// this replica's cache may be behind on: another replica, or the pod's
// node, changed it a moment ago. A pod made again under the same name is
// another sandbox: not found.
func (g *Gateway) freshPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	fresh, err := g.cfg.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, kubeErr("read sandbox "+sandboxID(pod), err)
	}
	if fresh.UID != pod.UID {
		return nil, fmt.Errorf("sandbox %s: %w", sandboxID(pod), errdefs.ErrNotFound)
	}
	return fresh, nil
}

// pausedish says whether a sandbox in state st is paused or on its way
// into or out of a pause.
func pausedish(st string) bool {
	return st == apitypes.StatePaused || st == apitypes.StatePausing || st == apitypes.StateResuming
}

// e2bPause is E2B's POST /sandboxes/{id}/pause: 204 once paused, 409 when
// it already was (the SDK's pause() then returns false).
func (g *Gateway) e2bPause(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, ok := g.e2bPod(r.Context(), w, p, r.PathValue("id"))
	if !ok {
		return
	}
	if state(pod) == apitypes.StatePaused {
		e2bwire.WriteError(w, http.StatusConflict, "sandbox "+sandboxID(pod)+" is already paused")
		return
	}
	if _, err := g.pause(r.Context(), p, sandboxID(pod)); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bResume is E2B's deprecated POST /sandboxes/{id}/resume: 201 with the
// sandbox once it runs, 409 when it was not paused.
func (g *Gateway) e2bResume(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in e2bwire.TimeoutBody
	pod, ok := g.e2bPodWith(w, r, p, &in)
	if !ok {
		return
	}
	if st := state(pod); st != apitypes.StatePaused && st != apitypes.StatePausing && st != apitypes.StateResuming {
		e2bwire.WriteError(w, http.StatusConflict, "sandbox "+sandboxID(pod)+" is not paused")
		return
	}
	g.e2bResumeAndAnswer(w, r, p, pod, in.Timeout)
}

// e2bResumeAndAnswer resumes a paused E2B sandbox (timeout seconds, when
// given, set its deadline) and answers 201 with it, as E2B's connect does
// for a sandbox it resumed.
func (g *Gateway) e2bResumeAndAnswer(w http.ResponseWriter, r *http.Request, p auth.Principal, pod *corev1.Pod, timeout *int64) {
	var d time.Duration
	if timeout != nil && *timeout > 0 {
		if *timeout > math.MaxInt32 {
			e2bFieldErr(w, http.StatusBadRequest, "timeout", "%d: want a number of seconds", *timeout)
			return
		}
		d = time.Duration(*timeout) * time.Second
	}
	token, ok := g.e2bToken(w, pod)
	if !ok {
		return
	}
	// The resume must not end with a client that gives up waiting.
	got, err := g.resume(context.WithoutCancel(r.Context()), p, sandboxID(pod), d)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	e2bwire.WriteJSON(w, http.StatusCreated, g.e2bBody(got, token))
}

// fresh is pod as the API server has it now. This replica's cache trails
// what a node or another replica wrote by as long as its watch takes: a
// read that must show a change just made elsewhere (a connect through
// one replica, then getInfo through another) asks the API server. A pod
// of the same name but another UID is not this sandbox's: pod stays.
func (g *Gateway) fresh(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	got, err := g.cfg.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if got.UID != pod.UID {
		return pod, nil
	}
	return got, nil
}

// freshOrCached is fresh for a read: the cached pod when the API server
// cannot answer (it is gone meanwhile, or unreachable), as a read served
// from the cache alone would have been.
func (g *Gateway) freshOrCached(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	if got, err := g.fresh(ctx, pod); err == nil {
		return got
	}
	return pod
}

// current is a sandbox's pod as of now for a read, not as this replica's
// cache last heard: pod itself when it was just read from the API server
// (fresh, requestPod), freshOrCached otherwise. One GET either way.
func (g *Gateway) current(ctx context.Context, pod *corev1.Pod, fresh bool) *corev1.Pod {
	if fresh {
		return pod
	}
	return g.freshOrCached(ctx, pod)
}
