package types

// WorkspaceRequest asks for a sandbox holding a repository at a ref, set up
// by an environment file (POST /v1/workspaces). Its network policies come
// from the environment file, so CreateRequest.Network must be nil.
type WorkspaceRequest struct {
	CreateRequest
	Repo string `json:"repo"`
	Ref  string `json:"ref,omitempty"`
	// Environment is an environment file's YAML; nil means the repository's
	// own .berth/environment.yaml.
	Environment *string `json:"environment,omitempty"`
	// NoCache neither uses nor fills the environment cache.
	NoCache bool `json:"no_cache,omitempty"`
}

// WorkspaceProgress is a setup event (setup_started, setup_step,
// setup_done, setup_cached) or step output (Type "log").
type WorkspaceProgress struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Step    int    `json:"step,omitempty"`
}

// WorkspaceLine is one line of a workspace create stream: progress, then
// the ready sandbox, or an error (with the failed sandbox when one was
// made).
type WorkspaceLine struct {
	Progress *WorkspaceProgress `json:"progress,omitempty"`
	Sandbox  *Sandbox           `json:"sandbox,omitempty"`
	Error    *Error             `json:"error,omitempty"`
}

// EnvironmentCheckRequest is an environment file to validate.
type EnvironmentCheckRequest struct {
	Environment string `json:"environment"`
}

// EnvironmentCheck is what the daemon found in a valid environment file.
type EnvironmentCheck struct {
	Valid          bool     `json:"valid"`
	Template       string   `json:"template"`
	Isolation      string   `json:"isolation,omitempty"`
	Steps          []string `json:"steps"`
	Secrets        []string `json:"secrets"`
	MissingSecrets []string `json:"missing_secrets"`
	SetupNetwork   string   `json:"setup_network"`
	AgentNetwork   string   `json:"agent_network"`
}

// EnvironmentProblem is one problem of an invalid environment file.
type EnvironmentProblem struct {
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// EnvironmentError is the answer to checking an invalid environment file:
// an invalid_argument error body with every problem found.
type EnvironmentError struct {
	Code     string               `json:"code"`
	Message  string               `json:"message"`
	Field    string               `json:"field"`
	Problems []EnvironmentProblem `json:"problems"`
}

// CachedEnvironment is a cached workspace environment. Its times are
// RFC 3339 strings.
type CachedEnvironment struct {
	Key       string `json:"key"`
	Template  string `json:"template"`
	Repo      string `json:"repo"`
	Commit    string `json:"commit"`
	Created   string `json:"created"`
	LastUsed  string `json:"last_used"`
	SizeBytes int64  `json:"size_bytes"`
}

// EnvironmentList is the answer to GET /v1/environments.
type EnvironmentList struct {
	Environments []CachedEnvironment `json:"environments"`
}

// PruneRequest removes cached environments no sandbox uses: all, or only
// Key when it is set.
type PruneRequest struct {
	Key string `json:"key"`
}

// PruneResult lists the keys removed.
type PruneResult struct {
	Removed []string `json:"removed"`
}

// SecretInfo names a stored secret; values are never returned. UpdatedAt
// is an RFC 3339 string (empty in the answer to a put).
type SecretInfo struct {
	Name      string `json:"name"`
	UpdatedAt string `json:"updated_at"`
	SizeBytes int64  `json:"size_bytes"`
}

// SecretList is the answer to GET /v1/secrets.
type SecretList struct {
	Secrets []SecretInfo `json:"secrets"`
}
