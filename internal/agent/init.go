package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// identity is the part of the agent's configuration its host may replace
// after start through POST /init: the access token, the sandbox-wide
// environment and the default user. A warm-pool sandbox starts with a
// token only the daemon knows and no request's environment; the daemon
// hands it its owner's when a create claims it, so nothing from the pool's
// life (its token) still opens it.
type identity struct {
	mu    sync.RWMutex
	token string
	env   []string
	user  string
}

func (s *Server) token() string {
	s.id.mu.RLock()
	defer s.id.mu.RUnlock()
	return s.id.token
}

func (s *Server) environ() []string {
	s.id.mu.RLock()
	defer s.id.mu.RUnlock()
	return s.id.env
}

func (s *Server) defaultUser() string {
	s.id.mu.RLock()
	defer s.id.mu.RUnlock()
	return s.id.user
}

// InitRequest is the body of POST /init (envd's fields): envVars are set
// in (or replace entries of) the sandbox-wide environment, accessToken
// replaces the token when set, defaultUser the default user. Berth's own
// berthNproc, when set, lowers the agent's RLIMIT_NPROC, which every
// process it starts inherits (a host without CAP_SYS_RESOURCE cannot set
// it from outside; the pids cgroup, set by the host, is the real bound).
type InitRequest struct {
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken string            `json:"accessToken,omitempty"`
	DefaultUser string            `json:"defaultUser,omitempty"`
	Nproc       uint64            `json:"berthNproc,omitempty"`
}

// maxInitBody bounds an /init body (environments are small).
const maxInitBody = 1 << 20

func (s *Server) postInit(w http.ResponseWriter, r *http.Request) {
	var req InitRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxInitBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("init: invalid body: %w", err))
		return
	}
	for k := range req.EnvVars {
		if k == "" || !validEnvName(k) {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("init: invalid variable name %q", k))
			return
		}
	}
	if req.DefaultUser != "" {
		if _, err := lookupUser(s.cfg.PasswdPath, s.cfg.GroupPath, req.DefaultUser); err != nil {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("init: default user: %w", err))
			return
		}
	}
	if req.Nproc > 0 {
		var cur unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NPROC, &cur); err != nil {
			jsonError(w, http.StatusInternalServerError, fmt.Errorf("init: RLIMIT_NPROC: %w", err))
			return
		}
		if req.Nproc < cur.Max {
			if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: req.Nproc, Max: req.Nproc}); err != nil {
				jsonError(w, http.StatusInternalServerError, fmt.Errorf("init: RLIMIT_NPROC: %w", err))
				return
			}
		}
	}
	s.id.mu.Lock()
	env := slices.Clone(s.id.env)
	for _, k := range sortedKeys(req.EnvVars) {
		kv := k + "=" + req.EnvVars[k]
		if i := slices.IndexFunc(env, func(e string) bool { ek, _, _ := cutEnv(e); return ek == k }); i >= 0 {
			env[i] = kv
		} else {
			env = append(env, kv)
		}
	}
	s.id.env = env
	if req.AccessToken != "" {
		s.id.token = req.AccessToken
	}
	if req.DefaultUser != "" {
		s.id.user = req.DefaultUser
	}
	s.id.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// validEnvName accepts shell variable names.
func validEnvName(k string) bool {
	for i, c := range k {
		ok := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
