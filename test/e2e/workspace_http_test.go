package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// httpRepoEnv is the environment file of the repository served over
// HTTP: setup installs a tool from the stand-in registry, and the agent
// phase may reach allowed.test only (neither the registry nor git.test).
const httpRepoEnv = `template: base
setup:
  - name: install tool
    run: |
      curl -fsS -o /usr/local/bin/tool http://registry.test/pkg/tool-1.0.sh
      chmod 755 /usr/local/bin/tool
network:
  setup: {mode: allow, allow: [registry.test, git.test]}
  agent: {mode: allow, allow: [allowed.test]}
`

// commitAll commits everything in dir and returns the new head.
func commitAll(t *testing.T, dir, msg string) string {
	t.Helper()
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("add", "-A")
	git("commit", "-q", "-m", msg)
	return git("rev-parse", "HEAD")
}

func TestWorkspaceHTTP(t *testing.T) {
	harness.RequireHost(t)
	tn := harness.StartTestNet(t)
	d := StartDaemon(t, tn.ConfigFile(t)...)
	requireBase(t, d)
	ctx := t.Context()

	tn.ServeFiles("registry.test", map[string][]byte{"/pkg/tool-1.0.sh": []byte("#!/bin/sh\necho tool 1.0\n")})
	gs := tn.StartGitServer(t, "git.test")
	dir, first := makeRepo(t, map[string]string{"README": "one\n", ".berth/environment.yaml": httpRepoEnv})
	writeTree(t, dir, map[string]string{"README": "two\n"})
	second := commitAll(t, dir, "second")
	url := gs.Publish(t, "repo", dir)
	// A remote repository's environment file is read only once it is
	// cloned, inside a sandbox that needs git: the request names the
	// template (the harness daemon's default, minimal, has no git).
	base := client.CreateRequest{Template: "base"}

	for _, tc := range []struct {
		name, ref, want string
		cached          bool
	}{
		{"branch", "main", second, false},
		{"sha", first, first, false},
		// A full commit ID pins the checkout: the environment frozen by
		// the previous case serves it without cloning or setup, and the
		// agent phase gets the policy of the repository's own file.
		{"sha again, cached", first, first, true},
		// Once the cache holds something of the repository, a branch is
		// resolved to its commit (inside a sandbox that may reach only
		// the git host) before the create: the first time that fills the
		// cache for main's commit, the second time it hits it.
		{"branch, resolved", "main", second, false},
		{"branch again, cached", "main", second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			sb, err := d.Client.CreateWorkspace(ctx, client.WorkspaceRequest{Repo: url, Ref: tc.ref, CreateRequest: base}, func(p client.WorkspaceProgress) {
				logs.WriteString(p.Type + " " + p.Message + "\n")
			})
			if err != nil {
				t.Fatalf("CreateWorkspace %s at %s: %v\nprogress:\n%s", url, tc.ref, err, logs.String())
			}
			defer sb.Kill(context.WithoutCancel(ctx))
			want := "setup_done"
			if tc.cached {
				want = "setup_cached"
				if strings.Contains(logs.String(), "setup_step") {
					t.Errorf("a cached create ran setup:\n%s", logs.String())
				}
			}
			if sb.State != "ready" || !strings.Contains(logs.String(), want) {
				t.Errorf("state %s, want ready after %s; progress:\n%s", sb.State, want, logs.String())
			}
			if got := strings.TrimSpace(MustRun(t, sb, "git -C /workspace rev-parse HEAD")); got != tc.want {
				t.Errorf("checked out %s, want %s", got, tc.want)
			}
			// What setup downloaded is there in the agent phase.
			if got := strings.TrimSpace(MustRun(t, sb, "tool")); got != "tool 1.0" {
				t.Errorf("tool = %q, want the registry's script", got)
			}
			// The agent phase reaches what its policy allows, and neither
			// the registry nor the git server, which only setup could.
			if out := MustRun(t, sb, "curl -fsS -m 10 http://allowed.test/"); !strings.Contains(out, "host=allowed.test") {
				t.Errorf("agent phase curl allowed.test = %q", out)
			}
			if out, errOut, code := Run(t, sb, "curl -fsS -m 10 http://registry.test/pkg/tool-1.0.sh"); code == 0 {
				t.Errorf("agent phase reached the registry: %q %q", out, errOut)
			}
			if out, errOut, code := Run(t, sb, "timeout 20 git -C /workspace ls-remote origin"); code == 0 {
				t.Errorf("agent phase reached the git server: %q %q", out, errOut)
			}
		})
	}

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			req  client.WorkspaceRequest
			want error
			msg  string
		}{
			{"unreachable repo", client.WorkspaceRequest{Repo: "http://nosuch.test/x.git", Ref: "main", CreateRequest: base}, errdefs.ErrInvalidArgument, "not a reachable git repository"},
			{"unknown ref", client.WorkspaceRequest{Repo: url, Ref: "no-such-branch", CreateRequest: base}, errdefs.ErrNotFound, "no-such-branch"},
			{"template without git", client.WorkspaceRequest{Repo: url, Ref: "main", CreateRequest: client.CreateRequest{Template: "minimal"}}, errdefs.ErrInvalidArgument, "has no git"},
		} {
			_, err := d.Client.CreateWorkspace(ctx, tc.req, nil)
			t.Logf("%s: %v", tc.name, err)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("%s: err = %v, want %v mentioning %q", tc.name, err, tc.want, tc.msg)
			}
			var werr *client.WorkspaceError
			if errors.As(err, &werr) && werr.Sandbox != nil {
				if got, gerr := d.Client.Get(ctx, werr.Sandbox.ID); gerr != nil || got.State != "failed" {
					t.Errorf("%s: sandbox = %+v, %v; want state failed", tc.name, got, gerr)
				}
			}
		}
		AssertNoLeaks(t, d)
	})
}
