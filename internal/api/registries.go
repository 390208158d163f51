package api

import (
	"context"
	"net/http"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/imagepull"
)

// Registries keeps the daemon's registry credentials (imagepull.Puller).
type Registries interface {
	Login(ctx context.Context, host, user, password string) error
	Logout(host string) error
	Logins() ([]imagepull.Login, error)
}

// loginRegistry checks and stores credentials for a registry
// (PUT /v1/registries/{host}).
func (s *Server) loginRegistry(w http.ResponseWriter, r *http.Request) {
	host := r.PathValue("host")
	var in types.RegistryLoginRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	if err := s.cfg.Registries.Login(r.Context(), host, in.Username, in.Password); err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("registry_login", "registry", host, "username", in.Username)
	writeJSON(w, http.StatusOK, types.RegistryLogin{Registry: host, Username: in.Username})
}

// logoutRegistry forgets a registry's credentials
// (DELETE /v1/registries/{host}).
func (s *Server) logoutRegistry(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Registries.Logout(r.PathValue("host")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listRegistries lists the registries the daemon has credentials for,
// without the secrets (GET /v1/registries).
func (s *Server) listRegistries(w http.ResponseWriter, _ *http.Request) {
	ls, err := s.cfg.Registries.Logins()
	if err != nil {
		writeError(w, err)
		return
	}
	out := types.RegistryList{Registries: make([]types.RegistryLogin, 0, len(ls))}
	for _, l := range ls {
		out.Registries = append(out.Registries, types.RegistryLogin{Registry: l.Registry, Username: l.Username})
	}
	writeJSON(w, http.StatusOK, out)
}
