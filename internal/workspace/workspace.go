package workspace

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/secret"
	"github.com/berth-sandbox/berth/internal/template"
)

// Workspace events, recorded while a workspace sandbox is still creating.
const (
	EventSetupStarted = "setup_started"
	EventSetupStep    = "setup_step"
	EventSetupDone    = "setup_done"
	EventSetupCached  = "setup_cached"
)

// CheckoutDir is where the repository is checked out in the sandbox.
const CheckoutDir = "/workspace"

// Agent runs commands and writes files in a sandbox through its agent
// (agentlink.Link).
type Agent interface {
	Run(ctx context.Context, addr, token string, c agentlink.Command) (agentlink.Result, error)
	WriteFile(ctx context.Context, addr, token, path string, r io.Reader) error
}

// Manager is what workspaces need of the sandbox Manager: a create with a
// setup hook, and the short-lived sandbox that resolves a remote ref.
type Manager interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Destroy(ctx context.Context, id, reason string) error
	Agent(ctx context.Context, id string) (addr, token string, err error)
	DefaultTemplate() string
}

// Templates resolves template names (template.Store).
type Templates interface {
	Get(ctx context.Context, name string) (template.Template, error)
}

// Secrets is the host-side secret store (secret.Store): setup reads
// values; the API manages names.
type Secrets interface {
	Get(name string) ([]byte, error)
	Has(name string) bool
	Set(name string, value []byte) error
	List() ([]secret.Info, error)
	Remove(name string) error
}

// EnvCache keeps cached environments (template.Store).
type EnvCache interface {
	Environment(ctx context.Context, key string) (template.Environment, error)
	AddEnvironment(ctx context.Context, key string, base template.Template, repo, commit string, envFile []byte, src string) (template.Environment, error)
	TouchEnvironment(key string)
	Environments(ctx context.Context) ([]template.Environment, error)
	PruneEnvironments(ctx context.Context, key string) ([]string, error)
}

// Config wires workspace creation.
type Config struct {
	Agent     Agent
	Templates Templates
	Secrets   Secrets
	// Cache, with UpperDir, enables cached environments.
	Cache EnvCache
	// UpperDir is the host path of a sandbox's writable layer.
	UpperDir func(id string) string
	// Git is the host git used for file:// repositories (default "git").
	Git    string
	Logger *slog.Logger
}

// Service creates sandboxes that hold a repository at a commit, set up
// by its environment file: clone, setup steps under the setup policy, then
// the agent-phase policy. It drives the Manager's create with a setup hook
// so the sandbox stays creating until setup is done.
type Service struct {
	m   Manager
	cfg Config
	log *slog.Logger
}

// New returns the workspace service on top of m.
func New(m Manager, cfg Config) (*Service, error) {
	if m == nil || cfg.Agent == nil || cfg.Templates == nil || cfg.Secrets == nil {
		return nil, fmt.Errorf("workspaces: manager, agent, templates and secrets are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Git == "" {
		cfg.Git = "git"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{m: m, cfg: cfg, log: cfg.Logger}, nil
}

// Request asks for a workspace sandbox.
type Request struct {
	Repo string
	Ref  string
	// Environment is an environment file's content; nil means the
	// repository's own .berth/environment.yaml (none: no setup).
	Environment []byte
	// Sandbox carries limits, timeout, labels and env; its Network is
	// ignored (the environment file's policies apply). Limits it sets win
	// over the file's resources.
	Sandbox sandbox.CreateRequest
	// NoCache skips the environment cache (neither used nor filled).
	NoCache bool
}

// Progress is one line of a workspace create's stream.
type Progress struct {
	// Type is an event type (setup_started, setup_step, setup_done,
	// setup_cached) or "log" for step output.
	Type    string
	Message string
	// Step is the 1-based setup step, 0 outside steps.
	Step int
}

var refPattern = regexp.MustCompile(`^[A-Za-z0-9._/@+-]{1,255}$`)

// source is a validated repository and ref.
type source struct {
	url, ref string
	// local is the host path of a file:// repository.
	local string
	// commit is known before the sandbox exists for local repositories.
	commit string
}

// fullSHA matches a full (SHA-1) commit ID.
var fullSHA = regexp.MustCompile(`^[0-9a-f]{40}$`)

func parseSource(repo, ref string) (source, error) {
	if ref == "" {
		ref = "HEAD"
	}
	if !refPattern.MatchString(ref) || strings.HasPrefix(ref, "-") || strings.Contains(ref, "..") {
		return source{}, &sandbox.FieldError{Field: "ref", Err: fmt.Errorf("ref %q is not a branch, tag or commit name: %w", ref, errdefs.ErrInvalidArgument)}
	}
	u, err := url.Parse(repo)
	if err != nil || repo == "" {
		return source{}, &sandbox.FieldError{Field: "repo", Err: fmt.Errorf("repo %q is not a URL: %w", repo, errdefs.ErrInvalidArgument)}
	}
	src := source{url: repo, ref: ref}
	switch u.Scheme {
	case "file":
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return source{}, &sandbox.FieldError{Field: "repo", Err: fmt.Errorf("repo %q: want file:///absolute/path: %w", repo, errdefs.ErrInvalidArgument)}
		}
		src.local = u.Path
	case "http", "https":
		if u.Host == "" || u.User != nil {
			return source{}, &sandbox.FieldError{Field: "repo", Err: fmt.Errorf("repo %q: want http(s)://host/path without credentials (use a secret): %w", repo, errdefs.ErrInvalidArgument)}
		}
		// A full commit ID pins the checkout without asking the remote,
		// so a cached environment can serve it. Branches and tags are
		// resolved only inside the sandbox (never by the host, which
		// would let a create reach what the sandbox's policy forbids).
		if fullSHA.MatchString(ref) {
			src.commit = ref
		}
	default:
		return source{}, &sandbox.FieldError{Field: "repo", Err: fmt.Errorf("repo %q: scheme %q is not supported (file, http, https): %w", repo, u.Scheme, errdefs.ErrInvalidArgument)}
	}
	return src, nil
}

// git runs the host git on a local repository.
func (w *Service) git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, w.cfg.Git, append([]string{"-C", dir}, args...)...)
	// The operator's global config and hooks must not change what we read.
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// resolveLocal finds the commit of a file:// repository's ref and, when
// asked, its environment file at that commit.
func (w *Service) resolveLocal(ctx context.Context, src *source, wantEnv bool) ([]byte, error) {
	if _, err := w.git(ctx, src.local, "rev-parse", "--git-dir"); err != nil {
		return nil, &sandbox.FieldError{Field: "repo", Err: fmt.Errorf("repo %s is not a reachable git repository: %w", src.url, errdefs.ErrInvalidArgument)}
	}
	var commit string
	for _, cand := range []string{"refs/heads/" + src.ref, "refs/tags/" + src.ref, src.ref} {
		if c, err := w.git(ctx, src.local, "rev-parse", "--verify", "--quiet", "--end-of-options", cand+"^{commit}"); err == nil && c != "" {
			commit = c
			break
		}
	}
	if commit == "" {
		return nil, &sandbox.FieldError{Field: "ref", Err: fmt.Errorf("ref %q not found in %s: %w", src.ref, src.url, errdefs.ErrNotFound)}
	}
	src.commit = commit
	if !wantEnv {
		return nil, nil
	}
	data, err := w.git(ctx, src.local, "show", commit+":"+DefaultPath)
	if err != nil {
		return nil, nil // no environment file: no setup
	}
	return []byte(data + "\n"), nil
}

// Create makes a workspace sandbox. progress (which may be nil) receives
// setup events and step output as they happen. On failure the sandbox, if
// one was made, is torn down and left failed with the reason, which names
// the step, its exit code and the tail of its log.
func (w *Service) Create(ctx context.Context, req Request, progress func(Progress)) (sandbox.Sandbox, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	src, err := parseSource(req.Repo, req.Ref)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	envFile := req.Environment
	if src.local != "" {
		found, err := w.resolveLocal(ctx, &src, envFile == nil)
		if err != nil {
			return sandbox.Sandbox{}, err
		}
		if envFile == nil {
			envFile = found
		}
	}
	var env *Environment
	if envFile != nil {
		if env, err = parseEnv(envFile); err != nil {
			return sandbox.Sandbox{}, err
		}
		if err := w.checkSecrets(env); err != nil {
			return sandbox.Sandbox{}, err
		}
	}
	sreq := req.Sandbox
	sreq.Network = nil
	// Commands that name no directory (E2B's SDK, a shell) start in the
	// checkout.
	sreq.Workdir = CheckoutDir
	tplName := sreq.Template
	if env != nil {
		applyResources(&sreq, env)
		if env.Template != "" {
			tplName = env.Template
		}
		// The file's level applies unless the request names one: a
		// user asking for a level explicitly gets it.
		if sreq.Isolation == "" {
			sreq.Isolation = env.Isolation
		}
	}
	if tplName == "" {
		tplName = w.m.DefaultTemplate()
	}
	sreq.Template = tplName
	if sreq.Labels == nil {
		sreq.Labels = map[string]string{}
	}
	sreq.Labels["berth.workspace/commit"] = src.commit

	// A remote branch or tag is resolved to its commit first when the
	// cache holds anything of that repository, so a create can hit it.
	if src.local == "" && src.commit == "" && w.cfg.Cache != nil && w.cfg.UpperDir != nil && !req.NoCache && w.cachedRepo(ctx, src.url) {
		w.resolveRemote(ctx, &src, tplName, progress)
		if src.commit != "" {
			sreq.Labels["berth.workspace/commit"] = src.commit
		}
	}
	// A local repository's commit is known now: a cached environment
	// skips setup entirely.
	var key string
	var tpl template.Template
	if w.cfg.Cache != nil && w.cfg.UpperDir != nil && !req.NoCache && src.commit != "" {
		if tpl, err = w.cfg.Templates.Get(ctx, tplName); err != nil {
			return sandbox.Sandbox{}, &sandbox.FieldError{Field: "template", Err: err}
		}
		key = Key{Template: tpl.Name, TemplateBuilt: tpl.BuiltAt, Repo: src.url, Commit: src.commit, EnvFile: envFile}.Hash()
		if cached, err := w.cfg.Cache.Environment(ctx, key); err == nil {
			if env == nil && len(cached.EnvFile) > 0 {
				// A pinned remote commit: its environment file was
				// recorded when the cache was filled.
				if env, err = parseEnv(cached.EnvFile); err != nil {
					return sandbox.Sandbox{}, err
				}
				applyResources(&sreq, env)
			}
			return w.createCached(ctx, sreq, env, cached, progress)
		}
	}
	if src.commit == "" {
		delete(sreq.Labels, "berth.workspace/commit")
	}
	sp := setupPolicy(env, src)
	sreq.Network = &sp
	run := &setupRun{w: w, src: src, env: env, envFile: envFile, key: key, tpl: tpl, progress: progress}
	sreq.Setup = run.run
	return w.m.Create(ctx, sreq)
}

func parseEnv(data []byte) (*Environment, error) {
	env, err := Parse(data)
	if err != nil {
		return nil, &sandbox.FieldError{Field: "environment", Err: err}
	}
	return env, nil
}

func (w *Service) checkSecrets(env *Environment) error {
	for _, s := range env.Secrets {
		if !w.cfg.Secrets.Has(s) {
			return &sandbox.FieldError{Field: "environment", Err: fmt.Errorf("secret %s named by the environment file is not set (berth secret set %s): %w", s, s, errdefs.ErrNotFound)}
		}
	}
	return nil
}

// applyResources fills the limits the request left at zero from the file.
func applyResources(req *sandbox.CreateRequest, env *Environment) {
	r := env.Resources
	if req.Limits.CPUMillis == 0 {
		req.Limits.CPUMillis = r.CPUMillis
	}
	if req.Limits.MemoryBytes == 0 {
		req.Limits.MemoryBytes = r.MemoryBytes
	}
	if req.Limits.DiskBytes == 0 {
		req.Limits.DiskBytes = r.DiskBytes
	}
	if req.Timeout == 0 {
		req.Timeout = r.Timeout
	}
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	for k, v := range env.Env {
		if _, ok := req.Env[k]; !ok {
			req.Env[k] = v
		}
	}
}

// setupPolicy is the environment's setup policy; a remote repository's host
// is added so the clone can reach it.
func setupPolicy(env *Environment, src source) policy.Policy {
	var p policy.Policy
	if env != nil {
		p = env.SetupPolicy
	}
	if src.local != "" {
		return p.Normalize()
	}
	u, _ := url.Parse(src.url)
	switch p.Mode {
	case "", policy.ModeNone, policy.ModeLearn:
		p = policy.Policy{Mode: policy.ModeAllow, Allow: []string{u.Hostname()}}
	case policy.ModeAllow:
		p.Allow = append(append([]string(nil), p.Allow...), u.Hostname())
	}
	return p.Normalize()
}

func agentPolicy(env *Environment) policy.Policy {
	if env == nil {
		return policy.Policy{Mode: policy.ModeNone}
	}
	return env.AgentPolicy.Normalize()
}

// cachedRepo reports whether any cached environment comes from repo.
func (w *Service) cachedRepo(ctx context.Context, repo string) bool {
	envs, err := w.cfg.Cache.Environments(ctx)
	if err != nil {
		return false
	}
	for _, e := range envs {
		if e.Repo == repo {
			return true
		}
	}
	return false
}

// resolveRemote finds the commit a remote branch or tag names with `git
// ls-remote`, run in a short-lived sandbox whose policy lets it reach only
// the repository's host: the host itself never contacts a repository a
// request names. On success src pins that commit (the clone then checks
// out exactly what the cache key says); on any failure src is left as it
// was and the ordinary clone reports the problem.
func (w *Service) resolveRemote(ctx context.Context, src *source, tplName string, progress func(Progress)) {
	p := setupPolicy(nil, *src)
	sb, err := w.m.Create(ctx, sandbox.CreateRequest{Template: tplName, Network: &p, Timeout: 2 * time.Minute,
		Labels: map[string]string{"berth.workspace/resolver": "true"}})
	if err != nil {
		w.log.Warn("resolve_remote_ref", "repo", src.url, "err", err)
		return
	}
	defer func() {
		if err := w.m.Destroy(context.WithoutCancel(ctx), sb.ID, "workspace ref resolved"); err != nil {
			w.log.Warn("resolve_sandbox_destroy_failed", "sandbox_id", sb.ID, "err", err)
		}
	}()
	addr, token, err := w.m.Agent(ctx, sb.ID)
	if err != nil {
		return
	}
	var out bytes.Buffer
	argv := []string{"git", "ls-remote", "--", src.url, "refs/heads/" + src.ref, "refs/tags/" + src.ref, "refs/tags/" + src.ref + "^{}"}
	res, err := w.cfg.Agent.Run(ctx, addr, token, agentlink.Command{Argv: argv, User: "root", Cwd: "/",
		Env: map[string]string{"GIT_TERMINAL_PROMPT": "0"}, Stdout: &limitedBuffer{buf: &out, max: 1 << 20}})
	if err != nil || res.ExitCode != 0 {
		return
	}
	if commit := pickRef(out.String(), src.ref); commit != "" {
		progress(Progress{Type: "log", Message: "berth: " + src.ref + " is " + commit + "\n"})
		src.commit, src.ref = commit, commit
	}
}

// pickRef chooses the commit for ref from `git ls-remote` output: a peeled
// annotated tag, then the tag, then the branch.
func pickRef(lsRemote, ref string) string {
	found := map[string]string{}
	for _, line := range strings.Split(lsRemote, "\n") {
		sha, name, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok && fullSHA.MatchString(sha) {
			found[name] = sha
		}
	}
	for _, name := range []string{"refs/tags/" + ref + "^{}", "refs/tags/" + ref, "refs/heads/" + ref} {
		if sha := found[name]; sha != "" {
			return sha
		}
	}
	return ""
}

// createCached starts a sandbox from a cached environment: its layers
// already hold the checkout and what setup made.
func (w *Service) createCached(ctx context.Context, sreq sandbox.CreateRequest, env *Environment, cached template.Environment, progress func(Progress)) (sandbox.Sandbox, error) {
	ap := agentPolicy(env)
	sreq.Network = &ap
	sreq.Layers = cached.Layers
	sreq.Setup = func(ctx context.Context, h *sandbox.SetupHandle) error {
		msg := "cached environment " + cached.Key + " (commit " + cached.Commit + "): setup skipped"
		h.Event(ctx, EventSetupCached, msg)
		progress(Progress{Type: EventSetupCached, Message: msg})
		return nil
	}
	sb, err := w.m.Create(ctx, sreq)
	if err == nil {
		w.cfg.Cache.TouchEnvironment(cached.Key)
	}
	return sb, err
}

var errInvalid = errdefs.ErrInvalidArgument

// SetSecret stores a secret's value.
func (w *Service) SetSecret(name string, value []byte) error {
	return w.cfg.Secrets.Set(name, value)
}

// HasSecret reports whether a secret is set.
func (w *Service) HasSecret(name string) bool { return w.cfg.Secrets.Has(name) }

// ListSecrets lists secret names, never values.
func (w *Service) ListSecrets() ([]secret.Info, error) { return w.cfg.Secrets.List() }

// RemoveSecret deletes a secret.
func (w *Service) RemoveSecret(name string) error { return w.cfg.Secrets.Remove(name) }

// Environments lists the cached environments.
func (w *Service) Environments(ctx context.Context) ([]template.Environment, error) {
	if w.cfg.Cache == nil {
		return nil, nil
	}
	return w.cfg.Cache.Environments(ctx)
}

// PruneEnvironments removes cached environments no sandbox uses (all, or
// the one named by key).
func (w *Service) PruneEnvironments(ctx context.Context, key string) ([]string, error) {
	if w.cfg.Cache == nil {
		return nil, nil
	}
	return w.cfg.Cache.PruneEnvironments(ctx, key)
}
