package dockerfile

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/template"
)

// builder is one build's progress through its stages.
type builder struct {
	st    Store
	run   Runner
	req   Request
	bctx  *BuildContext
	lex   *shell.Lex
	meta  map[string]string
	log   io.Writer
	nonce string
	// total and n count the instructions of all stages, for the log.
	total, n int
	// done are the finished stages, by lower-case name and by index.
	done map[string]*stageResult
}

// stageResult is a finished stage: its layers (lowest first), what its
// instructions set, and where its base came from.
type stageResult struct {
	layers  []string
	s       *state
	baseSrc string
}

func (s *state) clone() *state {
	c := *s
	c.env = slices.Clone(s.env)
	c.args = map[string]string{} // ARGs are per stage
	c.entrypoint = slices.Clone(s.entrypoint)
	c.cmd = slices.Clone(s.cmd)
	return &c
}

// stage runs one stage of the build.
func (b *builder) stage(ctx context.Context, sp *Plan) (*stageResult, error) {
	st, req, log, plan := b.st, b.req, b.log, sp
	metaEnv := &state{args: b.meta}
	from, _, err := b.lex.ProcessWord(plan.FromRef, metaEnv.getenv())
	if err != nil || from == "" {
		return nil, &StepError{Line: plan.From.Line, Err: plan.lineError(plan.From.Line, plan.From.Text, fmt.Errorf("base %q: %v", plan.FromRef, err))}
	}
	b.n++
	fmt.Fprintf(log, "#%d/%d [%s] FROM %s\n", b.n, b.total, plan.where(plan.From.Line), from)
	var layers []string
	var s *state
	var baseSrc string
	if prev, ok := b.done[strings.ToLower(from)]; ok {
		// FROM an earlier stage: its layers and what it set.
		layers, s, baseSrc = slices.Clone(prev.layers), prev.s.clone(), prev.baseSrc
	} else {
		var base template.Defaults
		if name, ok := strings.CutPrefix(from, "berth:"); ok {
			layers, base, err = st.ImportLayers(ctx, name)
			baseSrc = "template " + name
		} else {
			layers, base, baseSrc, err = st.PullLayers(ctx, from, log)
		}
		if err != nil {
			return nil, &StepError{Line: plan.From.Line, Err: fmt.Errorf("%s: FROM %s: %w", plan.at(plan.From.Line), from, err)}
		}
		s = &state{env: slices.Clone(base.Env), args: map[string]string{}, user: base.User, workdir: base.Workdir, cmd: base.Command}
		if req.PreferUser != "" {
			if home, ok := homeOf(req.PreferUser, st, layers); ok {
				s.user = req.PreferUser
				if existsIn(st, layers, home) {
					s.workdir = home
				}
			}
		}
	}
	key := "from " + strings.Join(layers, ",")
	nonce := b.nonce
	meta, lex := b.meta, b.lex
	expand := func(word string) (string, error) {
		w, _, err := lex.ProcessWord(word, s.getenv())
		return w, err
	}
	for _, step := range plan.Steps {
		if step.NoCache && nonce == "" {
			// From here on every key is new; later stages too.
			nonce = randNonce()
			b.nonce = nonce
		}
		b.n++
		fmt.Fprintf(log, "#%d/%d [%s] %s\n", b.n, b.total, plan.where(step.Line), shorten(step.Text))
		fail := func(err error) (*stageResult, error) {
			fmt.Fprintf(log, "==> build failed at %s: %v\n", plan.where(step.Line), err)
			return nil, &StepError{Line: step.Line, Err: fmt.Errorf("%s: %s: %w", plan.at(step.Line), shorten(step.Text), err)}
		}
		if e, ok := step.Cmd.(instructions.SupportsSingleWordExpansion); ok {
			if _, isRun := step.Cmd.(*instructions.RunCommand); !isRun {
				if err := e.Expand(expand); err != nil {
					return fail(fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument))
				}
			}
		}
		var layerKey string
		var fill func(ctx context.Context, dir string) error
		var runCmd *Command
		// cleanup releases what a step reads from (a stage's view).
		cleanup := func() {}
		switch c := step.Cmd.(type) {
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				s.setenv(kv.Key, kv.Value)
			}
		case *instructions.ArgCommand:
			for _, kv := range c.Args {
				switch v, ok := req.BuildArgs[kv.Key]; {
				case ok:
					s.args[kv.Key] = v
				case kv.Value != nil:
					s.args[kv.Key] = *kv.Value
				default:
					if v, ok := meta[kv.Key]; ok {
						s.args[kv.Key] = v
					} else {
						s.args[kv.Key] = ""
					}
				}
			}
		case *instructions.UserCommand:
			s.user = c.User
		case *instructions.CmdCommand:
			s.cmd = shellForm(c.CmdLine, c.PrependShell)
			s.startSet = true
		case *instructions.EntrypointCommand:
			s.entrypoint = shellForm(c.CmdLine, c.PrependShell)
			if !s.startSet {
				s.cmd = nil
			}
			s.startSet = true
		case *instructions.LabelCommand, *instructions.ExposeCommand, *instructions.MaintainerCommand:
			fmt.Fprintln(log, "---> noted (no effect on a template)")
		case *instructions.WorkdirCommand:
			wd := c.Path
			if !path.IsAbs(wd) {
				wd = path.Join("/"+strings.TrimPrefix(s.workdir, "/"), wd)
			}
			s.workdir = path.Clean(wd)
			if !existsIn(st, layers, s.workdir) {
				layerKey = stepKey(key, "workdir "+s.workdir, nonce)
				rootID := int(st.UIDBase())
				attrs := stackAttrs(st, slices.Clone(layers))
				wd := s.workdir
				fill = func(_ context.Context, dir string) error {
					r, err := os.OpenRoot(dir)
					if err != nil {
						return err
					}
					defer r.Close()
					return mkParents(r, strings.TrimPrefix(wd, "/"), attrs, rootID)
				}
			}
		case *instructions.CopyCommand:
			src := b.bctx
			if c.From != "" {
				prev, ok := b.done[strings.ToLower(c.From)]
				if !ok {
					err = fmt.Errorf("--from=%s: no earlier stage has that name or number: %w", c.From, errdefs.ErrInvalidArgument)
					break
				}
				var done func()
				if src, done, err = stageContext(prev.layers, st); err != nil {
					break
				}
				cleanup = done
			}
			layerKey, fill, err = copyStep(st, src, key, nonce, c.SourcePaths, c.DestPath, c.Chown, c.Chmod, s, layers)
		case *instructions.AddCommand:
			layerKey, fill, err = copyStep(st, b.bctx, key, nonce, c.SourcePaths, c.DestPath, c.Chown, c.Chmod, s, layers)
		case *instructions.RunCommand:
			runCmd, layerKey = runStep(s, key, nonce, shellForm(c.CmdLine, c.PrependShell), s.user)
		case *RunAs:
			user := c.User
			if user == "" {
				user = s.user
			}
			runCmd, layerKey = runStep(s, key, nonce, []string{"/bin/sh", "-c", c.Shell}, user)
		default:
			err = fmt.Errorf("%s is not supported: %w", step.Cmd.Name(), errdefs.ErrInvalidArgument)
		}
		err = b.layer(ctx, err, layerKey, layers, runCmd, fill)
		cleanup()
		if err != nil {
			return fail(err)
		}
		if layerKey == "" {
			continue
		}
		layers = append(layers, layerKey)
		key = layerKey
	}
	return &stageResult{layers: layers, s: s, baseSrc: baseSrc}, nil
}

// layer makes a step's layer (unless err or the step makes none): from
// the cache, by running its command, or by filling it host-side.
func (b *builder) layer(ctx context.Context, err error, layerKey string, layers []string, runCmd *Command, fill func(context.Context, string) error) error {
	if err != nil || layerKey == "" {
		return err
	}
	st, log := b.st, b.log
	if _, ok := st.StepLayer(layerKey); ok {
		fmt.Fprintln(log, "---> CACHED")
	} else if runCmd != nil {
		stepStart := time.Now()
		err := b.run.Run(ctx, dirs(st, layers), *runCmd, log, func(ctx context.Context, upper string) error {
			_, err := st.AddStepLayer(ctx, layerKey, func(dir string) error {
				if err := os.Remove(dir); err != nil {
					return err
				}
				return st.FreezeInto(ctx, upper, dir)
			})
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(log, "---> done in %s\n", time.Since(stepStart).Round(time.Millisecond))
	} else {
		if _, err := st.AddStepLayer(ctx, layerKey, func(dir string) error { return fill(ctx, dir) }); err != nil {
			return err
		}
		fmt.Fprintln(log, "---> done")
	}
	return nil
}

// stageContext is a read-only view of a finished stage's files, for COPY
// --from: the layer itself when there is one, else an overlay of them
// mounted for the step (done unmounts it). .dockerignore does not apply.
func stageContext(layers []string, st Store) (*BuildContext, func(), error) {
	dirs := dirs(st, layers)
	if len(dirs) == 1 {
		r, err := os.OpenRoot(dirs[0])
		if err != nil {
			return nil, nil, err
		}
		return &BuildContext{root: r}, func() { r.Close() }, nil
	}
	mnt, err := os.MkdirTemp("", "berth-stage-")
	if err != nil {
		return nil, nil, err
	}
	slices.Reverse(dirs) // overlay's lowerdir lists the top first
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "lowerdir="+strings.Join(dirs, ":")); err != nil {
		os.Remove(mnt)
		return nil, nil, fmt.Errorf("mount the stage's layers: %w", err)
	}
	r, err := os.OpenRoot(mnt)
	done := func() {
		if r != nil {
			r.Close()
		}
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		os.Remove(mnt)
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	return &BuildContext{root: r}, done, nil
}
