// Package worklog keeps the host-side record of what was done in a sandbox
// through the API: every command started (argv, cwd, user, environment
// variable names, pid, start and end, exit status, output sizes and the
// first and last KiB of each stream) and every file written. The daemon
// builds the record by observing the traffic its proxies carry to the
// sandbox's agent, so nothing inside the sandbox can shape or erase it. One
// JSONL file per sandbox under the data dir, rotated by size; it outlives
// the sandbox.
package worklog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/proto/envd"
)

// Entry kinds.
const (
	KindExec   = "exec"   // process.Process/Start
	KindAttach = "attach" // process.Process/Connect to a running process
	KindWrite  = "write"  // POST /files
	KindMkdir  = "mkdir"  // filesystem.Filesystem/MakeDir
	KindMove   = "move"   // filesystem.Filesystem/Move
	KindRemove = "remove" // filesystem.Filesystem/Remove
)

// Stream summarises one output stream of a command: its size and first
// and last KiB (they overlap when the stream is shorter than 2 KiB). It is
// the wire type itself, so an Entry converts to types.WorklogEntry as it
// is.
type Stream = types.WorklogStream

// Entry is one recorded action.
type Entry struct {
	// ID identifies the action; a command is written twice (when it
	// starts and when it ends) under one ID, and Read keeps the last.
	ID      string    `json:"id"`
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Kind    string    `json:"kind"`
	// API is the surface the request came through: native, e2b or berth
	// (the daemon's own review operations).
	API string `json:"api,omitempty"`
	// User is the user named by the request ("" means the sandbox's
	// default user).
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
	// Done is set once the end event was seen; a command whose client
	// went away earlier has Done false (it may still run).
	Done     bool   `json:"done,omitempty"`
	ExitCode int32  `json:"exit_code"`
	Exited   bool   `json:"exited,omitempty"`
	Status   string `json:"status,omitempty"`
	Error    string `json:"error,omitempty"`
	Stdout   Stream `json:"stdout,omitzero"`
	Stderr   Stream `json:"stderr,omitzero"`
	PTYOut   Stream `json:"pty_out,omitzero"`

	// Files.
	Path string `json:"path,omitempty"`
	// Paths are the files one upload wrote, as the agent reported them.
	Paths []string `json:"paths,omitempty"`
	Dest  string   `json:"dest,omitempty"`
	// Size is the request body's size in bytes (for a multipart upload
	// of several files, their total with the form's framing).
	Size int64 `json:"size,omitempty"`
	// HTTPStatus is the agent's answer (200 when the write happened).
	HTTPStatus int `json:"http_status,omitempty"`
}

// Config configures a Log.
type Config struct {
	// Dir holds <sandbox>.jsonl and its rotations <sandbox>.jsonl.1 ….
	Dir string
	// MaxBytes rotates a file once it grows past this (default 16 MiB).
	MaxBytes int64
	// Keep is how many rotated files to keep (default 3).
	Keep int
	// AgentPort is the agent's port; only traffic to it is recorded
	// (default 49983).
	AgentPort int
	Logger    *slog.Logger
}

// Log appends and reads work log entries.
type Log struct {
	cfg Config
	log *slog.Logger

	files *audit.Files
}

// New opens the work log in cfg.Dir (created 0700).
func New(cfg Config) (*Log, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 16 << 20
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 3
	}
	if cfg.AgentPort == 0 {
		cfg.AgentPort = envd.Port
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	files, err := audit.NewFiles(cfg.Dir, cfg.MaxBytes, cfg.Keep)
	if err != nil {
		return nil, fmt.Errorf("worklog: %w", err)
	}
	return &Log{cfg: cfg, log: cfg.Logger, files: files}, nil
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Append writes e to its sandbox's file. It never fails the caller's
// request: errors are logged.
func (l *Log) Append(e Entry) {
	if types.ValidSandboxID(e.Sandbox) != nil {
		return
	}
	if e.ID == "" {
		e.ID = newID()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	if !e.End.IsZero() {
		e.End = e.End.UTC()
	}
	line, err := json.Marshal(e)
	if err != nil {
		return
	}
	line = append(line, '\n')
	if err := l.files.Append(e.Sandbox, line); err != nil {
		l.log.Error("worklog_append_failed", "sandbox_id", e.Sandbox, "err", err)
	}
}

// Close closes the sandbox's file (it stays on disk: it is the record).
func (l *Log) Close(id string) { l.files.Close(id) }

// CloseAll closes every open file.
func (l *Log) CloseAll() { l.files.CloseAll() }

// Read returns the sandbox's entries in the order the actions started,
// including rotated files; of a command written at start and at end, the
// last version is kept. An unknown sandbox has no entries (not an error).
func (l *Log) Read(ctx context.Context, id string) ([]Entry, error) {
	if err := types.ValidSandboxID(id); err != nil {
		return nil, err
	}
	// No lock: Append runs in the proxied stream's path and must not wait
	// for a reader. Each line is written whole, so a read sees complete
	// entries; one racing a rotation may miss the newest.
	var out []Entry
	pos := map[string]int{}
	for _, p := range l.files.Paths(id) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		_, err := audit.ReadLines(p, 0, func(line []byte) {
			var e Entry
			if json.Unmarshal(line, &e) != nil {
				return
			}
			if j, ok := pos[e.ID]; ok {
				out[j] = e
				return
			}
			pos[e.ID] = len(out)
			out = append(out, e)
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

type ctxKey struct{}

type origin struct{ sandbox, api string }

// WithSandbox marks a proxied request's context with the sandbox it goes
// to and the API it came through; the Transport records only requests so
// marked.
func WithSandbox(ctx context.Context, sandbox, api string) context.Context {
	return context.WithValue(ctx, ctxKey{}, origin{sandbox, api})
}

func originOf(r *http.Request) (origin, bool) {
	o, ok := r.Context().Value(ctxKey{}).(origin)
	return o, ok && o.sandbox != ""
}

// Remove deletes a sandbox's work log.
func (l *Log) Remove(id string) error { return l.files.Remove(id) }
