package sandbox

import (
	"slices"
	"testing"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/template"
)

func TestWithTemplateDefaults(t *testing.T) {
	rec := core.Sandbox{Env: map[string]string{"FOO": "request"}}
	base := []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "BERTH_SANDBOX=true", "FOO=request", "BERTH_AGENT_TOKEN=t"}
	d := template.Defaults{Env: []string{"PATH=/opt/bin:/bin", "FOO=image", "BAR=image", "BERTH_SANDBOX=false"}, Workdir: "/work", User: "app"}
	got := withTemplateEnv(base, rec, d)
	want := []string{"PATH=/opt/bin:/bin", "LANG=C.UTF-8", "BERTH_SANDBOX=true", "FOO=request", "BERTH_AGENT_TOKEN=t", "BAR=image"}
	if !slices.Equal(got, want) {
		t.Errorf("withTemplateEnv = %q, want %q", got, want)
	}
	if args := withTemplateArgs([]string{"--listen", "x"}, rec, d); !slices.Equal(args, []string{"--listen", "x", "--user", "app", "--cwd", "/work"}) {
		t.Errorf("withTemplateArgs = %q", args)
	}
	rec.User = "root" // the request's user wins
	if args := withTemplateArgs(nil, rec, d); !slices.Equal(args, []string{"--cwd", "/work"}) {
		t.Errorf("withTemplateArgs with a request user = %q", args)
	}
}
