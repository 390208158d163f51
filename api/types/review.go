package types

import "time"

// WorklogStream summarises one output stream of a recorded command: its
// size and its first and last KiB (base64 in JSON: output need not be
// text).
type WorklogStream struct {
	Bytes int64  `json:"bytes"`
	Head  []byte `json:"head,omitempty"`
	Tail  []byte `json:"tail,omitempty"`
}

// WorklogEntry is one action recorded in a sandbox's work log: a command
// (Kind "exec", or "attach" for a connection to a running one) or a file
// operation ("write", "mkdir", "move", "remove").
type WorklogEntry struct {
	ID      string    `json:"id"`
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Kind    string    `json:"kind"`
	// API is the surface the request came through: native, e2b or berth
	// (the daemon's own review operations).
	API string `json:"api,omitempty"`
	// User is the user the request named ("" means the sandbox's default).
	User string `json:"user,omitempty"`

	// Commands.
	Cmd  string   `json:"cmd,omitempty"`
	Args []string `json:"args,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// EnvNames lists the names of the variables set; values may be
	// secrets and are never recorded.
	EnvNames []string  `json:"env_names,omitempty"`
	Tag      string    `json:"tag,omitempty"`
	PTY      bool      `json:"pty,omitempty"`
	PID      uint32    `json:"pid,omitempty"`
	End      time.Time `json:"end,omitzero"`
	// Done is set once the command's end was seen; false means its client
	// went away earlier (it may still run).
	Done     bool          `json:"done,omitempty"`
	ExitCode int32         `json:"exit_code"`
	Exited   bool          `json:"exited,omitempty"`
	Status   string        `json:"status,omitempty"`
	Error    string        `json:"error,omitempty"`
	Stdout   WorklogStream `json:"stdout,omitzero"`
	Stderr   WorklogStream `json:"stderr,omitzero"`
	PTYOut   WorklogStream `json:"pty_out,omitzero"`

	// Files.
	Path string `json:"path,omitempty"`
	// Paths are the files one upload wrote, as the agent reported them.
	Paths []string `json:"paths,omitempty"`
	Dest  string   `json:"dest,omitempty"`
	// Size is the request body's size in bytes.
	Size int64 `json:"size,omitempty"`
	// HTTPStatus is the agent's answer to a file operation.
	HTTPStatus int `json:"http_status,omitempty"`
}

// WorklogEntryList is the answer to GET /v1/sandboxes/{id}/worklog.
type WorklogEntryList struct {
	Entries []WorklogEntry `json:"entries"`
}

// Export formats (GET /v1/sandboxes/{id}/export?format=).
const (
	ExportPatch  = "patch"
	ExportBundle = "bundle"
)

// CommitRequest commits everything in a sandbox's checkout.
type CommitRequest struct {
	// Path is the checkout (default /workspace).
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	// Branch, when set, is created from HEAD and receives the commit.
	Branch string `json:"branch,omitempty"`
	// Author is "Name <email>"; empty takes the daemon's commit_author.
	Author string `json:"author,omitempty"`
}

// CommitResult is the commit made.
type CommitResult struct {
	Commit string `json:"commit"`
	Branch string `json:"branch,omitempty"`
	Author string `json:"author"`
}
