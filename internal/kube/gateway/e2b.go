package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/proto/envd"
)

// The E2B API on the gateway: E2B's control plane (create, list, get,
// kill) with each sandbox a pod, and E2B's data-plane routing (the
// E2b-Sandbox-Id/E2b-Sandbox-Port headers or a Host
// "<port>-<id>.<domain>") to the node that runs the sandbox. As the
// rest of the gateway it keeps nothing of its own: what E2B knows about a
// sandbox beyond the native API is in its pod's annotations.

// Annotations of a sandbox pod made through the E2B API.
const (
	// AnnotationEnvdTokenSHA256 is the hex sha256 of the sandbox's
	// envdAccessToken. The token itself is shown once, in the create's
	// answer, and kept nowhere; a pod with this annotation is an E2B
	// sandbox.
	AnnotationEnvdTokenSHA256 = "berth.dev/e2b-envd-token-sha256"
	// AnnotationE2BMetadata is the sandbox's E2B metadata, a JSON object
	// of strings.
	AnnotationE2BMetadata = "berth.dev/e2b-metadata"
	// AnnotationE2BNetwork is the create's network settings as getInfo
	// echoes them (e2bwire.NetworkConfig.StoreJSON).
	AnnotationE2BNetwork = "berth.dev/e2b-network"
	// AnnotationTrafficTokenSHA256 is the hex sha256 of the sandbox's
	// trafficAccessToken, on a sandbox made with allowPublicTraffic:
	// false: its ports then answer only requests that carry the token.
	AnnotationTrafficTokenSHA256 = "berth.dev/e2b-traffic-token-sha256"
)

// Bounds of E2B metadata (the daemon's: internal/sandbox's owner.go).
const (
	maxMetadataEntries = 64
	maxMetadataKey     = 256
	maxMetadataValue   = 4096
)

// domain is the E2B preview domain.
func (g *Gateway) domain() string {
	if d := strings.ToLower(strings.TrimSuffix(g.cfg.Domain, ".")); d != "" {
		return d
	}
	return e2bwire.DefaultDomain
}

// serveHTTP is the gateway's root: E2B data-plane traffic (by header, then
// by preview Host) first, then the routes.
func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok, err := e2bwire.Target(r, g.domain(), envd.Port); err != nil {
		e2bwire.WriteErr(w, err)
		return
	} else if ok {
		g.e2bSandbox(w, r, id, port)
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		g.e2bSignedFiles(w, r)
		return
	}
	g.mux.ServeHTTP(w, r)
}

// e2bRoutes are E2B's control-plane routes. What the gateway does not
// serve answers 501 in E2B's error shape, never 404: the SDKs read 404 on
// a sandbox route as "no such sandbox".
func (g *Gateway) e2bRoutes() {
	m := g.mux
	m.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("POST /sandboxes", g.e2bAuthed(g.e2bCreate))
	m.HandleFunc("POST /v2/sandboxes", g.e2bAuthed(g.e2bCreate))
	m.HandleFunc("GET /sandboxes", g.e2bAuthed(g.e2bListV1))
	m.HandleFunc("GET /v2/sandboxes", g.e2bAuthed(g.e2bList))
	m.HandleFunc("GET /sandboxes/{id}", g.e2bAuthed(g.e2bGet))
	m.HandleFunc("DELETE /sandboxes/{id}", g.e2bAuthed(g.e2bKill))
	g.e2bTimeoutRoutes()
	m.HandleFunc("POST /sandboxes/{id}/connect", g.e2bAuthed(g.e2bConnect))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", g.e2bAuthed(g.e2bConnect))
	m.HandleFunc("PUT /sandboxes/{id}/network", g.e2bAuthed(g.e2bUpdateNetwork))
	m.HandleFunc("POST /sandboxes/{id}/pause", g.e2bAuthed(g.e2bPause))
	m.HandleFunc("GET /sandboxes/{id}/metrics", g.e2bAuthed(g.e2bMetrics))
	m.HandleFunc("GET /sandboxes/metrics", g.e2bAuthed(g.e2bManyMetrics))
	m.HandleFunc("GET /sandboxes/{id}/logs", g.e2bAuthed(g.e2bLogs(false)))
	m.HandleFunc("GET /v2/sandboxes/{id}/logs", g.e2bAuthed(g.e2bLogs(true)))
	m.HandleFunc("POST /sandboxes/{id}/resume", g.e2bAuthed(g.e2bResume))
	m.HandleFunc("POST /sandboxes/{id}/snapshots", g.e2bAuthed(g.e2bCreateSnapshot))
	m.HandleFunc("POST /sandboxes/{id}/fork", g.e2bAuthed(g.e2bFork))
	m.HandleFunc("GET /snapshots", g.e2bAuthed(g.e2bListSnapshots))
	m.HandleFunc("DELETE /templates/{templateID}", g.e2bAuthed(g.e2bDeleteSnapshot))
	g.e2bTemplateRoutes()
	for pattern, missing := range e2bNotServed {
		m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			e2bwire.WriteError(w, http.StatusNotImplemented,
				fmt.Sprintf("%s %s is not served by the Kubernetes gateway (berth serve --kubernetes): %s", r.Method, r.URL.Path, missing))
		})
	}
}

// e2bTimeoutRoutes are POST /sandboxes/{id}/timeout ({timeout} seconds
// from now) and /refreshes ({duration} seconds more, E2B's default when 0),
// both the native timeout route's setTimeout: a patch of the pod's
// deadline annotation, which its node follows.
func (g *Gateway) e2bTimeoutRoutes() {
	g.mux.HandleFunc("POST /sandboxes/{id}/timeout", g.e2bAuthed(func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		var in e2bwire.TimeoutBody
		if err := e2bwire.Decode(r, &in); err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
		if in.Timeout == nil || *in.Timeout <= 0 || *in.Timeout > math.MaxInt32 {
			e2bFieldErr(w, http.StatusBadRequest, "timeout", "want a positive number of seconds")
			return
		}
		g.e2bSetTimeout(w, r, p, time.Duration(*in.Timeout)*time.Second)
	}))
	g.mux.HandleFunc("POST /sandboxes/{id}/refreshes", g.e2bAuthed(func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		var in struct {
			Duration int64 `json:"duration"`
		}
		if err := e2bwire.Decode(r, &in); err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
		if in.Duration < 0 || in.Duration > math.MaxInt32 {
			e2bFieldErr(w, http.StatusBadRequest, "duration", "%d: want a number of seconds, 0 for the default", in.Duration)
			return
		}
		d := e2bwire.DefaultTimeout
		if in.Duration > 0 {
			d = time.Duration(in.Duration) * time.Second
		}
		g.e2bSetTimeout(w, r, p, d)
	}))
}

// e2bSetTimeout moves the caller's E2B sandbox's deadline to d from now.
func (g *Gateway) e2bSetTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal, d time.Duration) {
	pod, ok := g.e2bPod(r.Context(), w, p, r.PathValue("id"))
	if !ok {
		return
	}
	if _, err := g.setTimeout(r.Context(), p, sandboxID(pod), d); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bConnect answers E2B's connect for a running sandbox: 200 with its
// envdAccessToken (derived again, tokens.go); a timeout in the body only
// ever extends the deadline, as on E2B and the daemon.
func (g *Gateway) e2bConnect(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in e2bwire.TimeoutBody
	pod, ok := g.e2bPodWith(w, r, p, &in)
	if !ok {
		return
	}
	id := sandboxID(pod)
	if st := state(pod); st == apitypes.StatePaused || st == apitypes.StatePausing || st == apitypes.StateResuming {
		// E2B's connect resumes a paused sandbox and answers 201.
		g.e2bResumeAndAnswer(w, r, p, pod, in.Timeout)
		return
	}
	token, ok := g.e2bToken(w, pod)
	if !ok {
		return
	}
	if in.Timeout != nil && *in.Timeout > 0 {
		if *in.Timeout > math.MaxInt32 {
			e2bFieldErr(w, http.StatusBadRequest, "timeout", "%d: want a number of seconds", *in.Timeout)
			return
		}
		d := time.Duration(*in.Timeout) * time.Second
		if g.now().Add(d).After(toSandbox(pod).Deadline) {
			if _, err := g.setTimeout(r.Context(), p, id, d); err != nil {
				e2bwire.WriteErr(w, err)
				return
			}
		}
	}
	e2bwire.WriteJSON(w, http.StatusOK, g.e2bBody(pod, token))
}

// e2bToken is the sandbox's envdAccessToken, derived again (tokens.go);
// a sandbox whose token was made under another key is answered 409.
func (g *Gateway) e2bToken(w http.ResponseWriter, pod *corev1.Pod) (string, bool) {
	token, ok := g.podToken(pod)
	if !ok {
		e2bwire.WriteError(w, http.StatusConflict, fmt.Sprintf("sandbox %s: its envdAccessToken was not made from a key this gateway holds (secret %s), so it cannot be handed out again; use the token its create returned", sandboxID(pod), TokenKeySecret))
	}
	return token, ok
}

// e2bBody is connect's answer: the sandbox with its tokens.
func (g *Gateway) e2bBody(pod *corev1.Pod, token string) e2bwire.SandboxBody {
	id := sandboxID(pod)
	var traffic *string
	if h := pod.Annotations[AnnotationTrafficTokenSHA256]; h != "" {
		if tok, ok := g.tokenFor(trafficPurpose, id, h); ok {
			traffic = &tok
		}
	}
	return e2bwire.SandboxBody{
		TemplateID: pod.Annotations[node.AnnotationTemplate], SandboxID: id, ClientID: e2bwire.ClientID,
		EnvdVersion: envd.Version, EnvdAccessToken: token, TrafficAccessToken: traffic, Domain: g.domain(),
	}
}

// e2bUpdateNetwork is E2B's PUT /sandboxes/{id}/network: the body is read
// as the daemon's E2B API reads it (what it omits is cleared; the ingress
// settings stay as created) and becomes the pod's network annotation,
// with the E2B settings beside it, as the native PUT …/network does.
func (g *Gateway) e2bUpdateNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in e2bwire.NetworkConfig
	pod, ok := g.e2bPodWith(w, r, p, &in)
	if !ok {
		return
	}
	pol, stored, err := in.Update(pod.Annotations[AnnotationE2BNetwork], g.cfg.E2BNoInternet)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	_, value, err := networkAnnotation(policy.ToWire(pol), "network.")
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if err := g.setNetwork(r.Context(), p, sandboxID(pod), value, map[string]string{AnnotationE2BNetwork: stored}); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bNotServed are E2B's routes the gateway does not serve, with why.
var e2bNotServed = map[string]string{
	"/sandboxes/":     "this route of E2B's sandbox API is not served",
	"/v2/sandboxes/":  "this route of E2B's sandbox API is not served",
	"/snapshots":      "only GET lists snapshots",
	"/snapshots/":     "a snapshot is read with GET /snapshots and deleted with DELETE /templates/{id}",
	"/templates":      "templates are listed with the native API (GET /v1/templates); the SDK's Template.build and tags are served",
	"/templates/":     "templates are listed with the native API (GET /v1/templates); the SDK's Template.build and tags are served",
	"/v2/templates":   "the SDK's Template.build is served (POST /v3/templates, then POST /v2/templates/{id}/builds/{build})",
	"/v2/templates/":  "the SDK's Template.build is served (POST /v3/templates, then POST /v2/templates/{id}/builds/{build})",
	"/v3/templates":   "the SDK's Template.build is served (POST /v3/templates)",
	"/v3/templates/":  "the SDK's Template.build is served (POST /v3/templates)",
	"/teams":          "Berth has no teams: each API key sees its own sandboxes",
	"/teams/":         "Berth has no teams: each API key sees its own sandboxes",
	"/secrets":        "secrets are not managed through the E2B API",
	"/secrets/":       "secrets are not managed through the E2B API",
	"/volumes":        gatewayVolumes,
	"/volumes/":       gatewayVolumes,
	"/volumecontent/": gatewayVolumes,
	"/sandboxes/{id}": "only GET and DELETE are served on a sandbox",
}

// gatewayVolumes says why the gateway answers 501 for E2B's volumes.
const gatewayVolumes = "volumes are not served by the Kubernetes gateway yet: a volume lives on one Berth daemon, whose own E2B API serves them"

// e2bAuthed identifies the caller as authed does, answering in E2B's
// error shape.
func (g *Gateway) e2bAuthed(h func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return g.authedAs(e2bwire.WriteErr, h)
}

// isE2B reports whether the pod is a sandbox made through the E2B API.
func isE2B(pod *corev1.Pod) bool { return pod.Annotations[AnnotationEnvdTokenSHA256] != "" }

// e2bLive reports whether an E2B listing shows the sandbox: made or
// running, not ending or ended.
func e2bLive(pod *corev1.Pod) bool {
	switch state(pod) {
	case apitypes.StateReady, apitypes.StateCreating, apitypes.StatePausing, apitypes.StatePaused, apitypes.StateResuming:
		return true
	}
	return false
}

// e2bState maps the API's states onto E2B's two.
func e2bState(st string) string {
	if st == apitypes.StatePaused {
		return "paused"
	}
	return "running"
}

// e2bPod is the caller's live E2B sandbox id; anything else (another
// key's, a native one, an ended one) is answered 404, as the daemon
// does: a key learns nothing about what it does not own.
func (g *Gateway) e2bPod(ctx context.Context, w http.ResponseWriter, p auth.Principal, id string) (*corev1.Pod, bool) {
	pod, _, ok := g.e2bPodFresh(ctx, w, p, id)
	return pod, ok
}

// e2bPodFresh is e2bPod, and says whether the pod was read from the API
// server just now (requestPod).
func (g *Gateway) e2bPodFresh(ctx context.Context, w http.ResponseWriter, p auth.Principal, id string) (pod *corev1.Pod, fresh, ok bool) {
	var err error
	if apitypes.ValidSandboxID(id) == nil {
		pod, fresh, err = g.requestPod(ctx, id)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		e2bwire.WriteErr(w, err)
		return nil, false, false
	}
	if pod == nil || !p.Sees(ownerOf(pod)) || !isE2B(pod) || !e2bLive(pod) {
		e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		return nil, false, false
	}
	return pod, fresh, true
}

// e2bPodWith is e2bPod for a route with a JSON body, decoded into in.
func (g *Gateway) e2bPodWith(w http.ResponseWriter, r *http.Request, p auth.Principal, in any) (*corev1.Pod, bool) {
	pod, ok := g.e2bPod(r.Context(), w, p, r.PathValue("id"))
	if !ok {
		return nil, false
	}
	if err := e2bwire.Decode(r, in); err != nil {
		e2bwire.WriteErr(w, err)
		return nil, false
	}
	return pod, true
}

// e2bRequestErr answers a create's bad field: E2B's shape, the field first
// in the message.
func e2bFieldErr(w http.ResponseWriter, status int, field, format string, args ...any) {
	e2bwire.WriteError(w, status, field+": "+fmt.Sprintf(format, args...))
}

func (g *Gateway) e2bCreate(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var in e2bwire.CreateBody
	if err := e2bwire.Decode(r, &in); err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if in.TemplateID == "" {
		e2bFieldErr(w, http.StatusBadRequest, "templateID", "is required")
		return
	}
	volumes := ""
	if len(in.VolumeMounts) > 0 {
		volumes = "volumeMounts: " + gatewayVolumes
	}
	for _, msg := range []string{in.Unsupported(), in.CheckSecure(), volumes} {
		if msg != "" {
			e2bwire.WriteError(w, http.StatusBadRequest, msg)
			return
		}
	}
	timeout, ok := g.e2bTimeout(w, in.Timeout)
	if !ok {
		return
	}
	if len(in.Metadata) > maxMetadataEntries {
		e2bFieldErr(w, http.StatusBadRequest, "metadata", "%d entries, at most %d", len(in.Metadata), maxMetadataEntries)
		return
	}
	for k, v := range in.Metadata {
		if k == "" || len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			e2bFieldErr(w, http.StatusBadRequest, "metadata", "invalid entry %q (keys 1-%d bytes, values at most %d bytes)", k, maxMetadataKey, maxMetadataValue)
			return
		}
	}
	netCfg := e2bwire.NetworkConfig{}
	if in.Network != nil {
		netCfg = *in.Network
	}
	netCfg.AllowInternetAccess = in.AllowInternetAccess
	pol, internet, err := e2bwire.ApplyNetwork(netCfg, false, g.cfg.E2BNoInternet)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	if strings.Contains(in.TemplateID, ":") {
		// A tag of the cluster's names the template its build made.
		target, ok, err := g.e2bResolve(r.Context(), in.TemplateID)
		if err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
		if !ok {
			e2bFieldErr(w, http.StatusNotFound, "templateID", "template %q: no such tag", in.TemplateID)
			return
		}
		in.TemplateID = target
	}
	tpls, err := g.templates()
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	// A templateID that names one of the caller's snapshots makes the
	// sandbox from it (as on a daemon); any other names a template.
	var snap *snapshotRecord
	if !tpls[in.TemplateID] {
		rec, err := g.snapshotFor(r.Context(), p, in.TemplateID, "templateID")
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) {
			e2bFieldErr(w, http.StatusNotFound, "templateID", "template %q: no Ready Berth node has it, and no snapshot of yours has that ID", in.TemplateID)
			return
		}
		if err != nil {
			e2bwire.WriteErr(w, err)
			return
		}
		snap = &rec
	}
	// What the daemon gives an E2B sandbox: commands run as "user", who
	// may sudo (inside the sandbox's user namespace).
	sudo := true
	req := createRequest{CreateRequest: apitypes.CreateRequest{
		Template: in.TemplateID, Env: in.EnvVars,
		Timeout: strconv.FormatInt(int64(timeout/time.Second), 10) + "s",
		Network: &apitypes.NetworkPolicy{Mode: string(pol.Mode), Allow: pol.Allow, Deny: pol.Deny},
		User:    e2bwire.DefaultUser, AllowSudo: &sudo,
		AutoResume: in.AutoResume != nil && in.AutoResume.Enabled,
	}}
	if in.AutoPause != nil && *in.AutoPause {
		req.OnTimeout = apitypes.OnTimeoutPause
	}
	var pod *corev1.Pod
	if snap != nil {
		req.Template, req.Snapshot = "", snap.snap.ID
		pod, err = g.podOfSnapshot(*snap, req, p, tpls)
	} else {
		pod, err = g.podFor(req, p, tpls)
	}
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	var metadata string
	if len(in.Metadata) > 0 {
		b, _ := json.Marshal(in.Metadata)
		metadata = string(b)
	}
	g.e2bAnnotate(pod, netCfg.StoreJSON(internet), metadata, netCfg.AllowPublicTraffic != nil && !*netCfg.AllowPublicTraffic)
	got, err := g.makeSandbox(r.Context(), pod, p.Key.Quota)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	e2bwire.WriteJSON(w, http.StatusCreated, g.e2bBody(got, g.envdToken(sandboxID(got))))
}

// e2bTimeout is a create's or fork's timeout in seconds (E2B's default
// when nil), bounded by the gateway's maximum; a bad one is answered.
func (g *Gateway) e2bTimeout(w http.ResponseWriter, secs *int64) (time.Duration, bool) {
	timeout := e2bwire.DefaultTimeout
	if secs != nil {
		if *secs <= 0 || *secs > math.MaxInt32 {
			e2bFieldErr(w, http.StatusBadRequest, "timeout", "%d: want a positive number of seconds", *secs)
			return 0, false
		}
		timeout = time.Duration(*secs) * time.Second
	}
	if timeout > g.cfg.MaxTimeout {
		e2bFieldErr(w, http.StatusBadRequest, "timeout", "%ds is above the gateway's maximum of %d seconds", int64(timeout/time.Second), int64(g.cfg.MaxTimeout/time.Second))
		return 0, false
	}
	return timeout, true
}

// e2bAnnotate makes pod an E2B sandbox's: the hash of its envd token, its
// E2B network settings (stored) and metadata (JSON, "" for none), and,
// when its ports answer only requests with a traffic token, that token's
// hash. The tokens derive from the pod's name (tokens.go).
func (g *Gateway) e2bAnnotate(pod *corev1.Pod, stored, metadata string, trafficToken bool) {
	ann := pod.Annotations
	ann[AnnotationEnvdTokenSHA256] = tokenHash(g.envdToken(pod.Name))
	if trafficToken {
		ann[AnnotationTrafficTokenSHA256] = tokenHash(g.trafficToken(pod.Name))
	}
	ann[AnnotationE2BNetwork] = stored
	if metadata != "" {
		ann[AnnotationE2BMetadata] = metadata
	}
}

// e2bListed is a sandbox pod as E2B lists it.
func e2bListed(pod *corev1.Pod) e2bwire.ListedBody {
	sb := toSandbox(pod)
	md := map[string]string{}
	_ = json.Unmarshal([]byte(pod.Annotations[AnnotationE2BMetadata]), &md)
	return e2bwire.ListedBody{
		TemplateID: sb.Template, SandboxID: sb.ID, ClientID: e2bwire.ClientID,
		StartedAt: sb.CreatedAt.Format(time.RFC3339Nano), EndAt: sb.Deadline.Format(time.RFC3339Nano),
		// E2B counts whole vCPUs; unset limits are the node's defaults,
		// which the gateway does not know (0).
		CPUCount: int64(math.Ceil(sb.CPU)), MemoryMB: sb.MemoryBytes >> 20,
		Metadata: md, State: e2bState(sb.State), EnvdVersion: envd.Version, VolumeMounts: []e2bwire.VolumeMount{},
	}
}

// podListing lists sandbox pods.
var podListing = e2bwire.Listing[*corev1.Pod]{
	Cursor: func(pod *corev1.Pod) e2bwire.Cursor {
		return e2bwire.CursorAt(pod.CreationTimestamp.Time, sandboxID(pod))
	},
	Running: func(pod *corev1.Pod) bool { return state(pod) == apitypes.StateReady },
	Listed:  e2bListed,
}

// e2bSandboxes are the caller's live E2B sandboxes that pass the query's
// filters, in its order.
func (g *Gateway) e2bSandboxes(r *http.Request, p auth.Principal) ([]*corev1.Pod, e2bwire.ListQuery, error) {
	q, err := e2bwire.ParseListQuery(r.URL.Query())
	if err != nil {
		return nil, q, err
	}
	pods, err := g.sandboxPods()
	if err != nil {
		return nil, q, err
	}
	pods = slices.DeleteFunc(pods, func(pod *corev1.Pod) bool {
		if st := e2bState(state(pod)); !(q.Running && st == "running" || q.Paused && st == "paused") || !isE2B(pod) || !e2bLive(pod) || !p.Sees(ownerOf(pod)) ||
			!q.Keeps(pod.Annotations[node.AnnotationTemplate], pod.CreationTimestamp.Time) {
			return true
		}
		if len(q.Metadata) > 0 {
			md := map[string]string{}
			_ = json.Unmarshal([]byte(pod.Annotations[AnnotationE2BMetadata]), &md)
			for k, v := range q.Metadata {
				if got, ok := md[k]; !ok || got != v {
					return true
				}
			}
		}
		return false
	})
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		c := podListing.Cursor(a).Compare(podListing.Cursor(b))
		if !q.Asc {
			c = -c
		}
		return c
	})
	return pods, q, nil
}

func (g *Gateway) e2bListV1(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pods, _, err := g.e2bSandboxes(r, p)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	podListing.WriteAll(w, pods)
}

// e2bList answers GET /v2/sandboxes a page at a time, as the daemon does.
func (g *Gateway) e2bList(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	limit, after, ok := e2bwire.PageQuery(w, r.URL.Query())
	if !ok {
		return
	}
	pods, q, err := g.e2bSandboxes(r, p)
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	podListing.WritePage(w, pods, q.Asc, after, limit)
}

// e2bGet answers E2B's getInfo. The envdAccessToken is not in it: the
// gateway keeps only its hash (the create's answer had it).
func (g *Gateway) e2bGet(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, fresh, ok := g.e2bPodFresh(r.Context(), w, p, r.PathValue("id"))
	if !ok {
		return
	}
	pod = g.current(r.Context(), pod, fresh)
	network, internet := e2bwire.StoredNetwork(pod.Annotations[AnnotationE2BNetwork])
	e2bwire.WriteJSON(w, http.StatusOK, e2bwire.DetailBody{
		ListedBody: e2bListed(pod), Domain: g.domain(),
		AllowInternetAccess: internet, Network: network,
		Lifecycle: e2bLifecycle(pod),
	})
}

func (g *Gateway) e2bKill(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pod, ok := g.e2bPod(r.Context(), w, p, r.PathValue("id"))
	if !ok {
		return
	}
	if err := g.destroy(r.Context(), pod); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			e2bwire.WriteError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", sandboxID(pod)))
			return
		}
		e2bwire.WriteErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bSandbox authorizes a data-plane request into an E2B sandbox and
// proxies it to its node. Port 49983 (the agent, which speaks envd at its
// root) needs the sandbox's envdAccessToken in X-Access-Token, a signed
// /files URL, or the API key that owns the sandbox; the node's daemon then
// authenticates to the agent with the agent's own token. Other ports are
// preview traffic (e2bPreview).
func (g *Gateway) e2bSandbox(w http.ResponseWriter, r *http.Request, id string, port int) {
	var pod *corev1.Pod
	if apitypes.ValidSandboxID(id) == nil {
		pod, _ = g.podByID(id)
	}
	if pod == nil || !isE2B(pod) {
		e2bwire.SandboxGone(w, id)
		return
	}
	if port != envd.Port {
		g.e2bPreview(w, r, pod, port)
		return
	}
	if !g.e2bAllowed(r, pod) {
		e2bwire.WriteError(w, http.StatusUnauthorized, "unauthorized access to sandbox "+id+": send its envdAccessToken in X-Access-Token")
		return
	}
	// The node's daemon sends the agent's own token.
	g.e2bProxy(w, r, pod, "agent/"+strings.TrimPrefix(r.URL.Path, "/"), false)
}

// e2bProxy proxies an E2B data-plane request to rest under the sandbox
// on its node's data plane, without the E2B credentials and routing
// headers (they stay at the gateway); forward tells the node the client's
// address and Host.
func (g *Gateway) e2bProxy(w http.ResponseWriter, r *http.Request, pod *corev1.Pod, rest string, forward bool) {
	// The caller was let in by the sandbox's token or key: a paused
	// sandbox made with autoResume resumes for it.
	awoken, err := g.awake(context.WithoutCancel(r.Context()), pod)
	var t nodeTarget
	if err == nil {
		t, err = g.target(awoken, rest)
	}
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		e2bwire.SandboxGone(w, sandboxID(pod))
		return
	}
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	t.forward = forward
	for _, h := range []string{"X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port", e2bwire.TrafficTokenHeader} {
		r.Header.Del(h)
	}
	// Request bodies (stdin, uploads) stream while the answer does.
	_ = http.NewResponseController(w).EnableFullDuplex()
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// e2bAllowed reports whether the request may reach the sandbox's agent:
// it carries the sandbox's envdAccessToken, or no token and a /files URL
// signed with it (tokens.go) or the key that owns the sandbox (any
// caller, when the gateway has no keys). A wrong token is refused even
// so.
func (g *Gateway) e2bAllowed(r *http.Request, pod *corev1.Pod) bool {
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		return tokenMatches(pod, tok)
	}
	if g.signedFiles(r, pod) {
		return true
	}
	if g.cfg.Keys == nil {
		return true
	}
	if auth.Secret(r) == "" {
		return false
	}
	p, err := auth.Identify(r, g.cfg.Keys, true)
	return err == nil && p.Sees(ownerOf(pod))
}

// e2bPreview proxies preview traffic to port of an E2B sandbox, through
// its node's ports route: open, as on E2B, unless the sandbox was made
// with allowPublicTraffic: false, whose requests must carry its
// trafficAccessToken in e2bwire.TrafficTokenHeader. The server sees the
// Host the client used and none of Berth's credentials.
func (g *Gateway) e2bPreview(w http.ResponseWriter, r *http.Request, pod *corev1.Pod, port int) {
	id := sandboxID(pod)
	if want := pod.Annotations[AnnotationTrafficTokenSHA256]; want != "" && !hashMatches(want, r.Header.Get(e2bwire.TrafficTokenHeader)) {
		e2bwire.WriteError(w, http.StatusForbidden, "sandbox "+id+" does not allow public traffic: send its trafficAccessToken in "+e2bwire.TrafficTokenHeader)
		return
	}
	g.e2bProxy(w, r, pod, "ports/"+strconv.Itoa(port)+"/"+strings.TrimPrefix(r.URL.Path, "/"), true)
}
