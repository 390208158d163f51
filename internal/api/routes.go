package api

import "net/http"

// route is one endpoint of the native API. routeTable is the one list of
// them: the mux is built from it, and a test holds openapi.json to it in
// both directions.
type route struct {
	// method is "" for every method (the agent proxy).
	method  string
	pattern string
	handler http.HandlerFunc
	// on reports whether the daemon serves the route; nil means always.
	// Routes of an unconfigured subsystem answer the catch-all not_found.
	on func(Config) bool
}

func (r route) muxPattern() string {
	if r.method == "" {
		return r.pattern
	}
	return r.method + " " + r.pattern
}

func (s *Server) routeTable() []route {
	apiKeys := func(c Config) bool { return c.APIKeys != nil }
	snapshots := func(c Config) bool { return c.Snapshots != nil }
	workspaces := func(c Config) bool { return c.Workspaces != nil }
	registries := func(c Config) bool { return c.Registries != nil }
	dockerfiles := func(c Config) bool { return c.Dockerfiles != nil }
	volumes := func(c Config) bool { return c.Volumes != nil }
	return []route{
		{"GET", "/v1/health", s.health, nil},
		{"GET", "/v1/openapi.json", s.openapi, nil},
		{"POST", "/v1/sandboxes", s.createSandbox, nil},
		{"GET", "/v1/sandboxes", s.listSandboxes, nil},
		{"GET", "/v1/sandboxes/{id}", s.getSandbox, nil},
		{"DELETE", "/v1/sandboxes/{id}", s.deleteSandbox, nil},
		{"DELETE", "/v1/sandboxes/{id}/record", s.removeRecord, func(c Config) bool { return c.Records != nil }},
		{"POST", "/v1/sandboxes/{id}/timeout", s.setTimeout, nil},
		{"POST", "/v1/sandboxes/{id}/pause", s.pauseSandbox, nil},
		{"POST", "/v1/sandboxes/{id}/resume", s.resumeSandbox, nil},
		{"GET", "/v1/sandboxes/{id}/events", s.events, nil},
		{"GET", "/v1/sandboxes/{id}/network", s.getNetwork, nil},
		{"PUT", "/v1/sandboxes/{id}/network", s.putNetwork, nil},
		{"GET", "/v1/sandboxes/{id}/network/log", s.networkLog, nil},
		{"GET", "/v1/sandboxes/{id}/network/suggest", s.suggestNetwork, nil},
		{"", "/v1/sandboxes/{id}/agent/{rest...}", s.proxyAgent, nil},
		{"", "/v1/sandboxes/{id}/ports/{port}/{rest...}", s.proxyPort, nil},
		{"GET", "/v1/sandboxes/{id}/tunnel/{port}", s.tunnelPort, func(c Config) bool { return c.Dial != nil }},
		{"GET", "/v1/templates", s.listTemplates, nil},
		{"POST", "/v1/templates", s.createTemplate, nil},
		{"GET", "/metrics", s.metrics, func(c Config) bool { return c.Metrics != nil }},
		{"GET", "/v1/usage", s.getUsage, func(c Config) bool { return c.Usage != nil }},
		{"GET", "/v1/sandboxes/{id}/metrics", s.sandboxMetrics, func(c Config) bool { return c.History != nil }},
		{"POST", "/v1/templates/{name}/build", s.buildTemplate, nil},
		{"PUT", "/v1/templates/{name}/isolation", s.setTemplateIsolation, nil},
		{"PUT", "/v1/templates/{name}/warm", s.setWarm, func(c Config) bool { return c.Warm != nil }},
		{"DELETE", "/v1/templates/{name}", s.deleteTemplate, nil},
		{"POST", "/v1/templates/prune", s.pruneTemplates, nil},
		{"POST", "/v1/templates/{name}/dockerfile", s.buildDockerfile, dockerfiles},
		{"GET", "/v1/templates/{name}/export", s.exportTemplate, nil},
		{"POST", "/v1/templates/import", s.importTemplate, nil},
		{"GET", "/v1/registries", s.listRegistries, registries},
		{"PUT", "/v1/registries/{host}", s.loginRegistry, registries},
		{"DELETE", "/v1/registries/{host}", s.logoutRegistry, registries},
		{"POST", "/v1/apikeys", s.createAPIKey, apiKeys},
		{"GET", "/v1/apikeys", s.listAPIKeys, apiKeys},
		{"DELETE", "/v1/apikeys/{id}", s.revokeAPIKey, apiKeys},
		{"PATCH", "/v1/apikeys/{id}", s.updateAPIKey, apiKeys},
		{"POST", "/v1/workspaces", s.createWorkspace, workspaces},
		{"POST", "/v1/environments/check", s.checkEnvironment, workspaces},
		{"GET", "/v1/environments", s.listEnvironments, workspaces},
		{"POST", "/v1/environments/prune", s.pruneEnvironments, workspaces},
		{"GET", "/v1/secrets", s.listSecrets, workspaces},
		{"PUT", "/v1/secrets/{name}", s.putSecret, workspaces},
		{"DELETE", "/v1/secrets/{name}", s.deleteSecret, workspaces},
		{"GET", "/v1/sandboxes/{id}/worklog", s.getWorklog, nil},
		{"GET", "/v1/sandboxes/{id}/diff", s.getDiff, nil},
		{"GET", "/v1/sandboxes/{id}/export", s.getExport, nil},
		{"POST", "/v1/sandboxes/{id}/commit", s.postCommit, nil},
		{"POST", "/v1/sandboxes/{id}/snapshots", s.createSnapshot, snapshots},
		{"POST", "/v1/sandboxes/{id}/fork", s.forkSandbox, snapshots},
		{"GET", "/v1/snapshots", s.listSnapshots, snapshots},
		{"GET", "/v1/snapshots/{id}", s.getSnapshot, snapshots},
		{"DELETE", "/v1/snapshots/{id}", s.deleteSnapshot, snapshots},
		{"GET", "/v1/snapshots/{id}/export", s.exportSnapshot, snapshots},
		{"POST", "/v1/snapshots/import", s.importSnapshot, snapshots},
		{"POST", "/v1/volumes", s.createVolume, volumes},
		{"GET", "/v1/volumes", s.listVolumes, volumes},
		{"GET", "/v1/volumes/{id}", s.getVolume, volumes},
		{"DELETE", "/v1/volumes/{id}", s.deleteVolume, volumes},
		{"GET", "/v1/volumes/{id}/list", s.volumeFiles(s.listVolume), volumes},
		{"GET", "/v1/volumes/{id}/files", s.volumeFiles(s.readVolumeFile), volumes},
		{"PUT", "/v1/volumes/{id}/files", s.volumeFiles(s.writeVolumeFile), volumes},
		{"DELETE", "/v1/volumes/{id}/files", s.volumeFiles(s.removeVolumePath), volumes},
		{"POST", "/v1/volumes/{id}/dirs", s.volumeFiles(s.makeVolumeDir), volumes},
	}
}

// routeAccess is who may call a route other than any authenticated caller
// (auth.go), by mux pattern.
var routeAccess = map[string]access{
	"GET /v1/health":                  public,
	"POST /v1/templates/{name}/build": adminOnly,
	"POST /v1/apikeys":                adminOnly,
	"GET /v1/apikeys":                 adminOnly,
	"DELETE /v1/apikeys/{id}":         adminOnly,
	"PATCH /v1/apikeys/{id}":          adminOnly,
	"POST /v1/environments/prune":     adminOnly,
	"GET /v1/secrets":                 adminOnly,
	"PUT /v1/secrets/{name}":          adminOnly,
	"DELETE /v1/secrets/{name}":       adminOnly,
	"GET /metrics":                    adminOnly,
	// Templates are the host's: making, removing, pruning and choosing
	// their isolation level change what every key's sandboxes run.
	"POST /v1/templates":                   adminOnly,
	"DELETE /v1/templates/{name}":          adminOnly,
	"POST /v1/templates/prune":             adminOnly,
	"PUT /v1/templates/{name}/isolation":   adminOnly,
	"POST /v1/templates/{name}/dockerfile": adminOnly,
	// An export holds every file of the template, which may come from a
	// private registry.
	"GET /v1/templates/{name}/export": adminOnly,
	"POST /v1/templates/import":       adminOnly,
	// Registry credentials are the host's, and secret.
	"GET /v1/registries":            adminOnly,
	"PUT /v1/registries/{host}":     adminOnly,
	"DELETE /v1/registries/{host}":  adminOnly,
	"PUT /v1/templates/{name}/warm": adminOnly,
}

func (s *Server) routes() {
	for _, r := range s.routeTable() {
		if r.on == nil || r.on(s.cfg) {
			s.mux.HandleFunc(r.muxPattern(), s.authenticate(r))
		}
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, notFoundRoute(r))
	})
}
