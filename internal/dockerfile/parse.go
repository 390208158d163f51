// Package dockerfile builds templates from Dockerfiles: it parses them with
// BuildKit's parser (github.com/moby/buildkit/frontend/dockerfile), checks
// every instruction up front (a bad one fails the build with its line
// number, invalid_argument), reads the build context confined to its
// directory and honouring .dockerignore, and runs the steps: RUN inside a
// build sandbox under Berth's own isolation, COPY/ADD host-side into a new
// layer, the rest as template defaults. Each step's layer is cached under
// a key of its parent, its instruction and the hashes of what it reads.
// In a multi-stage Dockerfile every stage is built the same way; a later
// stage may build FROM an earlier one or COPY --from it (its files read
// through a read-only overlay of its layers); the last stage is the
// template.
package dockerfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/berth-sandbox/berth/errdefs"
)

// MaxDockerfile bounds a Dockerfile's size.
const MaxDockerfile = 1 << 20

// Plan is a parsed, checked Dockerfile of one stage.
type Plan struct {
	// MetaArgs are the ARGs before FROM (they may be used in FROM).
	MetaArgs []*instructions.ArgCommand
	From     Step // *instructions.Stage is not a command; From.Text is its line
	// FromRef is FROM's image reference, before ARG expansion.
	FromRef string
	Steps   []Step
	// Unit names what Step.Line counts in logs and errors: "" for a
	// Dockerfile's lines, "step" for a Plan made of steps.
	Unit string
	// Name is the stage's name (FROM ... AS name), if any.
	Name string
	// Prior are the stages before this one, the last stage (a
	// multi-stage Dockerfile's earlier ones, which later stages may
	// COPY --from or build FROM).
	Prior []*Plan
}

// where is a step's place as the build log shows it ("line 3", "step 3").
func (p *Plan) where(line int) string {
	if p.Unit == "" {
		return fmt.Sprintf("line %d", line)
	}
	return fmt.Sprintf("%s %d", p.Unit, line)
}

// at prefixes a step's errors ("dockerfile line 3", "step 3").
func (p *Plan) at(line int) string {
	if p.Unit == "" {
		return fmt.Sprintf("dockerfile line %d", line)
	}
	return p.where(line)
}

func (p *Plan) lineError(line int, text string, err error) error {
	if p.Unit == "" {
		return lineError(line, text, err)
	}
	return fmt.Errorf("%s: %s: %v: %w", p.at(line), shorten(text), err, errdefs.ErrInvalidArgument)
}

// Step is one instruction with where it is.
type Step struct {
	Line int
	// Text is the instruction as written (continuations joined).
	Text string
	Cmd  instructions.Command
	// NoCache rebuilds this step and every one after it, wherever the
	// cache has them (E2B's skipCache() from a point of the template
	// on); the steps before still come from the cache.
	NoCache bool
}

// LineError is a bad instruction: invalid_argument, naming the line.
func lineError(line int, text string, err error) error {
	return fmt.Errorf("dockerfile line %d: %s: %v: %w", line, shorten(text), err, errdefs.ErrInvalidArgument)
}

func shorten(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// Parse reads and checks a Dockerfile. Errors are ErrInvalidArgument,
// naming the line and instruction.
func Parse(r io.Reader) (*Plan, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxDockerfile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxDockerfile {
		return nil, fmt.Errorf("dockerfile is larger than %d bytes: %w", MaxDockerfile, errdefs.ErrInvalidArgument)
	}
	res, err := parser.Parse(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("dockerfile: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	p := &Plan{}
	var prior []*Plan
	names := map[string]bool{}
	var metaArgs []*instructions.ArgCommand
	seenFrom := false
	for _, n := range res.AST.Children {
		text := n.Original
		parsed, err := instructions.ParseInstruction(n)
		if err != nil {
			return nil, lineError(n.StartLine, text, err)
		}
		if st, ok := parsed.(*instructions.Stage); ok {
			if st.Platform != "" {
				return nil, lineError(n.StartLine, text, errors.New("FROM --platform is not supported (the host's platform is used)"))
			}
			if seenFrom {
				prior = append(prior, p)
				p = &Plan{}
			}
			if st.Name != "" {
				name := strings.ToLower(st.Name)
				if names[name] {
					return nil, lineError(n.StartLine, text, fmt.Errorf("stage name %q is used twice", st.Name))
				}
				names[name] = true
			}
			seenFrom = true
			p.From = Step{Line: n.StartLine, Text: text}
			p.FromRef = st.BaseName
			p.Name = st.Name
			continue
		}
		cmd, ok := parsed.(instructions.Command)
		if !ok {
			return nil, lineError(n.StartLine, text, errors.New("not an instruction"))
		}
		step := Step{Line: n.StartLine, Text: text, Cmd: cmd}
		if !seenFrom {
			a, ok := cmd.(*instructions.ArgCommand)
			if !ok {
				return nil, lineError(n.StartLine, text, errors.New("only ARG may come before FROM"))
			}
			metaArgs = append(metaArgs, a)
			continue
		}
		if err := check(cmd); err != nil {
			return nil, lineError(n.StartLine, text, err)
		}
		if c, ok := cmd.(*instructions.CopyCommand); ok && c.From != "" {
			// Only earlier stages, by name or number: an image named in
			// --from would be pulled behind the build's back.
			idx, err := strconv.Atoi(c.From)
			if !names[strings.ToLower(c.From)] && (err != nil || idx < 0 || idx >= len(prior)) {
				return nil, lineError(n.StartLine, text, fmt.Errorf("COPY --from=%s: no earlier stage has that name or number (copying from an image is not supported)", c.From))
			}
			if strings.EqualFold(c.From, p.Name) {
				return nil, lineError(n.StartLine, text, fmt.Errorf("COPY --from=%s: a stage cannot copy from itself", c.From))
			}
		}
		p.Steps = append(p.Steps, step)
	}
	if !seenFrom {
		return nil, fmt.Errorf("dockerfile has no FROM: %w", errdefs.ErrInvalidArgument)
	}
	p.MetaArgs = metaArgs
	p.Prior = prior
	return p, nil
}

// check refuses what the builder does not do, so a build never fails
// half-way on an instruction it could have refused at once.
func check(cmd instructions.Command) error {
	switch c := cmd.(type) {
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			return fmt.Errorf("RUN flags (--%s) are not supported", strings.Join(c.FlagsUsed, ", --"))
		}
		if len(c.Files) > 0 {
			return errors.New("heredocs are not supported")
		}
	case *instructions.CopyCommand:
		if c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
			return errors.New("COPY --link, --parents and --exclude are not supported")
		}
		return checkSources(c.SourcesAndDest, c.Chmod)
	case *instructions.AddCommand:
		if c.Link || len(c.ExcludePatterns) > 0 || c.Checksum != "" || c.KeepGitDir {
			return errors.New("ADD --link, --exclude, --checksum and --keep-git-dir are not supported")
		}
		for _, s := range c.SourcePaths {
			if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
				return fmt.Errorf("ADD of a URL (%s) is not supported: builds read only their context", s)
			}
		}
		return checkSources(c.SourcesAndDest, c.Chmod)
	case *instructions.EnvCommand, *instructions.ArgCommand, *instructions.WorkdirCommand, *instructions.UserCommand,
		*instructions.CmdCommand, *instructions.EntrypointCommand, *instructions.LabelCommand, *instructions.ExposeCommand,
		*instructions.MaintainerCommand:
	default:
		return fmt.Errorf("%s is not supported", strings.ToUpper(cmd.Name()))
	}
	return nil
}

func checkSources(s instructions.SourcesAndDest, chmod string) error {
	if len(s.SourceContents) > 0 {
		return errors.New("heredocs are not supported")
	}
	if chmod != "" {
		if _, err := parseChmod(chmod); err != nil {
			return err
		}
	}
	return nil
}
