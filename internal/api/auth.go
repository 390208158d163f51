package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
)

// access is who may call a route.
type access int

// The zero access is any authenticated caller; handlers scope what it
// sees.
const (
	// public: no key needed (health).
	public access = iota + 1
	// adminOnly: the operator or an admin key (key management, builds,
	// secrets, metrics).
	adminOnly
)

// principal returns the request's caller. Routes run behind authenticate,
// so a request without one is the operator of an unauthenticated
// (in-process) server.
func principal(r *http.Request) auth.Principal {
	if p, ok := auth.From(r.Context()); ok {
		return p
	}
	return auth.Principal{Operator: true}
}

// authenticate identifies the caller (401 for a missing or bad key where
// one is needed), enforces the route's access, and for routes naming a
// sandbox answers 404 for a sandbox the caller does not own, exactly as
// for one that does not exist.
func (s *Server) authenticate(rt route) http.HandlerFunc {
	next := rt.handler
	acc := routeAccess[rt.muxPattern()]
	if acc == public {
		return next
	}
	ownsID := strings.HasPrefix(rt.pattern, "/v1/sandboxes/{id}")
	return func(w http.ResponseWriter, r *http.Request) {
		var p auth.Principal
		if s.cfg.APIKeys == nil {
			p = auth.Principal{Operator: true}
		} else {
			var err error
			if p, err = auth.Identify(r, s.cfg.APIKeys, s.cfg.RequireAuth); err != nil {
				writeError(w, err)
				return
			}
		}
		if acc == adminOnly && !p.Admin() {
			writeError(w, fmt.Errorf("%s %s needs an admin key (`berth apikey create --admin`): %w", r.Method, r.URL.Path, errdefs.ErrPermissionDenied))
			return
		}
		if ownsID && !p.Admin() {
			id := r.PathValue("id")
			if err := validID(id); err != nil {
				writeError(w, err)
				return
			}
			sb, err := s.cfg.Manager.Get(r.Context(), id)
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				writeError(w, err)
				return
			}
			if err != nil || !p.Sees(sb.Owner) {
				writeError(w, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound))
				return
			}
		}
		next(w, r.WithContext(auth.With(r.Context(), p)))
	}
}
