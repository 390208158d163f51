package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
)

// Registry logins on the gateway: the credentials each node's daemon
// pulls image templates with, set on every Ready node at once (admin keys
// only, as on a daemon), so a template made from a private image through
// the gateway pulls on every node. They travel to the nodes over the
// nodes' mutual TLS and are kept by each daemon as it keeps its own.

// listRegistries is GET /v1/registries: the registries any Ready node has
// a login for, once each (as the first node by name has it).
func (g *Gateway) listRegistries(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	got, err := everyNode[apitypes.RegistryList](g, r.Context(), p, "the registry logins", http.MethodGet, "/v1/registries", nil)
	if err != nil {
		writeError(w, err)
		return
	}
	out := apitypes.RegistryList{Registries: []apitypes.RegistryLogin{}}
	for _, l := range got {
		for _, reg := range l.Registries {
			if !slices.ContainsFunc(out.Registries, func(o apitypes.RegistryLogin) bool { return o.Registry == reg.Registry }) {
				out.Registries = append(out.Registries, reg)
			}
		}
	}
	slices.SortFunc(out.Registries, func(a, b apitypes.RegistryLogin) int { return cmp.Compare(a.Registry, b.Registry) })
	writeJSON(w, http.StatusOK, out)
}

// loginRegistry is PUT /v1/registries/{host}: the login set on every Ready
// node, each checking it with the registry as a daemon does; a node that
// refuses is named with those it was set on.
func (g *Gateway) loginRegistry(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := adminOnly(p, "a registry login"); err != nil {
		writeError(w, err)
		return
	}
	host := r.PathValue("host")
	var in apitypes.RegistryLoginRequest
	if err := decodeBody(r, &in, false, `{"username","password"}`); err != nil {
		writeError(w, err)
		return
	}
	if in.Username == "" || in.Password == "" {
		field := "username"
		if in.Username != "" {
			field = "password"
		}
		writeError(w, fieldErr(field, errdefs.ErrInvalidArgument, "%s is required", field))
		return
	}
	got, err := everyNode[apitypes.RegistryLogin](g, r.Context(), p, fmt.Sprintf("registry login %q", host), http.MethodPut, "/v1/registries/"+url.PathEscape(host), in)
	if err != nil {
		writeError(w, err)
		return
	}
	g.log.Info("registry_login_set", "registry", got[0].Registry, "nodes", len(got))
	writeJSON(w, http.StatusOK, got[0])
}

// logoutRegistry is DELETE /v1/registries/{host}: the login removed from
// every Ready node that has it; not_found when none has.
func (g *Gateway) logoutRegistry(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := adminOnly(p, "a registry logout"); err != nil {
		writeError(w, err)
		return
	}
	host := r.PathValue("host")
	nodes, err := g.readyNodes()
	if err != nil {
		writeError(w, err)
		return
	}
	res := g.eachNode(nodes, func(_ int, t nodeTarget) (*http.Response, error) {
		return nil, g.nodeCall(r.Context(), t, http.MethodDelete, "/v1/registries/"+url.PathEscape(host), nil, nil)
	})
	if err := removedFromNodes(fmt.Sprintf("registry login %q", host), "host", res); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// removedFromNodes is the outcome of a removal of what ("template \"py\"")
// from every node: nil when some node removed it and none failed (not
// having it is no failure), not_found on name when no node had it, else
// nodesFailed.
func removedFromNodes(what, field string, res []*nodeOutcome) error {
	removed := 0
	for _, d := range res {
		switch {
		case d.err == nil:
			removed++
		case errors.Is(d.err, errdefs.ErrNotFound):
			d.err = nil // nothing to remove there
		}
	}
	if slices.ContainsFunc(res, func(d *nodeOutcome) bool { return d.err != nil }) {
		return nodesFailed(what, res)
	}
	if removed == 0 {
		return &errdefs.Error{Code: errdefs.CodeNotFound, Field: field, Message: what + ": no Ready Berth node has it"}
	}
	return nil
}
