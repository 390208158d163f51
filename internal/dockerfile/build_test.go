package dockerfile

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/internal/template"
)

// memStore is a layer store in a temporary directory: step layers by key,
// one base layer.
type memStore struct {
	dir  string
	keys map[string]string
}

func (m *memStore) UIDBase() uint32 { return 100000 }
func (m *memStore) StepLayer(key string) (string, bool) {
	id, ok := m.keys[key]
	return id, ok
}
func (m *memStore) SharedLayerDir(id string) string { return filepath.Join(m.dir, id) }
func (m *memStore) AddStepLayer(_ context.Context, key string, fill func(dir string) error) (string, error) {
	id := "layer" + string(rune('a'+len(m.keys)))
	dir := m.SharedLayerDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := fill(dir); err != nil {
		return "", err
	}
	m.keys[key] = id
	return id, nil
}
func (m *memStore) FreezeInto(_ context.Context, _, dir string) error { return os.MkdirAll(dir, 0o755) }
func (m *memStore) ImportLayers(context.Context, string) ([]string, template.Defaults, error) {
	return []string{"base"}, template.Defaults{Workdir: "/"}, os.MkdirAll(m.SharedLayerDir("base"), 0o755)
}
func (m *memStore) PullLayers(context.Context, string, io.Writer) ([]string, template.Defaults, string, error) {
	panic("no pulls here")
}
func (m *memStore) HoldLayers() func() { return func() {} }
func (m *memStore) PutBuilt(_ context.Context, r template.BuildRecord) (template.Template, error) {
	return template.Template{Name: r.Name, Built: true}, nil
}

// ranRunner records the commands it ran.
type ranRunner struct{ ran []string }

func (r *ranRunner) Run(ctx context.Context, _ []string, c Command, _ io.Writer, freeze func(context.Context, string) error) error {
	r.ran = append(r.ran, c.Argv[len(c.Argv)-1])
	return freeze(ctx, "")
}

// TestStepNoCache: a step marked NoCache (E2B's skipCache()) and every one
// after it run again; those before come from the cache. Request.NoCache
// runs them all.
func TestStepNoCache(t *testing.T) {
	st := &memStore{dir: t.TempDir(), keys: map[string]string{}}
	run := &ranRunner{}
	plan := func(skipFrom int) *Plan {
		p := &Plan{Unit: "step", FromRef: "berth:base", From: Step{Text: "FROM berth:base"}}
		for i, c := range []string{"one", "two", "three"} {
			p.Steps = append(p.Steps, Step{Line: i + 1, Text: "RUN " + c, Cmd: &RunAs{Shell: c}, NoCache: skipFrom > 0 && i+1 >= skipFrom})
		}
		return p
	}
	build := func(p *Plan, noCache bool) []string {
		t.Helper()
		run.ran = nil
		var log strings.Builder
		if _, err := Build(t.Context(), st, run, Request{Name: "app", Context: t.TempDir(), Plan: p, NoCache: noCache}, &log); err != nil {
			t.Fatalf("build: %v\n%s", err, log.String())
		}
		return run.ran
	}
	for _, tc := range []struct {
		name     string
		skipFrom int
		noCache  bool
		want     string
	}{
		{"first build", 0, false, "one two three"},
		{"again", 0, false, ""},
		{"skipCache from step 2", 2, false, "two three"},
		{"skipCache from step 3", 3, false, "three"},
		{"the build's own no-cache", 0, true, "one two three"},
		{"the plain build, still cached", 0, false, ""},
	} {
		if got := strings.Join(build(plan(tc.skipFrom), tc.noCache), " "); got != tc.want {
			t.Errorf("%s: ran %q, want %q", tc.name, got, tc.want)
		}
	}
}
