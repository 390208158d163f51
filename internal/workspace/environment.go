// Package workspace owns task workspaces: the environment file
// (.berth/environment.yaml) with its format, its strict line-numbered
// validation and the cache key of an environment built from it, and the
// Service that turns a repository at a commit into a ready sandbox through
// the Manager's setup hook. The file says how a repository becomes a ready
// sandbox: the base template, the setup steps and what they may reach, the
// variables and secrets they see, the resources, and the narrower network
// policy of the agent phase.
package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/secret"
	"github.com/berth-sandbox/berth/internal/units"
)

// DefaultPath is where a repository keeps its environment file.
const DefaultPath = ".berth/environment.yaml"

// MaxSize bounds an environment file.
const MaxSize = 256 << 10

// Environment is a parsed environment file:
//
//	template: base                 # base template (default: the daemon's)
//	isolation: gvisor              # runc or gvisor (default: the template's, then the daemon's)
//	setup:                         # shell steps, run in /workspace in order
//	  - name: deps                 # optional label
//	    run: curl -fsS http://registry.example/pkg.tgz | tar xz
//	  - make build                 # a bare string is a step too
//	env:                           # variables of setup and agent phase
//	  GOFLAGS: -mod=mod
//	secrets: [NPM_TOKEN]           # secret names; setup phase only
//	resources: {cpu: 2, memory: 2G, disk: 4G, timeout: 1h}
//	network:
//	  setup: {mode: allow, allow: [registry.npmjs.org]}
//	  agent: {mode: none}
type Environment struct {
	Template string
	// Isolation is the level the workspace's sandbox runs at ("" = the
	// template's default, then the daemon's); a request naming one wins.
	Isolation string
	Setup     []Step
	Env       map[string]string
	Secrets   []string
	Resources Resources
	// SetupPolicy governs egress while setup runs; AgentPolicy after it.
	SetupPolicy policy.Policy
	AgentPolicy policy.Policy
}

// Step is one setup command, run by bash -e (sh when bash is missing).
type Step struct {
	Name string
	Run  string
	// Line is where the step is in the file, for messages.
	Line int
}

// Label names the step for logs and errors.
func (s Step) Label(i int) string {
	if s.Name != "" {
		return fmt.Sprintf("step %d (%s)", i+1, s.Name)
	}
	return fmt.Sprintf("step %d", i+1)
}

// Resources are the sandbox limits the file asks for; zero means default.
type Resources struct {
	CPUMillis   int64
	MemoryBytes int64
	DiskBytes   int64
	Timeout     time.Duration
}

// Problem is one thing wrong with a file, with where it is.
type Problem struct {
	Line, Column int
	Field        string
	Message      string
}

func (p Problem) String() string {
	loc := ""
	if p.Line > 0 {
		loc = fmt.Sprintf("line %d: ", p.Line)
	}
	if p.Field != "" {
		return loc + p.Field + ": " + p.Message
	}
	return loc + p.Message
}

// ParseError lists every problem found in a file. It is an invalid-argument
// error.
type ParseError struct {
	Problems []Problem
}

func (e *ParseError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "environment file: " + strings.Join(parts, "; ")
}

func (e *ParseError) Unwrap() error { return errdefs.ErrInvalidArgument }

// varName is what a setup variable may be called (the same as a secret:
// secret.ValidName).
var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// parser collects problems while walking the YAML node tree, so one check
// reports everything wrong at once.
type parser struct {
	problems []Problem
}

func (p *parser) add(n *yaml.Node, field, format string, args ...any) {
	pr := Problem{Field: field, Message: fmt.Sprintf(format, args...)}
	if n != nil {
		pr.Line, pr.Column = n.Line, n.Column
	}
	p.problems = append(p.problems, pr)
}

// Parse reads and validates an environment file. Unknown keys, wrong
// types, bad names, sizes, durations and policies are all errors; the
// returned *ParseError lists each with its line.
func Parse(data []byte) (*Environment, error) {
	if len(data) > MaxSize {
		return nil, &ParseError{Problems: []Problem{{Message: fmt.Sprintf("file is %d bytes, over the %d-byte limit", len(data), MaxSize)}}}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &ParseError{Problems: []Problem{yamlProblem(err)}}
	}
	env := &Environment{Env: map[string]string{}}
	if len(doc.Content) == 0 {
		return env, nil // an empty file: no setup, defaults everywhere
	}
	p := &parser{}
	root := doc.Content[0]
	p.mapping(root, "", func(key string, k, v *yaml.Node) {
		switch key {
		case "template":
			if s, ok := p.scalar(v, key); ok {
				if !templateName.MatchString(s) {
					p.add(v, key, "template name %q must match [a-z0-9][a-z0-9_-]{0,62}", s)
				}
				env.Template = s
			}
		case "isolation":
			if s, ok := p.scalar(v, key); ok {
				if !slices.Contains(core.Isolations(), s) {
					p.add(v, key, "isolation %q: want one of %s", s, strings.Join(core.Isolations(), ", "))
				}
				env.Isolation = s
			}
		case "setup":
			env.Setup = p.steps(v)
		case "env":
			p.mapping(v, "env", func(name string, k, v *yaml.Node) {
				if !varName.MatchString(name) {
					p.add(k, "env", "invalid variable name %q", name)
				}
				if s, ok := p.scalar(v, "env."+name); ok {
					env.Env[name] = s
				}
			})
		case "secrets":
			env.Secrets = p.secrets(v)
		case "resources":
			env.Resources = p.resources(v)
		case "network":
			p.mapping(v, "network", func(phase string, k, v *yaml.Node) {
				switch phase {
				case "setup":
					env.SetupPolicy = p.policy(v, "network.setup")
				case "agent":
					env.AgentPolicy = p.policy(v, "network.agent")
				default:
					p.add(k, "network", "unknown key %q (want setup or agent)", phase)
				}
			})
		default:
			p.add(k, "", "unknown key %q (want template, isolation, setup, env, secrets, resources or network)", key)
		}
	})
	for name := range env.Env {
		for _, s := range env.Secrets {
			if s == name {
				p.add(nil, "env", "%q is both a variable and a secret", name)
			}
		}
	}
	if len(p.problems) > 0 {
		return nil, &ParseError{Problems: p.problems}
	}
	return env, nil
}

// yamlProblem turns a yaml.v3 syntax error ("yaml: line 3: ...") into a
// Problem with its line.
func yamlProblem(err error) Problem {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var line int
	if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil {
		if i := strings.IndexByte(msg, ':'); i >= 0 {
			msg = strings.TrimSpace(msg[i+1:])
		}
	}
	return Problem{Line: line, Message: "invalid YAML: " + msg}
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a scalar"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// mapping walks a mapping node's keys in order, flagging duplicates.
func (p *parser) mapping(n *yaml.Node, field string, fn func(key string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return
		}
		p.add(n, field, "want a mapping, got %s", kindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.add(k, field, "keys must be strings")
			continue
		}
		if seen[k.Value] {
			p.add(k, field, "duplicate key %q", k.Value)
			continue
		}
		seen[k.Value] = true
		fn(k.Value, k, v)
	}
}

func (p *parser) scalar(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n, field, "want a string, got %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) list(n *yaml.Node, field string) []*yaml.Node {
	if n.Kind != yaml.SequenceNode {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		p.add(n, field, "want a list, got %s", kindName(n))
		return nil
	}
	return n.Content
}

const maxSteps = 64

func (p *parser) steps(n *yaml.Node) []Step {
	items := p.list(n, "setup")
	if len(items) > maxSteps {
		p.add(n, "setup", "%d steps, at most %d", len(items), maxSteps)
		return nil
	}
	var out []Step
	for i, it := range items {
		field := fmt.Sprintf("setup[%d]", i)
		st := Step{Line: it.Line}
		switch it.Kind {
		case yaml.ScalarNode:
			st.Run, _ = p.scalar(it, field)
		case yaml.MappingNode:
			p.mapping(it, field, func(key string, k, v *yaml.Node) {
				switch key {
				case "name":
					st.Name, _ = p.scalar(v, field+".name")
				case "run":
					st.Run, _ = p.scalar(v, field+".run")
				default:
					p.add(k, field, "unknown key %q (want name or run)", key)
				}
			})
		default:
			p.add(it, field, "want a command or {name, run}, got %s", kindName(it))
			continue
		}
		if strings.TrimSpace(st.Run) == "" {
			p.add(it, field, "run is empty")
		}
		if strings.ContainsRune(st.Run, 0) || strings.ContainsRune(st.Name, 0) {
			p.add(it, field, "contains a NUL byte")
		}
		out = append(out, st)
	}
	return out
}

func (p *parser) secrets(n *yaml.Node) []string {
	var out []string
	seen := map[string]bool{}
	for i, it := range p.list(n, "secrets") {
		field := fmt.Sprintf("secrets[%d]", i)
		s, ok := p.scalar(it, field)
		if !ok {
			continue
		}
		if err := secret.ValidName(s); err != nil {
			p.add(it, field, "invalid secret name %q (want [A-Za-z_][A-Za-z0-9_]{0,63})", s)
			continue
		}
		if seen[s] {
			p.add(it, field, "secret %q listed twice", s)
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

func (p *parser) resources(n *yaml.Node) Resources {
	var r Resources
	p.mapping(n, "resources", func(key string, k, v *yaml.Node) {
		field := "resources." + key
		s, ok := "", false
		if key == "cpu" || key == "memory" || key == "disk" || key == "timeout" {
			if s, ok = p.scalar(v, field); !ok {
				return
			}
		}
		switch key {
		case "cpu":
			cores, err := strconv.ParseFloat(s, 64)
			if err != nil || !(cores > 0 && cores <= 1024) {
				p.add(v, field, "want a number of cores above 0, got %q", s)
				return
			}
			r.CPUMillis = int64(cores * 1000)
		case "memory", "disk":
			b, err := units.ParseSize(s)
			if err != nil || b <= 0 {
				p.add(v, field, "want a size such as 512M or 2G, got %q", s)
				return
			}
			if key == "memory" {
				r.MemoryBytes = b
			} else {
				r.DiskBytes = b
			}
		case "timeout":
			d, err := units.ParseDuration(s)
			if err != nil || d <= 0 {
				p.add(v, field, "want a duration such as 30m, got %q", s)
				return
			}
			r.Timeout = d
		default:
			p.add(k, "resources", "unknown key %q (want cpu, memory, disk or timeout)", key)
		}
	})
	return r
}

// policy checks a policy.Policy node key by key (so an unknown key has
// a line), decodes it and validates it, reporting a bad rule at its line.
func (p *parser) policy(n *yaml.Node, field string) policy.Policy {
	before := len(p.problems)
	entries := map[string]*yaml.Node{}
	p.mapping(n, field, func(key string, k, v *yaml.Node) {
		switch key {
		case "mode", "allow", "deny":
			entries[key] = v
		case "http":
			for i, r := range p.list(v, field+".http") {
				p.mapping(r, fmt.Sprintf("%s.http[%d]", field, i), func(key string, k, v *yaml.Node) {
					if key != "host" && key != "methods" && key != "path" {
						p.add(k, fmt.Sprintf("%s.http[%d]", field, i), "unknown key %q (want host, methods or path)", key)
					}
				})
			}
			entries[key] = v
		default:
			p.add(k, field, "unknown key %q (want mode, allow, deny or http)", key)
		}
	})
	if len(p.problems) > before || n.Kind != yaml.MappingNode {
		return policy.Policy{}
	}
	var pol policy.Policy
	if err := n.Decode(&pol); err != nil {
		p.add(n, field, "%v", err)
		return policy.Policy{}
	}
	if err := pol.Validate(); err != nil {
		at := n
		var re *policy.RuleError
		if errors.As(err, &re) {
			at = ruleNode(entries, re.Field, n)
			p.add(at, field+"."+re.Field, "%q: %v", re.Entry, re.Err)
		} else {
			p.add(at, field, "%v", err)
		}
		return policy.Policy{}
	}
	return pol.Normalize()
}

// ruleNode finds the node of a RuleError field such as "allow[2]".
func ruleNode(entries map[string]*yaml.Node, field string, def *yaml.Node) *yaml.Node {
	name, idx, ok := strings.Cut(field, "[")
	v := entries[name]
	if v == nil {
		return def
	}
	if ok {
		var i int
		if _, err := fmt.Sscanf(idx, "%d]", &i); err == nil && v.Kind == yaml.SequenceNode && i >= 0 && i < len(v.Content) {
			return v.Content[i]
		}
	}
	return v
}

// Key is the identity of a cached environment: everything that shapes the
// filesystem setup leaves behind.
type Key struct {
	Template string
	// TemplateBuilt distinguishes rebuilds of a template of one name.
	TemplateBuilt time.Time
	Repo          string
	Commit        string
	// EnvFile is the environment file's bytes (steps, variables, policy).
	EnvFile []byte
	// Lockfiles are hashes of dependency lockfiles found in the checkout.
	Lockfiles map[string]string
}

// Hash is the key as a short hex string.
func (k Key) Hash() string {
	h := sha256.New()
	fmt.Fprintf(h, "berth-env-v1\x00%s\x00%s\x00%s\x00%s\x00", k.Template, k.TemplateBuilt.UTC().Format(time.RFC3339Nano), k.Repo, k.Commit)
	h.Write(k.EnvFile)
	names := make([]string, 0, len(k.Lockfiles))
	for n := range k.Lockfiles {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(h, "\x00%s=%s", n, k.Lockfiles[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}
