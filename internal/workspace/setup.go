package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/template"
)

// bundlePath is where a local repository's git bundle is uploaded for the
// clone; it is removed before setup steps run.
const bundlePath = "/tmp/.berth-repo.bundle"

// tailBytes is how much of a failing step's output its error keeps.
const tailBytes = 2048

// setupRun is one workspace setup, run by the Manager's create hook while
// the sandbox is still creating and the create holds its op lock.
type setupRun struct {
	w       *Service
	src     source
	env     *Environment
	envFile []byte
	// repoEnvFile is the repository's own environment file, when setup
	// read it from the checkout; the cache keeps it for pinned commits.
	repoEnvFile []byte
	key         string
	tpl         template.Template
	progress    func(Progress)
}

func (r *setupRun) event(ctx context.Context, h *sandbox.SetupHandle, typ, msg string, step int) {
	h.Event(ctx, typ, msg)
	r.progress(Progress{Type: typ, Message: msg, Step: step})
}

// progressWriter streams step output as progress lines and keeps a tail.
type progressWriter struct {
	mu       sync.Mutex
	step     int
	progress func(Progress)
	tail     []byte
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.progress(Progress{Type: "log", Message: string(b), Step: p.step})
	p.tail = append(p.tail, b...)
	if len(p.tail) > tailBytes {
		p.tail = append([]byte(nil), p.tail[len(p.tail)-tailBytes:]...)
	}
	return len(b), nil
}

func (p *progressWriter) tailString() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.TrimSpace(string(bytes.ToValidUTF8(p.tail, []byte("?"))))
}

// exec runs argv as root in the sandbox, its stdout and stderr both to
// out, and returns its exit code.
func (r *setupRun) exec(ctx context.Context, h *sandbox.SetupHandle, cwd string, argv []string, env map[string]string, out io.Writer) (int, error) {
	addr, token := h.Agent()
	res, err := r.w.cfg.Agent.Run(ctx, addr, token, agentlink.Command{Argv: argv, Env: env, User: "root", Cwd: cwd, Stdout: out, Stderr: out})
	if err != nil {
		return -1, err
	}
	return res.ExitCode, nil
}

func (r *setupRun) run(ctx context.Context, h *sandbox.SetupHandle) error {
	ctx, cancel := context.WithDeadline(ctx, h.Deadline())
	defer cancel()
	r.event(ctx, h, EventSetupStarted, "clone "+r.src.url+" at "+r.src.ref, 0)
	commit, err := r.clone(ctx, h)
	if err != nil {
		return err
	}
	if r.env == nil {
		if err := r.loadRepoEnv(ctx, h); err != nil {
			return err
		}
	}
	env := r.env
	if env == nil {
		env = &Environment{}
	}
	vars := map[string]string{}
	for k, v := range env.Env {
		vars[k] = v
	}
	for _, s := range env.Secrets {
		v, err := r.w.cfg.Secrets.Get(s)
		if err != nil {
			return err
		}
		vars[s] = string(v)
	}
	shell := "/bin/sh"
	if code, _ := r.exec(ctx, h, "/", []string{"/bin/sh", "-c", "command -v bash"}, nil, &progressWriter{progress: func(Progress) {}}); code == 0 {
		shell = "bash"
	}
	for i, st := range env.Setup {
		label := st.Label(i)
		r.event(ctx, h, EventSetupStep, label+": "+firstLine(st.Run), i+1)
		out := &progressWriter{step: i + 1, progress: r.progress}
		start := time.Now()
		code, err := r.exec(ctx, h, CheckoutDir, []string{shell, "-ec", st.Run}, vars, out)
		if err != nil {
			return fmt.Errorf("setup %s: %w; log tail:\n%s", label, err, out.tailString())
		}
		if code != 0 {
			// The repository's own script failed: the user's to fix,
			// not a bug in Berth.
			return fmt.Errorf("setup %s exited with code %d after %s; log tail:\n%s: %w", label, code, time.Since(start).Round(time.Millisecond), out.tailString(), errdefs.ErrFailedPrecondition)
		}
	}
	// Nothing started during setup outlives it: a background process would
	// keep the secrets in its environment into the agent phase.
	quiet := &progressWriter{progress: func(Progress) {}}
	if _, err := r.exec(ctx, h, "/", []string{"/bin/sh", "-c", "kill -KILL -1 2>/dev/null; exit 0"}, nil, quiet); err != nil {
		return fmt.Errorf("end setup processes: %w", err)
	}
	if r.key != "" {
		r.freeze(ctx, h, commit)
	}
	ap := agentPolicy(r.env)
	if err := h.SetPolicy(ctx, ap); err != nil {
		return fmt.Errorf("apply the agent-phase policy: %w", err)
	}
	r.event(ctx, h, EventSetupDone, fmt.Sprintf("commit %s; %d setup step(s) done; agent policy %s", commit, len(env.Setup), ap.Mode), 0)
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// clone checks the repository out at the ref into /workspace and returns
// the commit.
func (r *setupRun) clone(ctx context.Context, h *sandbox.SetupHandle) (string, error) {
	out := &progressWriter{progress: r.progress}
	gitEnv := map[string]string{"GIT_TERMINAL_PROMPT": "0", "REF": r.src.ref, "URL": r.src.url}
	var script string
	if r.src.local != "" {
		bundle, err := r.bundle(ctx)
		if err != nil {
			return "", err
		}
		defer os.Remove(bundle)
		f, err := os.Open(bundle)
		if err != nil {
			return "", err
		}
		addr, token := h.Agent()
		err = r.w.cfg.Agent.WriteFile(ctx, addr, token, bundlePath, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("copy the repository into the sandbox: %w", err)
		}
		gitEnv["COMMIT"] = r.src.commit
		gitEnv["BUNDLE"] = bundlePath
		// .git/berth-base records the checked-out commit: the base that
		// `berth diff` and `berth export` compare against.
		script = `set -e
git clone --quiet --no-checkout "$BUNDLE" /workspace
rm -f "$BUNDLE"
cd /workspace
git -c advice.detachedHead=false checkout --quiet --detach "$COMMIT"
git remote set-url origin "$URL"
git rev-parse HEAD > "$(git rev-parse --git-dir)/berth-base"
git rev-parse HEAD`
	} else {
		// Exit codes 127 (no git), 4 (the clone) and 3 (the ref) tell
		// the caller's mistakes from other failures.
		script = `set -e
command -v git >/dev/null || { echo "git: not found" >&2; exit 127; }
git clone --quiet --no-checkout -- "$URL" /workspace || exit 4
cd /workspace
c=$(git rev-parse --verify --quiet "refs/remotes/origin/$REF^{commit}" || git rev-parse --verify --quiet "refs/tags/$REF^{commit}" || git rev-parse --verify --quiet "$REF^{commit}") || { echo "berth: ref $REF not found in $URL" >&2; exit 3; }
git -c advice.detachedHead=false checkout --quiet --detach "$c"
git rev-parse HEAD > "$(git rev-parse --git-dir)/berth-base"
git rev-parse HEAD`
	}
	code, err := r.exec(ctx, h, "/", []string{"/bin/sh", "-c", script}, gitEnv, out)
	tail := out.tailString()
	if err != nil {
		return "", fmt.Errorf("clone %s: %w", r.src.url, err)
	}
	switch code {
	case 3:
		return "", fmt.Errorf("ref %q not found in %s: %w", r.src.ref, r.src.url, errdefs.ErrNotFound)
	case 4:
		return "", fmt.Errorf("repo %s is not a reachable git repository: %s: %w", r.src.url, tail, errInvalid)
	case 127:
		return "", fmt.Errorf("clone %s: template %q has no git (%s): use a template with git, such as base: %w", r.src.url, h.Template(), tail, errInvalid)
	}
	if code != 0 {
		return "", fmt.Errorf("clone %s at %s: git exited with code %d: %s: %w", r.src.url, r.src.ref, code, tail, errdefs.ErrFailedPrecondition)
	}
	lines := strings.Fields(tail)
	if len(lines) == 0 {
		return "", fmt.Errorf("clone %s: no commit reported", r.src.url)
	}
	return lines[len(lines)-1], nil
}

// bundle packs a local repository into a git bundle on the host, so the
// sandbox receives the repository's objects and never a host path.
func (r *setupRun) bundle(ctx context.Context) (string, error) {
	f, err := os.CreateTemp("", "berth-repo-*.bundle")
	if err != nil {
		return "", err
	}
	path := f.Name()
	f.Close()
	if _, err := r.w.git(ctx, r.src.local, "bundle", "create", "--quiet", path, "--all"); err != nil {
		os.Remove(path)
		return "", fmt.Errorf("bundle %s: %w", r.src.url, err)
	}
	return path, nil
}

// loadRepoEnv reads the clone's own environment file (remote repositories,
// whose file could not be read before the sandbox existed).
func (r *setupRun) loadRepoEnv(ctx context.Context, h *sandbox.SetupHandle) error {
	var buf bytes.Buffer
	code, err := r.exec(ctx, h, CheckoutDir, []string{"cat", "--", DefaultPath}, nil, &limitedBuffer{buf: &buf, max: MaxSize + 1})
	if err != nil {
		return fmt.Errorf("read %s: %w", DefaultPath, err)
	}
	if code != 0 {
		return nil // no environment file: no setup
	}
	env, err := parseEnv(buf.Bytes())
	if err != nil {
		return err
	}
	if env.Template != "" && env.Template != h.Template() {
		return fmt.Errorf("%s names template %q but the sandbox was made from %q: pass the template with the request (--template %s): %w", DefaultPath, env.Template, h.Template(), env.Template, errInvalid)
	}
	if err := r.w.checkSecrets(env); err != nil {
		return err
	}
	r.env = env
	r.repoEnvFile = bytes.Clone(buf.Bytes())
	// The file's setup policy replaces the clone-only one.
	sp := setupPolicy(env, r.src)
	return h.SetPolicy(ctx, sp)
}

type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(b []byte) (int, error) {
	if l.buf.Len()+len(b) > l.max {
		return 0, errors.New("environment file too large")
	}
	return l.buf.Write(b)
}

// freeze copies the sandbox's writable layer into a cached environment
// while the sandbox is paused. A failure costs only the cache, not the
// sandbox.
func (r *setupRun) freeze(ctx context.Context, h *sandbox.SetupHandle, commit string) {
	if !h.CanPause() {
		return
	}
	start := time.Now()
	id := h.ID()
	if err := h.Pause(ctx); err != nil {
		r.w.log.Warn("freeze_environment", "sandbox_id", id, "err", err)
		return
	}
	_, err := r.w.cfg.Cache.AddEnvironment(ctx, r.key, r.tpl, r.src.url, commit, r.repoEnvFile, r.w.cfg.UpperDir(id))
	if rerr := h.Resume(context.WithoutCancel(ctx)); rerr != nil {
		r.w.log.Error("resume_after_freeze", "sandbox_id", id, "err", rerr)
	}
	if err != nil {
		r.w.log.Warn("freeze_environment", "sandbox_id", id, "err", err)
		r.progress(Progress{Type: "log", Message: "berth: could not cache the environment: " + err.Error() + "\n"})
		return
	}
	r.progress(Progress{Type: "log", Message: "berth: cached environment " + r.key + " in " + strconv.FormatInt(time.Since(start).Milliseconds(), 10) + "ms\n"})
}
