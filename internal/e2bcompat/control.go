package e2bcompat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/proto/envd"
)

func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("POST /sandboxes", s.auth(s.create))
	m.HandleFunc("POST /v2/sandboxes", s.auth(s.create))
	m.HandleFunc("GET /sandboxes", s.auth(s.listV1))
	m.HandleFunc("GET /v2/sandboxes", s.auth(s.list))
	m.HandleFunc("GET /sandboxes/{id}", s.auth(s.owned(s.get)))
	m.HandleFunc("DELETE /sandboxes/{id}", s.auth(s.owned(s.kill)))
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.auth(s.owned(s.setTimeout)))
	m.HandleFunc("POST /sandboxes/{id}/refreshes", s.auth(s.owned(s.refresh)))
	m.HandleFunc("POST /sandboxes/{id}/pause", s.auth(s.owned(s.pause)))
	m.HandleFunc("POST /sandboxes/{id}/resume", s.auth(s.owned(s.resume)))
	m.HandleFunc("POST /sandboxes/{id}/connect", s.auth(s.owned(s.connect)))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.auth(s.owned(s.connect)))
	m.HandleFunc("PUT /sandboxes/{id}/network", s.auth(s.owned(s.updateNetwork)))
	m.HandleFunc("GET /sandboxes/{id}/metrics", s.auth(s.owned(s.metrics)))
	m.HandleFunc("GET /sandboxes/metrics", s.auth(s.manyMetrics))
	for pattern, v2 := range map[string]bool{"/sandboxes/{id}/logs": false, "/v2/sandboxes/{id}/logs": true} {
		if s.cfg.Records != nil {
			m.HandleFunc("GET "+pattern, s.auth(s.owned(s.logs(v2))))
		} else {
			m.HandleFunc(pattern, notImplemented("sandbox logs are not served: this daemon keeps no records of its sandboxes"))
		}
	}
	m.HandleFunc("POST /sandboxes/{id}/snapshots", s.auth(s.owned(s.createSnapshot)))
	m.HandleFunc("POST /sandboxes/{id}/fork", s.auth(s.owned(s.fork)))
	m.HandleFunc("GET /snapshots", s.auth(s.listSnapshots))
	m.HandleFunc("DELETE /templates/{templateID}", s.auth(s.deleteTemplate))
	if s.tpl != nil {
		s.templateRoutes()
	}
	if s.cfg.Volumes != nil {
		s.volumeRoutes()
	} else {
		for _, pattern := range []string{"/volumes", "/volumes/", "/volumecontent/"} {
			m.HandleFunc(pattern, notImplemented("this daemon keeps no volumes"))
		}
	}
	for pattern, missing := range unimplemented {
		m.HandleFunc(pattern, notImplemented(missing))
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of E2B's API", r.Method, r.URL.Path))
	})
}

// unimplemented are E2B's routes Berth does not serve, with what is
// missing. They answer 501, never 404: the SDKs read 404 on a sandbox
// route as "sandbox not found" (or exists: false) and would report the
// wrong thing.
var unimplemented = map[string]string{
	"/secrets":       "secrets are not managed through the E2B API",
	"/secrets/":      "secrets are not managed through the E2B API",
	"/teams":         "Berth has no teams: each API key sees its own sandboxes",
	"/teams/":        "Berth has no teams: each API key sees its own sandboxes",
	"/templates":     templatesMissing,
	"/templates/":    templatesMissing,
	"/v2/templates":  templatesMissing,
	"/v2/templates/": templatesMissing,
	"/v3/templates":  templatesMissing,
	"/v3/templates/": templatesMissing,
}

// notImplemented answers E2B's 501 naming what is missing.
func notImplemented(missing string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not implemented by Berth: %s", r.Method, r.URL.Path, missing))
	}
}

const templatesMissing = "this part of E2B's template API is not served (Berth serves the SDK's Template() builds, their status and logs, tags and Template.exists); templates are listed with `berth template ls` and removed with `berth template rm NAME`"

type keyCtx struct{}

// auth requires a valid API key (X-API-Key, or Authorization: Bearer) but
// on the daemon's local socket, and passes the caller on in the context.
func (s *Server) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := auth.Identify(r, s.cfg.Keys, true)
		if err != nil {
			writeErr(w, err)
			return
		}
		ctx := context.WithValue(auth.With(r.Context(), p), keyCtx{}, p.Key)
		next(w, r.WithContext(ctx))
	}
}

func keyOf(r *http.Request) core.APIKey {
	k, _ := r.Context().Value(keyCtx{}).(core.APIKey)
	return k
}

// callerOf is the request's authenticated caller.
func callerOf(r *http.Request) auth.Principal {
	p, _ := auth.From(r.Context())
	return p
}

type sandboxCtx struct{}

// owned resolves {id} to a live sandbox of the caller's key. Sandboxes of
// other keys, native ones and ended ones are all "not found": a key learns
// nothing about what it does not own.
func (s *Server) owned(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		notFound := func() { writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id)) }
		if !validID(id) {
			notFound()
			return
		}
		sb, err := s.cfg.Manager.Get(r.Context(), id)
		if errors.Is(err, errdefs.ErrNotFound) {
			notFound()
			return
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		if !callerOf(r).Sees(sb.Owner) || !live(sb.State) {
			notFound()
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sandboxCtx{}, sb)))
	}
}

func sandboxOf(r *http.Request) sandbox.Sandbox {
	sb, _ := r.Context().Value(sandboxCtx{}).(sandbox.Sandbox)
	return sb
}

func live(state string) bool {
	s := sandbox.State(state)
	return s == sandbox.StateReady || s == sandbox.StateCreating || s == sandbox.StatePaused ||
		s == sandbox.StatePausing || s == sandbox.StateResuming
}

// e2bState maps Berth's states onto E2B's two.
func e2bState(state string) string {
	if sandbox.State(state) == sandbox.StatePaused {
		return "paused"
	}
	return "running"
}

func (s *Server) sandboxBody(sb sandbox.Sandbox, ext core.E2BSandbox) e2bwire.SandboxBody {
	b := e2bwire.SandboxBody{
		TemplateID: sb.Template, SandboxID: sb.ID, ClientID: e2bwire.ClientID, EnvdVersion: envd.Version,
		EnvdAccessToken: sb.Token, Domain: s.cfg.Domain,
	}
	if ext.TrafficToken != "" {
		b.TrafficAccessToken = &ext.TrafficToken
	}
	return b
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var in e2bwire.CreateBody
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	if in.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	if msg := in.Unsupported(); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	// Berth always issues and requires an access token (E2B's secure: true);
	// an explicit secure: false cannot be honoured.
	if in.Secure != nil && !*in.Secure {
		writeError(w, http.StatusBadRequest, "secure: false is not supported: Berth always requires the sandbox's access token on its data plane")
		return
	}
	net := e2bwire.NetworkConfig{}
	if in.Network != nil {
		net = *in.Network
	}
	net.AllowInternetAccess = in.AllowInternetAccess
	policy, internet, err := e2bwire.ApplyNetwork(net, false, s.cfg.DefaultNetwork == "none")
	if err != nil {
		writeErr(w, err)
		return
	}
	timeout := e2bwire.DefaultTimeout
	if in.Timeout != nil {
		if *in.Timeout <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout %d: want a positive number of seconds", *in.Timeout))
			return
		}
		timeout = time.Duration(*in.Timeout) * time.Second
	}
	// A templateID naming one of the caller's snapshots starts the sandbox
	// from it (snapshots.go); any other names a template.
	template, fromSnapshot := in.TemplateID, ""
	snap, ok, err := s.visibleSnapshot(r, in.TemplateID)
	if err != nil {
		writeErr(w, err)
		return
	}
	if ok {
		template, fromSnapshot = "", snap.ID
	} else if s.tpl != nil {
		// "name:tag" names a build of E2B's template API (templates.go).
		if tgt, ok := s.tpl.resolve(template); ok {
			template = tgt
		}
	}
	sb, err := s.cfg.Manager.Create(r.Context(), sandbox.CreateRequest{
		Template: template,
		Snapshot: fromSnapshot,
		Timeout:  timeout,
		Env:      in.EnvVars,
		Owner:    keyOf(r).ID,
		Quota:    keyOf(r).Quota,
		Metadata: in.Metadata,
		User:     DefaultUser,
		Network:  &policy,
		// sudo for "user", as on E2B; inside the user namespace only.
		AllowSudo: new(!s.cfg.NoSudo),
		// lifecycle {onTimeout: "pause", autoResume: true} (pause.go)
		OnTimeout:  onTimeoutOf(in),
		AutoResume: in.AutoResume != nil && in.AutoResume.Enabled,
		Volumes:    volumeRequests(in.VolumeMounts),
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	ext := core.E2BSandbox{ID: sb.ID, Network: net.StoreJSON(internet)}
	if net.AllowPublicTraffic != nil && !*net.AllowPublicTraffic {
		ext.TrafficToken = randHex(20)
	}
	if err := s.cfg.Store.PutE2BSandbox(context.WithoutCancel(r.Context()), ext); err != nil {
		// Without its record the sandbox would be reachable in ways the
		// client did not ask for: undo it.
		if derr := s.cfg.Manager.Destroy(context.WithoutCancel(r.Context()), sb.ID, "e2b: could not store its settings"); derr != nil {
			err = errors.Join(err, derr)
		}
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb, ext))
}

func listed(sb sandbox.Sandbox) e2bwire.ListedBody {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	// E2B counts whole vCPUs; Berth's quota may be fractional.
	cpus := (sb.CPUMillis + 999) / 1000
	return e2bwire.ListedBody{
		TemplateID: sb.Template, SandboxID: sb.ID, ClientID: e2bwire.ClientID,
		StartedAt: sb.CreatedAt.UTC().Format(time.RFC3339Nano), EndAt: sb.Deadline.UTC().Format(time.RFC3339Nano),
		CPUCount: cpus, MemoryMB: sb.MemoryBytes >> 20, DiskSizeMB: sb.DiskBytes >> 20,
		Metadata: md, State: e2bState(sb.State), EnvdVersion: envd.Version, VolumeMounts: volumeMounts(sb.Volumes),
	}
}

// volumeRequests are E2B's volumeMounts as the Manager's requests: each
// names a volume of the caller's by name.
func volumeRequests(in []e2bwire.VolumeMount) []sandbox.VolumeRequest {
	var out []sandbox.VolumeRequest
	for _, v := range in {
		out = append(out, sandbox.VolumeRequest{Volume: v.Name, Path: v.Path})
	}
	return out
}

// volumeMounts are a sandbox's volumes as E2B lists them (never null).
func volumeMounts(vs []core.VolumeMount) []e2bwire.VolumeMount {
	out := make([]e2bwire.VolumeMount, 0, len(vs))
	for _, v := range vs {
		out = append(out, e2bwire.VolumeMount{Name: v.Name, Path: v.Path})
	}
	return out
}

// listFilter is what both list calls select and sort by: the Manager
// filters owner, state and metadata, the rest is e2bwire.ListQuery's.
type listFilter struct {
	owned sandbox.OwnedListOptions
	e2bwire.ListQuery
}

// listQuery parses the filters shared by both list calls.
func listQuery(r *http.Request) (listFilter, error) {
	q, err := e2bwire.ParseListQuery(r.URL.Query())
	if err != nil {
		return listFilter{}, err
	}
	f := listFilter{ListQuery: q, owned: sandbox.OwnedListOptions{Owner: keyOf(r).ID, AnyOwner: callerOf(r).Admin(), Metadata: q.Metadata}}
	if q.Running {
		f.owned.States = append(f.owned.States, string(sandbox.StateReady))
	}
	if q.Paused {
		f.owned.States = append(f.owned.States, string(sandbox.StatePaused))
	}
	return f, nil
}

func cursorOf(sb sandbox.Sandbox) e2bwire.Cursor { return e2bwire.CursorAt(sb.CreatedAt, sb.ID) }

// sandboxListing lists the Manager's sandboxes.
var sandboxListing = e2bwire.Listing[sandbox.Sandbox]{
	Cursor:  cursorOf,
	Running: func(sb sandbox.Sandbox) bool { return sandbox.State(sb.State) == sandbox.StateReady },
	Listed:  listed,
}

// listSandboxes returns the caller's sandboxes that pass f, in f's order.
func (s *Server) listSandboxes(ctx context.Context, f listFilter) ([]sandbox.Sandbox, error) {
	sbs, err := s.cfg.Manager.ListOwned(ctx, f.owned)
	if err != nil {
		return nil, err
	}
	sbs = slices.DeleteFunc(sbs, func(sb sandbox.Sandbox) bool { return !f.Keeps(sb.Template, sb.CreatedAt) })
	slices.SortFunc(sbs, func(a, b sandbox.Sandbox) int {
		c := cursorOf(a).Compare(cursorOf(b))
		if !f.Asc {
			c = -c
		}
		return c
	})
	return sbs, nil
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	f, err := listQuery(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	sbs, err := s.listSandboxes(r.Context(), f)
	if err != nil {
		writeErr(w, err)
		return
	}
	sandboxListing.WriteAll(w, sbs)
}

// list answers GET /v2/sandboxes a page at a time, newest first unless
// order=asc. The next token is an opaque cursor (the last item's start time
// and ID): the next page holds what sorts after it, so sandboxes created or
// destroyed between two pages neither repeat nor shift what is left.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	f, err := listQuery(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	q := r.URL.Query()
	limit, after, ok := e2bwire.PageQuery(w, q)
	if !ok {
		return
	}
	sbs, err := s.listSandboxes(r.Context(), f)
	if err != nil {
		writeErr(w, err)
		return
	}
	sandboxListing.WritePage(w, sbs, f.Asc, after, limit)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	ext, err := s.cfg.Store.GetE2BSandbox(r.Context(), sb.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	network, internet := e2bwire.StoredNetwork(ext.Network)
	writeJSON(w, http.StatusOK, e2bwire.DetailBody{
		ListedBody: listed(sb), EnvdAccessToken: sb.Token, Domain: s.cfg.Domain,
		AllowInternetAccess: internet, Network: network,
		Lifecycle: e2bwire.LifecycleBody{OnTimeout: lifecycleOnTimeout(sb), AutoResume: sb.AutoResume},
	})
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	if err := s.cfg.Manager.Destroy(r.Context(), sb.ID, "killed through the E2B API"); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", sb.ID))
			return
		}
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var in e2bwire.TimeoutBody
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	if in.Timeout == nil || *in.Timeout <= 0 {
		writeError(w, http.StatusBadRequest, "timeout: want a positive number of seconds")
		return
	}
	if _, err := s.cfg.Manager.SetTimeout(r.Context(), sandboxOf(r).ID, time.Duration(*in.Timeout)*time.Second); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh is E2B's keep-alive: {duration} seconds more (0 = the default).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Duration int64 `json:"duration"`
	}
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	d := e2bwire.DefaultTimeout
	if in.Duration > 0 {
		d = time.Duration(in.Duration) * time.Second
	}
	if _, err := s.cfg.Manager.SetTimeout(r.Context(), sandboxOf(r).ID, d); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect answers for a running sandbox (200, as E2B does); a timeout in the
// body moves its deadline. Paused sandboxes do not exist in Berth yet.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var in e2bwire.TimeoutBody
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	if sandbox.State(sb.State) == sandbox.StatePaused {
		s.resumeAndAnswer(w, r, sb, in.Timeout)
		return
	}
	if in.Timeout != nil && *in.Timeout > 0 {
		// E2B only ever extends a running sandbox's deadline on connect.
		if until := time.Now().Add(time.Duration(*in.Timeout) * time.Second); until.After(sb.Deadline) {
			updated, err := s.cfg.Manager.SetTimeout(r.Context(), sb.ID, time.Duration(*in.Timeout)*time.Second)
			if err != nil {
				writeErr(w, err)
				return
			}
			sb = updated
		}
	}
	ext, err := s.cfg.Store.GetE2BSandbox(r.Context(), sb.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxBody(sb, ext))
}

// updateNetwork replaces the sandbox's egress configuration, as E2B does:
// the body is evaluated like a create's network settings and what it omits
// is cleared (so {} lets the sandbox out to the internet, and a sandbox
// with internet access keeps it when an update only adds denyOut). The
// ingress settings (allowPublicTraffic) stay as created.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var in e2bwire.NetworkConfig
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	ext, err := s.cfg.Store.GetE2BSandbox(r.Context(), sb.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	policy, stored, err := in.Update(ext.Network, s.cfg.DefaultNetwork == "none")
	if err != nil {
		writeErr(w, err)
		return
	}
	if _, err := s.cfg.Manager.SetNetworkPolicy(r.Context(), sb.ID, policy); err != nil {
		writeErr(w, err)
		return
	}
	ext.Network = stored
	if err := s.cfg.Store.PutE2BSandbox(context.WithoutCancel(r.Context()), ext); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
