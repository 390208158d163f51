package workspace

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/policy"
)

const full = `template: base
isolation: gvisor
setup:
  - name: deps
    run: curl -fsS http://registry.test/pkg -o /tmp/pkg
  - make build
env:
  GOFLAGS: -mod=mod
secrets: [NPM_TOKEN]
resources: {cpu: 1.5, memory: 1G, disk: 2G, timeout: 30m}
network:
  setup: {mode: allow, allow: [registry.test]}
  agent: {mode: none}
`

func TestParseFull(t *testing.T) {
	env, err := Parse([]byte(full))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if env.Template != "base" || len(env.Setup) != 2 || env.Setup[0].Name != "deps" || env.Setup[1].Run != "make build" {
		t.Errorf("template/setup = %q %+v", env.Template, env.Setup)
	}
	if env.Setup[0].Line != 4 || env.Setup[1].Line != 6 {
		t.Errorf("step lines = %d, %d, want 4, 6", env.Setup[0].Line, env.Setup[1].Line)
	}
	if env.Isolation != "gvisor" {
		t.Errorf("isolation = %q, want gvisor", env.Isolation)
	}
	if env.Env["GOFLAGS"] != "-mod=mod" || len(env.Secrets) != 1 || env.Secrets[0] != "NPM_TOKEN" {
		t.Errorf("env/secrets = %v %v", env.Env, env.Secrets)
	}
	want := Resources{CPUMillis: 1500, MemoryBytes: 1 << 30, DiskBytes: 2 << 30, Timeout: 30 * time.Minute}
	if env.Resources != want {
		t.Errorf("resources = %+v, want %+v", env.Resources, want)
	}
	if env.SetupPolicy.Mode != policy.ModeAllow || len(env.SetupPolicy.Allow) != 1 || env.AgentPolicy.Mode != policy.ModeNone {
		t.Errorf("policies = %+v %+v", env.SetupPolicy, env.AgentPolicy)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, in := range []string{"", "# nothing\n", "{}"} {
		env, err := Parse([]byte(in))
		if err != nil || len(env.Setup) != 0 {
			t.Errorf("Parse(%q) = %+v, %v; want empty environment", in, env, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // substrings of the error, in order
	}{
		{"unknown top key", "template: base\nsetpu: []\n", []string{`line 2: unknown key "setpu"`}},
		{"unknown isolation", "isolation: kata\n", []string{`line 1: isolation: isolation "kata": want one of runc, gvisor`}},
		{"isolation not a string", "isolation: [gvisor]\n", []string{`line 1: isolation`}},
		{"bad yaml", "setup:\n  - a\n - b\n", []string{"line 2", "invalid YAML"}},
		{"step unknown key", "setup:\n  - name: x\n    command: y\n", []string{`line 3: setup[0]: unknown key "command"`, "line 2: setup[0]: run is empty"}},
		{"step wrong type", "setup: make\n", []string{"line 1: setup: want a list"}},
		{"bad secret", "secrets: [ok, 9bad]\n", []string{`line 1: secrets[1]: invalid secret name "9bad"`}},
		{"dup secret", "secrets:\n  - A\n  - A\n", []string{"line 3: secrets[1]: secret \"A\" listed twice"}},
		{"bad env name", "env:\n  BAD-NAME: x\n", []string{`line 2: env: invalid variable name "BAD-NAME"`}},
		{"bad memory", "resources:\n  memory: lots\n", []string{"line 2: resources.memory"}},
		{"bad cpu", "resources:\n  cpu: -1\n", []string{"line 2: resources.cpu"}},
		{"bad timeout", "resources:\n  timeout: soon\n", []string{"line 2: resources.timeout"}},
		{"resource unknown", "resources:\n  gpus: 1\n", []string{`line 2: resources: unknown key "gpus"`}},
		{"policy unknown key", "network:\n  setup:\n    mode: allow\n    alow: [x.test]\n", []string{`line 4: network.setup: unknown key "alow"`}},
		{"policy bad mode", "network:\n  agent:\n    mode: wide\n", []string{"line 3: network.agent.mode"}},
		{"policy bad rule", "network:\n  setup:\n    mode: allow\n    allow:\n      - ok.test\n      - 'bad host!'\n", []string{"line 6: network.setup.allow[1]"}},
		{"network phase", "network:\n  build: {}\n", []string{`line 2: network: unknown key "build"`}},
		{"bad template", "template: Base!\n", []string{"line 1: template"}},
		{"dup key", "template: base\ntemplate: minimal\n", []string{`line 2: duplicate key "template"`}},
		{"secret and var", "env: {A: x}\nsecrets: [A]\n", []string{`"A" is both a variable and a secret`}},
		{"not a mapping", "- a\n- b\n", []string{"line 1: want a mapping"}},
		{"too many errors together", "templat: x\nsecrets: [1a]\n", []string{"line 1:", "line 2:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatalf("Parse(%q) succeeded, want an error", tt.in)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Parse(%q) = %v, want ErrInvalidArgument", tt.in, err)
			}
			msg := err.Error()
			for _, w := range tt.want {
				i := strings.Index(msg, w)
				if i < 0 {
					t.Fatalf("Parse(%q) = %q, want it to contain %q", tt.in, msg, w)
				}
				msg = msg[i+len(w):]
			}
		})
	}
}

func TestKeyHash(t *testing.T) {
	base := Key{Template: "base", Repo: "file:///r", Commit: "abc", EnvFile: []byte("setup: [x]")}
	same := base
	same.Lockfiles = map[string]string{}
	if base.Hash() != same.Hash() {
		t.Errorf("equal keys hash differently")
	}
	for _, k := range []Key{
		{Template: "minimal", Repo: base.Repo, Commit: base.Commit, EnvFile: base.EnvFile},
		{Template: "base", Repo: base.Repo, Commit: "abd", EnvFile: base.EnvFile},
		{Template: "base", Repo: base.Repo, Commit: base.Commit, EnvFile: []byte("setup: [y]")},
		{Template: "base", Repo: base.Repo, Commit: base.Commit, EnvFile: base.EnvFile, Lockfiles: map[string]string{"go.sum": "1"}},
	} {
		if k.Hash() == base.Hash() {
			t.Errorf("key %+v hashes like %+v", k, base)
		}
	}
}
