// Package review hands a sandbox's work back to people: the diff of a git
// checkout against the commit it started from, the work exported as a patch
// series or a bundle, and a commit made with a configured author. Git runs
// inside the sandbox, through its agent: the daemon never runs git on
// sandbox files on the host, where a crafted repository (hooks, config,
// filters) could act with the daemon's rights.
package review

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/worklog"
)

// DefaultPath is where workspaces are checked out.
const DefaultPath = "/workspace"

// DefaultAuthor signs commits when neither the request nor the daemon's
// configuration names an author.
const DefaultAuthor = "Berth <berth@localhost>"

// BaseFile, in the repository's git dir, holds the commit the workspace was
// checked out at. Whoever creates a workspace writes it; without it the
// base is where HEAD forked from its upstream, else from origin's default
// branch, else HEAD itself.
const BaseFile = "berth-base"

// Agents finds a running sandbox's agent.
type Agents interface {
	Agent(ctx context.Context, id string) (addr, token string, err error)
}

// Config configures a Service.
type Config struct {
	Agents Agents
	// Transport carries requests to agents (the work log's, so review
	// commands are recorded like any other).
	Transport http.RoundTripper
	// Author is the default commit author, "Name <email>".
	Author string
	Logger *slog.Logger
}

// Service runs review operations in sandboxes.
type Service struct {
	cfg Config
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Author == "" {
		cfg.Author = DefaultAuthor
	}
	if _, _, err := ParseAuthor(cfg.Author); err != nil {
		return nil, err
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg}, nil
}

var authorRE = regexp.MustCompile(`^\s*([^<>\n]*?)\s*<([^<>\s]+)>\s*$`)

// ParseAuthor splits "Name <email>".
func ParseAuthor(s string) (name, email string, err error) {
	m := authorRE.FindStringSubmatch(s)
	if m == nil || m[1] == "" {
		return "", "", fmt.Errorf("author %q: want \"Name <email>\": %w", s, errdefs.ErrInvalidArgument)
	}
	return m[1], m[2], nil
}

// Formats of Export.
const (
	FormatPatch  = "patch"
	FormatBundle = "bundle"
)

// Diff writes the binary-safe diff of the checkout at path (tracked
// changes, deletions and new untracked files, committed or not) against
// its base commit.
func (s *Service) Diff(ctx context.Context, id, path string, w io.Writer) error {
	return s.run(ctx, id, diffScript, []string{s.dir(path)}, nil, w)
}

// Export writes the work at path as a patch series (format-patch mbox: the
// commits since the base, then the uncommitted changes as one last patch
// by the configured author) or as a git bundle of the commits since the
// base, with HEAD and the current branch as its refs.
func (s *Service) Export(ctx context.Context, id, path, format string, w io.Writer) error {
	switch format {
	case FormatPatch, "":
		return s.run(ctx, id, patchScript, []string{s.dir(path)}, s.authorEnv(s.cfg.Author), w)
	case FormatBundle:
		return s.run(ctx, id, bundleScript, []string{s.dir(path)}, nil, w)
	}
	return fmt.Errorf("export format %q: want patch or bundle: %w", format, errdefs.ErrInvalidArgument)
}

// CommitRequest describes a commit of everything in the checkout.
type CommitRequest struct {
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	// Branch, when set, is created from HEAD (unless checked out
	// already) and receives the commit.
	Branch string `json:"branch,omitempty"`
	// Author is "Name <email>"; empty takes the daemon's default.
	Author string `json:"author,omitempty"`
}

// CommitResult is the commit made.
type CommitResult struct {
	Commit string `json:"commit"`
	Branch string `json:"branch,omitempty"`
	Author string `json:"author"`
}

var branchRE = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,200}$`)

// Commit stages everything in the checkout and commits it.
func (s *Service) Commit(ctx context.Context, id string, req CommitRequest) (CommitResult, error) {
	if strings.TrimSpace(req.Message) == "" {
		return CommitResult{}, fmt.Errorf("commit message is empty: %w", errdefs.ErrInvalidArgument)
	}
	if req.Branch != "" && (!branchRE.MatchString(req.Branch) || strings.HasPrefix(req.Branch, "-")) {
		return CommitResult{}, fmt.Errorf("branch %q: %w", req.Branch, errdefs.ErrInvalidArgument)
	}
	author := req.Author
	if author == "" {
		author = s.cfg.Author
	}
	if _, _, err := ParseAuthor(author); err != nil {
		return CommitResult{}, err
	}
	// The answer is a commit id and a branch name; a sandbox (its git is
	// its own) that prints more is refused once past the bound, not
	// buffered.
	out := &boundedBuffer{max: maxCommitOutput}
	if err := s.run(ctx, id, commitScript, []string{s.dir(req.Path), req.Message, req.Branch}, s.authorEnv(author), out); err != nil {
		if errors.Is(err, errTooLong) {
			return CommitResult{}, fmt.Errorf("sandbox %s: commit printed more than %d bytes, not a commit id and branch: %w", id, maxCommitOutput, errdefs.ErrFailedPrecondition)
		}
		return CommitResult{}, err
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	res := CommitResult{Commit: lines[0], Author: author}
	if len(lines) > 1 {
		res.Branch = lines[1]
	}
	return res, nil
}

func (s *Service) dir(path string) string {
	if path == "" {
		return DefaultPath
	}
	return path
}

func (s *Service) authorEnv(author string) map[string]string {
	name, email, _ := ParseAuthor(author)
	return map[string]string{
		"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
		"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
	}
}

// maxCommitOutput bounds what Commit reads back: a commit id and a branch.
const maxCommitOutput = 4 << 10

var errTooLong = errors.New("output too long")

// boundedBuffer keeps up to max bytes and fails the write past them, which
// ends the stream (the process in the sandbox sees its pipe close).
type boundedBuffer struct {
	bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, errTooLong
	}
	return b.Buffer.Write(p)
}

// Exit codes of the scripts, mapped to error classes.
const (
	exitNoDir      = 3
	exitNothing    = 4
	exitNoRepo     = 5
	exitGitMissing = 6
)

// maxStderr bounds the error output a failing script's error quotes.
const maxStderr = 16 << 10

// run runs a script (constant text; arguments go in as positional
// parameters, never into the script) and copies its stdout to w. The
// scripts write their result to a file and print it only once everything
// succeeded, so a failure reaches the caller before any output. The agent
// is not trusted: agentlink bounds each message it reads, w bounds (or
// streams away) stdout, and stderr keeps only its first maxStderr bytes.
func (s *Service) run(ctx context.Context, id, script string, args []string, env map[string]string, w io.Writer) error {
	addr, token, err := s.cfg.Agents.Agent(ctx, id)
	if err != nil {
		return err
	}
	stderr := &headBuffer{max: maxStderr}
	res, err := agentlink.Run(worklog.WithSandbox(ctx, id, "berth"), s.cfg.Transport, addr, token, agentlink.Command{
		Argv:   append([]string{"/bin/sh", "-c", prelude + script, "berth-review"}, args...),
		Env:    env,
		Stdout: w,
		Stderr: stderr,
	})
	if err != nil {
		if errors.Is(err, errdefs.ErrUnavailable) {
			return fmt.Errorf("run git in sandbox %s: %w", id, err)
		}
		// The caller's writer failed (its bound, a client gone).
		return err
	}
	return scriptError(id, res, strings.TrimSpace(stderr.String()))
}

// headBuffer keeps the first max bytes written and drops the rest without
// failing, so a chatty stderr never ends the command.
type headBuffer struct {
	bytes.Buffer
	max int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func scriptError(id string, end agentlink.Result, stderr string) error {
	if end.Exited && end.ExitCode == 0 {
		return nil
	}
	msg := stderr
	if msg == "" {
		msg = end.Status
	}
	var class error
	switch {
	case !end.Exited:
		class = errdefs.ErrUnavailable
	case end.ExitCode == exitNoDir:
		class = errdefs.ErrNotFound
	case end.ExitCode == exitNothing, end.ExitCode == exitNoRepo, end.ExitCode == exitGitMissing:
		class = errdefs.ErrFailedPrecondition
	default:
		return fmt.Errorf("sandbox %s: git failed (%s): %s", id, end.Status, msg)
	}
	return fmt.Errorf("sandbox %s: %s: %w", id, msg, class)
}
