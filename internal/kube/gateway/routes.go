package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// routes are the native API's routes the gateway serves. Every other
// route answers not_implemented (501), never not_found: a client must not
// read "the gateway does not do this yet" as "no such sandbox".
func (g *Gateway) routes() {
	g.mux.HandleFunc("GET /v1/health", g.health)
	g.mux.HandleFunc("POST /v1/sandboxes", g.authed(g.createSandbox))
	g.mux.HandleFunc("GET /v1/sandboxes", g.authed(g.listSandboxes))
	g.mux.HandleFunc("GET /v1/sandboxes/{id}", g.authed(g.getSandbox))
	g.mux.HandleFunc("DELETE /v1/sandboxes/{id}", g.authed(g.deleteSandbox))
	g.mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", g.authed(g.timeoutSandbox))
	g.mux.HandleFunc("PUT /v1/sandboxes/{id}/network", g.authed(g.putNetwork))
	g.mux.HandleFunc("POST /v1/sandboxes/{id}/pause", g.authed(g.pauseSandbox))
	g.mux.HandleFunc("POST /v1/sandboxes/{id}/resume", g.authed(g.resumeSandbox))
	g.mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", g.authed(g.createSnapshot))
	g.mux.HandleFunc("POST /v1/sandboxes/{id}/fork", g.authed(g.forkSandbox))
	g.mux.HandleFunc("GET /v1/snapshots", g.authed(g.listSnapshots))
	g.mux.HandleFunc("GET /v1/snapshots/{id}", g.authed(g.getSnapshot))
	g.mux.HandleFunc("DELETE /v1/snapshots/{id}", g.authed(g.deleteSnapshot))
	g.mux.HandleFunc("GET /v1/snapshots/{id}/export", g.authed(g.exportSnapshot))
	g.mux.HandleFunc("POST /v1/snapshots/import", g.authed(g.importSnapshot))
	g.mux.HandleFunc("GET /v1/templates", g.authed(g.listTemplates))
	g.mux.HandleFunc("GET /v1/templates/{name}", g.authed(g.getTemplate))
	g.mux.HandleFunc("POST /v1/templates", g.authed(g.createTemplate))
	g.mux.HandleFunc("POST /v1/templates/{name}/build", g.authed(g.buildTemplate))
	g.mux.HandleFunc("POST /v1/templates/{name}/dockerfile", g.authed(g.buildDockerfile))
	g.mux.HandleFunc("DELETE /v1/templates/{name}", g.authed(g.deleteTemplate))
	g.mux.HandleFunc("PUT /v1/templates/{name}/isolation", g.authed(g.setTemplateIsolation))
	g.mux.HandleFunc("PUT /v1/templates/{name}/warm", g.authed(g.setWarm))
	g.mux.HandleFunc("POST /v1/templates/prune", g.authed(g.pruneTemplates))
	g.mux.HandleFunc("GET /v1/templates/{name}/export", g.authed(g.exportTemplate))
	g.mux.HandleFunc("POST /v1/templates/import", g.authed(g.importTemplate))
	g.mux.HandleFunc("GET /v1/registries", g.authed(g.listRegistries))
	g.mux.HandleFunc("PUT /v1/registries/{host}", g.authed(g.loginRegistry))
	g.mux.HandleFunc("DELETE /v1/registries/{host}", g.authed(g.logoutRegistry))
	g.mux.HandleFunc("/v1/sandboxes/{id}/agent/{rest...}", g.authed(g.proxyAgent))
	g.mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{rest...}", g.authed(g.proxyPort))
	g.mux.HandleFunc("GET /v1/sandboxes/{id}/tunnel/{port}", g.authed(g.proxyTunnel))
	for _, rt := range node.ReviewRoutes {
		g.mux.HandleFunc("GET /v1/sandboxes/{id}/"+rt, g.authed(g.proxyReview(rt)))
	}
	g.e2bRoutes()
	g.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, notServed(r))
	})
}

// notServed is the answer to a route the gateway does not serve (yet).
func notServed(r *http.Request) error {
	return fmt.Errorf("%s %s is not served by the Kubernetes gateway (berth serve --kubernetes): it serves the native API's sandbox create, list, get, delete, timeout, network policy, pause and resume, snapshots (export and import included) and fork, templates (listed, made from an image or a Dockerfile or imported, built, set, removed and pruned on every Ready node, exported from one, and copied by the gateway to nodes that lack them) and registry logins (on every Ready node), the review reads (usage over time included) and the agent and ports data plane, and E2B's sandbox create, list, get, kill, timeout, network, pause, metrics and connect and envd data plane: %w",
		r.Method, r.URL.Path, errdefs.ErrNotImplemented)
}

func (g *Gateway) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, types.Health{Status: "ok", Version: g.cfg.Version})
}

// authed identifies the caller (a key is required when the gateway has
// keys) and hands it to h.
func (g *Gateway) authed(h func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return g.authedAs(writeError, h)
}

// authedAs is authed answering a caller it refuses with fail (the native
// API's error shape, or E2B's).
func (g *Gateway) authedAs(fail func(http.ResponseWriter, error), h func(http.ResponseWriter, *http.Request, auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := auth.Principal{Operator: true}
		if g.cfg.Keys != nil {
			var err error
			if p, err = auth.Identify(r, g.cfg.Keys, true); err != nil {
				fail(w, err)
				return
			}
		}
		h(w, r.WithContext(auth.With(r.Context(), p)), p)
	}
}

// sandboxPod is the pod of the sandbox id as the caller may see it: a
// sandbox of another key's is not found, exactly as one that does not
// exist.
func (g *Gateway) sandboxPod(ctx context.Context, p auth.Principal, id string) (*corev1.Pod, error) {
	pod, _, err := g.sandboxPodFresh(ctx, p, id)
	return pod, err
}

// sandboxPodFresh is sandboxPod, and says whether the pod was read from
// the API server just now (requestPod).
func (g *Gateway) sandboxPodFresh(ctx context.Context, p auth.Principal, id string) (*corev1.Pod, bool, error) {
	if err := types.ValidSandboxID(id); err != nil {
		return nil, false, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "id", Message: err.Error()}
	}
	pod, fresh, err := g.requestPod(ctx, id)
	if apierrors.IsNotFound(err) || err == nil && !p.Sees(ownerOf(pod)) {
		return nil, false, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, false, err
	}
	return pod, fresh, nil
}

// writeError maps an error to its status and the API's JSON body
// (internal/api's writeError, for the gateway).
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, errdefs.HTTPStatus(err), errdefs.Body(err))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nobody to tell
}

// decodeBody reads a request's JSON body into v, refusing unknown fields
// and trailing values; optional lets an empty body keep v as it is. want
// shows a good body in the error.
func decodeBody(r *http.Request, v any, optional bool, want string) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if optional && errors.Is(err, io.EOF) {
			return nil
		}
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field != "" {
			field := errdefs.JSONField(ute.Field)
			return fieldErr(field, errdefs.ErrInvalidArgument, "%s: want %s, got JSON %s", field, ute.Type, ute.Value)
		}
		return fieldErr("body", errdefs.ErrInvalidArgument, "want %s: %v", want, err)
	}
	if dec.More() {
		return fieldErr("body", errdefs.ErrInvalidArgument, "body holds more than one JSON value")
	}
	return nil
}

// fieldErr is a bad request field, as the API names one.
func fieldErr(field string, class error, format string, args ...any) error {
	return &errdefs.Error{Code: errdefs.Code(class), Field: field, Message: fmt.Sprintf(format, args...)}
}
