package dockerfile

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/template"
)

// Store is what a build needs from the template store.
type Store interface {
	UIDBase() uint32
	StepLayer(key string) (string, bool)
	SharedLayerDir(id string) string
	AddStepLayer(ctx context.Context, key string, fill func(dir string) error) (string, error)
	FreezeInto(ctx context.Context, src, dir string) error
	ImportLayers(ctx context.Context, name string) ([]string, template.Defaults, error)
	PullLayers(ctx context.Context, ref string, log io.Writer) ([]string, template.Defaults, string, error)
	HoldLayers() func()
	PutBuilt(ctx context.Context, r template.BuildRecord) (template.Template, error)
}

// Command is one RUN, as the build sandbox runs it.
type Command struct {
	Argv []string
	Env  map[string]string
	User string // "" = root
	Cwd  string
}

// Runner runs RUN steps in build sandboxes (the daemon's, under Berth's own
// isolation and the build network policy).
type Runner interface {
	// Run runs c in a new sandbox stacked on layers (lowest first),
	// streaming its output to log; when it exits 0, freeze gets the
	// sandbox's writable layer (paused) to keep. A non-zero exit is
	// errdefs.ErrFailedPrecondition.
	Run(ctx context.Context, layers []string, c Command, log io.Writer, freeze func(ctx context.Context, upper string) error) error
}

// Request is one Dockerfile build.
type Request struct {
	Name string
	// Dockerfile is the Dockerfile's path inside the context.
	Dockerfile string
	// Context is the build context directory.
	Context   string
	BuildArgs map[string]string
	NoCache   bool
	// Start overrides the start command (CMD/ENTRYPOINT) and sets the
	// ready check.
	Start template.StartOptions
	// Plan, when set, is the build's steps (E2B's template builder makes
	// them); Dockerfile is then only named in the template's source.
	Plan *Plan
	// PreferUser, when the base has this account, is the user steps run
	// as (and its home the working directory) until a step sets another:
	// E2B's templates run their steps as "user" in /home/user.
	PreferUser string
}

// StepError is a build that failed at a step: Line is the step's line (of
// the Dockerfile, or the step's number in a Plan), 0 for FROM of a Plan.
type StepError struct {
	Line int
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// RunAs is a RUN as a given user without changing the build's user (E2B's
// runCmd with a user), which a Dockerfile cannot say.
type RunAs struct {
	Shell string
	// User is "" for the build's current user.
	User string
}

// Name is the instruction's name in logs and errors.
func (*RunAs) Name() string { return "run" }

// Location is none: a RunAs has no Dockerfile line.
func (*RunAs) Location() []parser.Range { return nil }

// state is what the instructions so far have set.
type state struct {
	env        []string // KEY=VALUE, in order
	args       map[string]string
	user       string
	workdir    string
	entrypoint []string
	cmd        []string
	// startSet: the Dockerfile set CMD or ENTRYPOINT itself.
	startSet bool
}

func (s *state) getenv() shell.EnvGetter {
	all := make([]string, 0, len(s.args)+len(s.env))
	for _, k := range slices.Sorted(maps.Keys(s.args)) {
		all = append(all, k+"="+s.args[k])
	}
	return shell.EnvsFromSlice(append(all, s.env...))
}

func (s *state) setenv(k, v string) {
	s.env = slices.DeleteFunc(s.env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
	s.env = append(s.env, k+"="+v)
}

// describe is the state that a RUN's result depends on, for its key.
func (s *state) describe() string {
	return fmt.Sprintf("env=%q args=%q user=%q workdir=%q", s.env, s.args, s.user, s.workdir)
}

// Build runs the Dockerfile build req and makes template req.Name.
func Build(ctx context.Context, st Store, run Runner, req Request, log io.Writer) (template.Template, error) {
	if err := template.ValidName(req.Name); err != nil {
		return template.Template{}, err
	}
	if err := req.Start.Validate(); err != nil {
		return template.Template{}, err
	}
	bctx, err := OpenContext(req.Context)
	if err != nil {
		return template.Template{}, err
	}
	defer bctx.Close()
	dfPath := cleanRel(req.Dockerfile)
	plan := req.Plan
	if plan == nil {
		f, err := bctx.root.Open(dfPath)
		if err != nil {
			return template.Template{}, fmt.Errorf("dockerfile %s: %v: %w", req.Dockerfile, err, errdefs.ErrInvalidArgument)
		}
		plan, err = Parse(f)
		f.Close()
		if err != nil {
			return template.Template{}, err
		}
	}
	lex := shell.NewLex('\\')
	meta := map[string]string{}
	for _, a := range plan.MetaArgs {
		for _, kv := range a.Args {
			if v, ok := req.BuildArgs[kv.Key]; ok {
				meta[kv.Key] = v
			} else if kv.Value != nil {
				meta[kv.Key] = *kv.Value
			}
		}
	}
	release := st.HoldLayers()
	defer release()
	start := time.Now()
	b := &builder{st: st, run: run, req: req, bctx: bctx, lex: lex, meta: meta, log: log, done: map[string]*stageResult{}}
	stages := append(slices.Clone(plan.Prior), plan)
	for _, sp := range stages {
		b.total += len(sp.Steps) + 1
	}
	if req.NoCache {
		b.nonce = randNonce()
	}
	var res *stageResult
	for i, sp := range stages {
		if res, err = b.stage(ctx, sp); err != nil {
			return template.Template{}, err
		}
		b.done[strconv.Itoa(i)] = res
		if sp.Name != "" {
			b.done[strings.ToLower(sp.Name)] = res
		}
	}
	s, layers, baseSrc := res.s, res.layers, res.baseSrc
	d := template.Defaults{Env: s.env, Workdir: s.workdir, User: s.user, Command: append(slices.Clone(s.entrypoint), s.cmd...)}
	if d.Workdir == "" {
		d.Workdir = "/"
	}
	opts := req.Start
	if opts.Cmd == "" && s.startSet {
		opts.FromImage = true
	}
	if err := opts.ApplyTo(&d); err != nil {
		return template.Template{}, err
	}
	rec := template.BuildRecord{
		Name: req.Name, Description: "from Dockerfile on " + baseSrc, Layers: layers, Defaults: d,
		Source: "dockerfile " + path.Base(dfPath) + " from " + baseSrc,
	}
	what := path.Base(dfPath)
	if req.Plan != nil {
		// A plan's builds name themselves in req.Dockerfile ("e2b build ID").
		what = req.Dockerfile
		rec.Description = "from " + what + " on " + baseSrc
		rec.Source = what + " from " + baseSrc
	}
	t, err := st.PutBuilt(ctx, rec)
	if err != nil {
		return template.Template{}, err
	}
	fmt.Fprintf(log, "==> template %s built from %s in %s (%d layers)\n", req.Name, what, time.Since(start).Round(time.Millisecond), len(layers))
	return t, nil
}

// runStep is a RUN of argv as user: the command and its key.
func runStep(s *state, parent, nonce string, argv []string, user string) (*Command, string) {
	env := map[string]string{}
	for k, v := range s.args {
		env[k] = v
	}
	for _, kv := range s.env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	what := fmt.Sprintf("run %q %s", argv, s.describe())
	if user != s.user {
		what += fmt.Sprintf(" as=%q", user)
	}
	return &Command{Argv: argv, Env: env, User: user, Cwd: s.workdir}, stepKey(parent, what, nonce)
}

// copyStep is a COPY/ADD: its key covers the files it reads.
func copyStep(st Store, bctx *BuildContext, parent, nonce string, srcs []string, dest, chown, chmod string, s *state, layers []string) (string, func(context.Context, string) error, error) {
	if !path.IsAbs(dest) {
		wd := s.workdir
		if wd == "" {
			wd = "/"
		}
		trail := strings.HasSuffix(dest, "/") || dest == "." || dest == "./"
		dest = path.Join(wd, dest)
		if trail {
			dest += "/"
		}
	}
	es, err := bctx.plan(srcs, dest)
	if err != nil {
		return "", nil, err
	}
	sum, err := bctx.hash(es)
	if err != nil {
		return "", nil, err
	}
	uid, gid, err := chownIDs(chown, st, layers)
	if err != nil {
		return "", nil, err
	}
	mode, err := parseChmod(chmod)
	if err != nil {
		return "", nil, err
	}
	base := st.UIDBase()
	what := fmt.Sprintf("copy %s %d:%d", sum, uid, gid)
	if mode != 0 {
		what += fmt.Sprintf(" mode=%v", mode)
	}
	key := stepKey(parent, what, nonce)
	attrs := stackAttrs(st, slices.Clone(layers))
	return key, func(_ context.Context, dir string) error {
		return bctx.copyTo(es, dir, int(base+uid), int(base+gid), attrs, int(base), mode)
	}, nil
}

// parseChmod reads an octal --chmod (0 when unset).
func parseChmod(chmod string) (fs.FileMode, error) {
	if chmod == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(chmod, 8, 32)
	if err != nil || n > 0o7777 || n == 0 {
		return 0, fmt.Errorf("--chmod=%s: want an octal mode from 1 to 7777: %w", chmod, errdefs.ErrInvalidArgument)
	}
	mode := fs.FileMode(n & 0o777)
	for bit, m := range map[uint64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if n&bit != 0 {
			mode |= m
		}
	}
	return mode, nil
}

// homeOf is user's home directory in the stack's /etc/passwd, if it has
// the account.
func homeOf(user string, st Store, layers []string) (string, bool) {
	for j := len(layers) - 1; j >= 0; j-- {
		r, err := os.OpenRoot(st.SharedLayerDir(layers[j]))
		if err != nil {
			continue
		}
		b, err := r.ReadFile("etc/passwd")
		r.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) >= 6 && f[0] == user {
				return f[5], true
			}
		}
		return "", false
	}
	return "", false
}

// chownIDs resolves --chown=user[:group] (names from the stack's
// /etc/passwd and /etc/group, or numbers).
func chownIDs(chown string, st Store, layers []string) (uint32, uint32, error) {
	if chown == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(chown, ":")
	uid, err := lookupID(u, "etc/passwd", st, layers)
	if err != nil {
		return 0, 0, err
	}
	gid := uid
	if hasGroup {
		if gid, err = lookupID(g, "etc/group", st, layers); err != nil {
			return 0, 0, err
		}
	}
	if uid > 65535 || gid > 65535 {
		return 0, 0, fmt.Errorf("--chown=%s: ids above 65535: %w", chown, errdefs.ErrInvalidArgument)
	}
	return uid, gid, nil
}

func lookupID(name, file string, st Store, layers []string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	for j := len(layers) - 1; j >= 0; j-- {
		r, err := os.OpenRoot(st.SharedLayerDir(layers[j]))
		if err != nil {
			continue
		}
		b, err := r.ReadFile(file)
		r.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) >= 3 && f[0] == name {
				if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					return uint32(n), nil
				}
			}
		}
		break
	}
	return 0, fmt.Errorf("--chown: %q is not in the image's /%s: %w", name, file, errdefs.ErrInvalidArgument)
}

// existsIn reports whether p exists in the stack (topmost layer first; a
// whiteout hides it).
func existsIn(st Store, layers []string, p string) bool {
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if rel == "" {
		return true
	}
	for j := len(layers) - 1; j >= 0; j-- {
		r, err := os.OpenRoot(st.SharedLayerDir(layers[j]))
		if err != nil {
			continue
		}
		fi, err := r.Lstat(rel)
		r.Close()
		if err == nil {
			return fi.Mode()&fs.ModeCharDevice == 0
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return true // something is there that we cannot walk (a symlink): leave it
		}
	}
	return false
}

// stackAttrs looks directories up in the stack, topmost layer first.
func stackAttrs(st Store, layers []string) DirAttrs {
	return func(rel string) (int, int, fs.FileMode, bool) {
		for j := len(layers) - 1; j >= 0; j-- {
			r, err := os.OpenRoot(st.SharedLayerDir(layers[j]))
			if err != nil {
				continue
			}
			fi, err := r.Lstat(rel)
			r.Close()
			if err != nil {
				continue
			}
			sys, ok := fi.Sys().(*syscall.Stat_t)
			if !fi.IsDir() || !ok {
				return 0, 0, 0, false
			}
			return int(sys.Uid), int(sys.Gid), fi.Mode(), true
		}
		return 0, 0, 0, false
	}
}

func dirs(st Store, layers []string) []string {
	out := make([]string, len(layers))
	for i, l := range layers {
		out[i] = st.SharedLayerDir(l)
	}
	return out
}

func shellForm(cmdline []string, prependShell bool) []string {
	if prependShell {
		return []string{"/bin/sh", "-c", strings.Join(cmdline, " ")}
	}
	return slices.Clone(cmdline)
}

// stepKey is a step's cache key: its parent's key and what it does.
func stepKey(parent, what, nonce string) string {
	sum := sha256.Sum256([]byte(parent + "\x00" + what + "\x00" + nonce))
	return hex.EncodeToString(sum[:])
}

func randNonce() string { return rand.Text() }
