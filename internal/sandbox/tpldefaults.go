package sandbox

import (
	"strings"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/template"
)

// A template made from an image carries the image's ENV, WORKDIR and USER
// as defaults. They rank above Berth's own defaults (PATH, LANG) and below
// what the create request says; BERTH_* stays Berth's.

// withTemplateArgs adds the template's default user (unless the request
// named one) and working directory to the agent's arguments.
func withTemplateArgs(args []string, rec core.Sandbox, d template.Defaults) []string {
	if rec.User == "" && d.User != "" {
		args = append(args, "--user", d.User)
	}
	if d.Workdir != "" {
		args = append(args, "--cwd", d.Workdir)
	}
	return args
}

// withWorkdir makes dir the agent's default working directory; it comes
// after the template's, and the agent takes the last --cwd.
func withWorkdir(args []string, dir string) []string {
	if dir == "" {
		return args
	}
	return append(args, "--cwd", dir)
}

// withTemplateEnv merges the template's environment into env (the agent's
// KEY=VALUE list): a template value replaces a Berth default of the same
// key, and is dropped where the request set the key.
func withTemplateEnv(env []string, rec core.Sandbox, d template.Defaults) []string {
	if len(d.Env) == 0 {
		return env
	}
	vals := map[string]string{}
	var order []string
	for _, kv := range d.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" || strings.HasPrefix(k, "BERTH_") {
			continue
		}
		if _, set := rec.Env[k]; set {
			continue
		}
		if _, dup := vals[k]; !dup {
			order = append(order, k)
		}
		vals[k] = v
	}
	out := make([]string, 0, len(env)+len(order))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := vals[k]; ok {
			out = append(out, k+"="+v)
			delete(vals, k)
			continue
		}
		out = append(out, kv)
	}
	for _, k := range order {
		if v, ok := vals[k]; ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}
