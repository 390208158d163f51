package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/internal/quota"
	"github.com/berth-sandbox/berth/internal/units"
)

// createRequest is the wire request with CPU as a pointer, so an explicit
// 0 is refused rather than read as the default (as the daemon does).
type createRequest struct {
	types.CreateRequest
	CPU *float64 `json:"cpu"`
}

// maxBody bounds a create's body.
const maxBody = 1 << 20

func decodeCreate(r *http.Request) (createRequest, error) {
	var in createRequest
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return in, fieldErr("body", errdefs.ErrInvalidArgument, "read request body (at most %d bytes): %v", maxBody, err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return in, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute):
			field := errdefs.JSONField(ute.Field)
			return in, fieldErr(field, errdefs.ErrInvalidArgument, "%s: want %s, got JSON %s", field, ute.Type, ute.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return in, fieldErr(name, errdefs.ErrInvalidArgument, "unknown field %q", name)
		}
		return in, fieldErr("body", errdefs.ErrInvalidArgument, "malformed JSON: %v", err)
	}
	if dec.More() {
		return in, fieldErr("body", errdefs.ErrInvalidArgument, "body holds more than one JSON value")
	}
	return in, nil
}

// podFor translates a create into its pod, naming any field it cannot
// take. templates is every template a Ready Berth node has.
func (g *Gateway) podFor(in createRequest, p auth.Principal, templates map[string]bool) (*corev1.Pod, error) {
	owner := p.Owner()
	// What a pod cannot carry yet is refused, not dropped.
	for field, set := range map[string]bool{
		"disk": in.Disk != "", "pids": in.PIDs != 0,
	} {
		if set {
			return nil, fieldErr(field, errdefs.ErrNotImplemented, "%s is not served by the Kubernetes gateway yet (a Berth daemon serves it)", field)
		}
	}
	tpl := in.Template
	if tpl == "" {
		tpl = g.cfg.DefaultTemplate
	}
	if tpl == "" {
		return nil, fieldErr("template", errdefs.ErrInvalidArgument, "template is empty and the gateway has no default template")
	}
	if !templates[tpl] {
		return nil, fieldErr("template", errdefs.ErrNotFound, "template %q: no Ready Berth node has it", tpl)
	}
	ann := map[string]string{node.AnnotationTemplate: tpl}
	switch in.Isolation {
	case "":
	case types.IsolationRunc, types.IsolationGVisor:
		ann[node.AnnotationIsolation] = in.Isolation
	default:
		return nil, fieldErr("isolation", errdefs.ErrInvalidArgument, "isolation %q: want one of %s, %s", in.Isolation, types.IsolationRunc, types.IsolationGVisor)
	}
	if in.Network != nil {
		_, v, err := networkAnnotation(*in.Network, "network.")
		if err != nil {
			return nil, err
		}
		ann[node.AnnotationNetwork] = v
	}
	if in.User != "" {
		if !types.ValidUserName(in.User) {
			return nil, fieldErr("user", errdefs.ErrInvalidArgument, "user %q: want a POSIX account name (letters, digits, _, - and ., at most 32 characters)", in.User)
		}
		ann[node.AnnotationUser] = in.User
	}
	if in.AllowSudo != nil {
		ann[node.AnnotationAllowSudo] = strconv.FormatBool(*in.AllowSudo)
	}
	if in.AutoResume {
		// The gateway resumes it on a data-plane request (pause.go).
		ann[AnnotationAutoResume] = "true"
	}
	if in.IdlePause != "" {
		d, err := units.ParseDuration(in.IdlePause)
		if err != nil || d < time.Second || d > g.cfg.MaxTimeout {
			return nil, fieldErr("idle_pause", errdefs.ErrInvalidArgument, "idle_pause %q: want a duration in [1s, %s], such as 15m", in.IdlePause, g.cfg.MaxTimeout)
		}
		// Its node's daemon pauses it once idle that long (pause.go).
		ann[node.AnnotationIdlePause] = d.String()
	}
	switch in.OnTimeout {
	case "", types.OnTimeoutKill:
	case types.OnTimeoutPause:
		// Its node's daemon pauses it at the deadline (pause.go).
		ann[node.AnnotationOnTimeout] = in.OnTimeout
	default:
		return nil, fieldErr("on_timeout", errdefs.ErrInvalidArgument, "on_timeout %q: want %s or %s", in.OnTimeout, types.OnTimeoutKill, types.OnTimeoutPause)
	}
	for k, v := range map[string]map[string]string{node.AnnotationEnv: in.Env, AnnotationLabels: in.Labels} {
		if len(v) > 0 {
			b, _ := json.Marshal(v)
			ann[k] = string(b)
		}
	}
	limits := corev1.ResourceList{}
	if in.CPU != nil {
		if !(*in.CPU >= 0.1 && *in.CPU <= 1<<20) {
			return nil, fieldErr("cpu", errdefs.ErrInvalidArgument, "cpu %v: want a number of cores, at least 0.1", *in.CPU)
		}
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(math.Ceil(*in.CPU*1000)), resource.DecimalSI)
	}
	if in.Memory != "" {
		n, err := units.ParseSize(in.Memory)
		if err != nil || n == 0 {
			return nil, fieldErr("memory", errdefs.ErrInvalidArgument, "memory %q: want a size such as 512M", in.Memory)
		}
		limits[corev1.ResourceMemory] = *resource.NewQuantity(n, resource.BinarySI)
	}
	timeout := g.cfg.DefaultTimeout
	if in.Timeout != "" {
		d, err := units.ParseDuration(in.Timeout)
		if err != nil || d <= 0 {
			return nil, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout %q: want a positive duration such as 10m", in.Timeout)
		}
		timeout = d
	}
	if timeout > g.cfg.MaxTimeout {
		return nil, fieldErr("timeout", errdefs.ErrInvalidArgument, "timeout %s is above the gateway's maximum %s", timeout, g.cfg.MaxTimeout)
	}
	if err := quota.Timeout(p.Key.Quota, timeout); err != nil {
		return nil, fieldErr("timeout", errdefs.ErrResourceExhausted, "%v", err)
	}
	// The node makes the deadline annotation its sandbox's deadline, and
	// follows it when POST …/timeout moves it (timeout.go).
	ann[node.AnnotationDeadline] = deadlineAt(g.now(), timeout)
	policy := in.OnNodeLost
	if policy == "" {
		policy = g.cfg.OnNodeLost
	}
	switch policy {
	case types.OnNodeLostFail, types.OnNodeLostRecreate:
		ann[AnnotationOnNodeLost] = policy
	default:
		return nil, fieldErr("on_node_lost", errdefs.ErrInvalidArgument, "on_node_lost %q: want %s or %s", in.OnNodeLost, types.OnNodeLostFail, types.OnNodeLostRecreate)
	}
	labels := map[string]string{LabelManagedBy: ManagedBy}
	if owner != "" {
		labels[LabelOwner] = owner
	}
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: types.NewSandboxID(), Namespace: g.cfg.Namespace, Labels: labels, Annotations: ann},
		Spec: corev1.PodSpec{
			// The sandbox lives until it is deleted or its deadline;
			// its container has no command of its own.
			RestartPolicy:                corev1.RestartPolicyNever,
			NodeSelector:                 map[string]string{node.TaintKey: "true"},
			Tolerations:                  []corev1.Toleration{{Key: node.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			Containers: []corev1.Container{{
				Name: containerName, Image: tpl,
				// Requests equal limits: the scheduler counts what the
				// sandbox may use.
				Resources: corev1.ResourceRequirements{Limits: limits, Requests: limits},
			}},
		},
	}, nil
}

// templates is every template some Ready Berth node has
// (node.AnnotationTemplates).
func (g *Gateway) templates() (map[string]bool, error) {
	nodes, err := g.nodes.List(everything())
	if err != nil {
		return nil, err
	}
	out, ready := map[string]bool{}, 0
	for _, n := range nodes {
		if !nodeReady(n) {
			continue
		}
		ready++
		for t := range strings.SplitSeq(n.Annotations[node.AnnotationTemplates], ",") {
			if t != "" {
				out[t] = true
			}
		}
	}
	if ready == 0 {
		return nil, fmt.Errorf("no Berth node is Ready: %w", errdefs.ErrUnavailable)
	}
	return out, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (g *Gateway) createSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	in, err := decodeCreate(r)
	if err != nil {
		writeError(w, err)
		return
	}
	tpls, err := g.templates()
	if err != nil {
		writeError(w, err)
		return
	}
	var pod *corev1.Pod
	if in.Snapshot != "" {
		pod, err = g.podFromSnapshot(r.Context(), in, p, tpls)
	} else {
		pod, err = g.podFor(in, p, tpls)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	got, err := g.makeSandbox(r.Context(), pod, p.Key.Quota)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, toSandbox(got))
}

// makeSandbox makes pod's sandbox, within its owner's quota q: through a
// SandboxClaim where a SandboxWarmPool serves its template (claims.go),
// else as the pod itself. It returns the sandbox's pod once it runs.
func (g *Gateway) makeSandbox(ctx context.Context, pod *corev1.Pod, q core.Quota) (*corev1.Pod, error) {
	tpl := pod.Annotations[node.AnnotationTemplate]
	owner := pod.Labels[LabelOwner]
	pool := g.claims.pool(tpl)
	if pool == "" || pod.Annotations[node.AnnotationSnapshot] != "" {
		// A sandbox from a snapshot starts from the snapshot, not from
		// a warm pod of its template.
		ask := podResources(pod)
		if err := g.admit(ctx, owner, q, "", ask, false); err != nil {
			return nil, err
		}
		return g.create(ctx, pod, func(ctx context.Context) error { return g.admit(ctx, owner, q, pod.Name, ask, true) })
	}
	// The pool's SandboxTemplate is the pod's spec; a claim changes
	// only its metadata.
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := pod.Spec.Containers[0].Resources.Limits[res]; ok {
			return nil, fieldErr(string(res), errdefs.ErrInvalidArgument,
				"%s: sandboxes of template %q are made through SandboxWarmPool %q, whose SandboxTemplate sets their resources; leave %s out", res, tpl, pool, res)
		}
	}
	if err := g.claims.handOver(pool, pod); err != nil {
		return nil, err
	}
	ask := g.claims.poolResources(pool)
	if err := g.admit(ctx, owner, q, "", ask, false); err != nil {
		return nil, err
	}
	return g.createClaim(ctx, pod, pool, func(ctx context.Context) error { return g.admit(ctx, owner, q, pod.Name, ask, true) })
}

// createClaim makes a SandboxClaim of pool named by the pod's name (the
// sandbox ID), checks it with admitted, and waits until agent-sandbox's
// pod for it runs. A claim not admitted, or whose pod fails, cannot be
// placed or is not running in time, is deleted, and the error says why.
func (g *Gateway) createClaim(ctx context.Context, pod *corev1.Pod, pool string, admitted func(context.Context) error) (*corev1.Pod, error) {
	id := pod.Name
	changed, stop := g.watch(id)
	defer stop()
	claims := g.claims.client.Resource(claimsGVR).Namespace(g.cfg.Namespace)
	made, err := claims.Create(ctx, claimFor(pod, pool), metav1.CreateOptions{})
	if err != nil {
		return nil, kubeErr("create the SandboxClaim of sandbox "+id, err)
	}
	err = admitted(ctx)
	var running *corev1.Pod
	if err == nil {
		running, err = g.waitRunning(ctx, id, "", changed)
	}
	if err == nil {
		// A warm pod handed over ran with its template's policy: nothing
		// runs in it for the caller before its node applied the claim's.
		if err = g.waitNetwork(ctx, id, running.UID, claimNetwork(pod), changed); err != nil {
			var refused *nodeRefused
			if errors.As(err, &refused) {
				err = fmt.Errorf("sandbox %s: its node refused the network policy: %w", id, refused.err)
			}
		} else {
			running, err = g.podByID(id)
		}
	}
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		uid := made.GetUID()
		derr := claims.Delete(dctx, id, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if derr != nil && !apierrors.IsNotFound(derr) {
			g.log.Warn("sandbox_claim_delete_failed", "sandbox_id", id, "err", derr)
		}
		return nil, err
	}
	g.log.Info("sandbox_claimed", "sandbox_id", id, "pool", pool, "pod", running.Name)
	return running, nil
}

// create makes the pod, checks it with admitted, and waits, on the shared
// informer, until it runs. A pod not admitted, or that fails, cannot be
// placed or is not running in time, is deleted, and the error says why.
func (g *Gateway) create(ctx context.Context, pod *corev1.Pod, admitted func(context.Context) error) (*corev1.Pod, error) {
	changed, stop := g.watch(pod.Name)
	defer stop()
	made, err := g.cfg.Kube.CoreV1().Pods(g.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, kubeErr("create sandbox pod", err)
	}
	err = admitted(ctx)
	var running *corev1.Pod
	if err == nil {
		running, err = g.waitRunning(ctx, made.Name, made.UID, changed)
	}
	if err != nil {
		// Teardown outlives the request that gave up.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := g.deletePod(dctx, made.Name, made.UID); derr != nil && !errors.Is(derr, errdefs.ErrNotFound) {
			g.log.Warn("sandbox_pod_delete_failed", "sandbox_id", made.Name, "err", derr)
		}
		return nil, err
	}
	return running, nil
}

// waitRunning reads the sandbox id's pod from the cache each time the
// informer says it (or its claim) changed, until it runs, fails, or the
// create's time is up. uid is the pod's when the gateway made it; "" for
// a claim's, whose claim is also read for a failure.
func (g *Gateway) waitRunning(ctx context.Context, id string, uid ktypes.UID, changed <-chan struct{}) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CreateTimeout)
	defer cancel()
	seen := false
	for {
		if uid == "" {
			if err := g.claims.failed(id); err != nil {
				return nil, err
			}
		}
		pod, err := g.podByID(id)
		switch {
		case apierrors.IsNotFound(err):
			if seen {
				return nil, fmt.Errorf("sandbox %s: its pod was deleted while it was being made: %w", id, errdefs.ErrFailedPrecondition)
			}
		case err != nil:
			return nil, err
		case uid != "" && pod.UID != uid:
			// An older pod of the same name, still in the cache.
		default:
			seen = true
			if done, err := startOutcome(pod); done {
				return pod, err
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("sandbox %s: its pod did not run within %s: %w", id, g.cfg.CreateTimeout, errdefs.ErrDeadlineExceeded)
			}
			return nil, ctx.Err()
		}
	}
}

// startOutcome says whether a new pod's start is decided, and how: nil
// once it runs (with its sandbox known), else why it will not.
func startOutcome(pod *corev1.Pod) (bool, error) {
	st := pod.Status
	switch st.Phase {
	case corev1.PodRunning:
		if _, err := sandboxOf(pod); err == nil {
			return true, nil
		}
	case corev1.PodFailed, corev1.PodSucceeded:
		class := errdefs.ErrFailedPrecondition
		if st.Reason == "BerthInvalidPod" {
			class = errdefs.ErrInvalidArgument
		}
		return true, fmt.Errorf("sandbox %s failed on node %s: %s: %w", sandboxID(pod), pod.Spec.NodeName, endReason(pod), class)
	}
	if pod.DeletionTimestamp != nil {
		return true, fmt.Errorf("sandbox %s: its pod is being deleted: %w", sandboxID(pod), errdefs.ErrFailedPrecondition)
	}
	for _, c := range st.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true, fmt.Errorf("sandbox %s: no Berth node can take it: %s: %w", sandboxID(pod), c.Message, errdefs.ErrResourceExhausted)
		}
	}
	return false, nil
}

// endReason is why a pod ended, from its status and its container's.
func endReason(pod *corev1.Pod) string {
	st := pod.Status
	var parts []string
	if st.Reason != "" {
		parts = append(parts, st.Reason)
	}
	if st.Message != "" {
		parts = append(parts, st.Message)
	}
	for _, cs := range st.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.Message != "" && !slices.Contains(parts, t.Message) {
			parts = append(parts, t.Message)
		}
	}
	if len(parts) == 0 {
		return string(st.Phase)
	}
	return strings.Join(parts, ": ")
}

// kubeErr classifies an API server error.
func kubeErr(what string, err error) error {
	class := errdefs.ErrUnavailable
	switch {
	case apierrors.IsNotFound(err):
		class = errdefs.ErrNotFound
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		class = errdefs.ErrAlreadyExists
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		class = errdefs.ErrInvalidArgument
	case apierrors.IsForbidden(err):
		// The gateway's own RBAC or a quota of the namespace.
		class = errdefs.ErrPermissionDenied
		if strings.Contains(err.Error(), "exceeded quota") {
			class = errdefs.ErrResourceExhausted
		}
	case apierrors.IsTooManyRequests(err):
		class = errdefs.ErrResourceExhausted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %v: %w", what, err, class)
}
