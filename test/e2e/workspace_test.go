package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// makeRepo creates a git repository with files on branch main and returns
// its path and head commit.
func makeRepo(t *testing.T, files map[string]string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, files)
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", "-b", "main")
	git("add", "-A")
	git("commit", "-q", "-m", "initial")
	git("tag", "v1")
	return dir, git("rev-parse", "HEAD")
}

func requireBase(t *testing.T, d *Daemon) {
	t.Helper()
	if os.Getenv("BERTH_TEST_BASE") != "1" {
		if _, err := os.Stat(harness.CacheDir() + "/debootstrap"); err != nil {
			t.Skip("workspaces need the base template (git, bash): set BERTH_TEST_BASE=1 (scripts/test.sh does) to build it")
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	if _, err := d.Client.BuildTemplate(ctx, "base", io.Discard); err != nil {
		t.Fatalf("build base: %v", err)
	}
}

// treeHolds reports whether any regular file under root contains needle.
func treeHolds(t *testing.T, root string, needle []byte) string {
	t.Helper()
	var found string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || found != "" || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, needle) {
			found = p
		}
		return nil
	})
	return found
}

func TestWorkspace(t *testing.T) {
	d := StartDaemon(t)
	requireBase(t, d)
	ctx := t.Context()
	secretValue := "s3cr3t-" + hostSecret(t)
	if err := d.Client.SetSecret(ctx, "TOKEN", []byte(secretValue)); err != nil {
		t.Fatalf("SetSecret: %v", err)
	}
	list, err := d.Client.Secrets(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "TOKEN" {
		t.Fatalf("Secrets = %+v, %v", list, err)
	}
	repo, commit := makeRepo(t, map[string]string{
		"README": "hello\n",
		".berth/environment.yaml": `template: base
setup:
  - name: deps
    run: |
      test -n "$TOKEN"
      echo "token length ${#TOKEN}"
      echo built > /workspace/built.txt
      sleep 1
env:
  GREETING: hi
secrets: [TOKEN]
network:
  agent: {mode: none}
`,
	})
	url := "file://" + repo

	create := func() (*client.Sandbox, []client.WorkspaceProgress, time.Duration) {
		t.Helper()
		var prog []client.WorkspaceProgress
		start := time.Now()
		sb, err := d.Client.CreateWorkspace(ctx, client.WorkspaceRequest{Repo: url, Ref: "main"}, func(p client.WorkspaceProgress) { prog = append(prog, p) })
		if err != nil {
			t.Fatalf("CreateWorkspace: %v (progress %+v)", err, prog)
		}
		t.Cleanup(func() { sb.Kill(context.WithoutCancel(ctx)) })
		return sb, prog, time.Since(start)
	}
	sb, prog, first := create()
	var logs strings.Builder
	for _, p := range prog {
		logs.WriteString(p.Type + " " + p.Message + "\n")
	}
	if !strings.Contains(logs.String(), "token length") || !strings.Contains(logs.String(), "setup_done") {
		t.Errorf("first create progress lacks the step log or setup_done:\n%s", logs.String())
	}
	if sb.State != "ready" {
		t.Errorf("state = %s, want ready", sb.State)
	}
	if got := strings.TrimSpace(MustRun(t, sb, "git -C /workspace rev-parse HEAD")); got != commit {
		t.Errorf("checked out %s, want %s", got, commit)
	}
	// The checkout records its base, which diff and export compare with.
	if got := strings.TrimSpace(MustRun(t, sb, "cat /workspace/.git/berth-base")); got != commit {
		t.Errorf(".git/berth-base = %q, want %s", got, commit)
	}
	if got := strings.TrimSpace(MustRun(t, sb, "cat /workspace/built.txt; echo $GREETING")); got != "built\nhi" {
		t.Errorf("setup result = %q", got)
	}
	// The secret is gone in the agent phase: environment, processes, disk.
	if out := MustRun(t, sb, "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"); strings.Contains(out, secretValue) {
		t.Errorf("agent phase environment holds the secret")
	}
	if out, _, _ := Run(t, sb, "grep -rl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -F \"$(printf %s "+secretValue+")\" / 2>/dev/null"); strings.TrimSpace(out) != "" {
		t.Errorf("sandbox files hold the secret: %s", out)
	}
	upper := filepath.Join(d.DataDir, "sandboxes", sb.ID, "disk", "upper")
	if p := treeHolds(t, upper, []byte(secretValue)); p != "" {
		t.Errorf("the sandbox's writable layer holds the secret in %s", p)
	}
	if p := treeHolds(t, filepath.Join(d.DataDir, "environments"), []byte(secretValue)); p != "" {
		t.Errorf("the cached environment holds the secret in %s", p)
	}

	// Second create: same key, setup skipped. The daemon's setup_cached
	// event is the proof of the cache hit; how much faster it was is
	// bench's business (under load it may not be).
	sb2, prog2, second := create()
	cached := false
	for _, p := range prog2 {
		cached = cached || p.Type == "setup_cached"
		if p.Type == "setup_step" {
			t.Errorf("second create ran a setup step: %+v", p)
		}
	}
	if !cached {
		t.Errorf("second create did not use the cache: %+v", prog2)
	}
	if got := strings.TrimSpace(MustRun(t, sb2, "cat /workspace/built.txt; git -C /workspace rev-parse HEAD")); got != "built\n"+commit {
		t.Errorf("cached sandbox = %q", got)
	}
	t.Logf("workspace create: first %s (clone + setup + freeze), cached %s", first.Round(time.Millisecond), second.Round(time.Millisecond))
	envs, err := d.Client.Environments(ctx)
	if err != nil || len(envs) != 1 || envs[0].Commit != commit {
		t.Errorf("Environments = %+v, %v", envs, err)
	}

	// Bad inputs: clear errors, nothing left running.
	bad := func(name string, req client.WorkspaceRequest, want error, msg string) {
		t.Helper()
		_, err := d.Client.CreateWorkspace(ctx, req, nil)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: err = %v, want %v mentioning %q", name, err, want, msg)
		}
	}
	invalid := "setup:\n  - run: true\n    bogus: 1\n"
	missing := "secrets: [NOPE]\n"
	bad("unknown ref", client.WorkspaceRequest{Repo: url, Ref: "no-such-branch"}, errdefs.ErrNotFound, "no-such-branch")
	bad("not a repo", client.WorkspaceRequest{Repo: "file://" + t.TempDir(), Ref: "main"}, errdefs.ErrInvalidArgument, "not a reachable git repository")
	bad("bad scheme", client.WorkspaceRequest{Repo: "ssh://x/y", Ref: "main"}, errdefs.ErrInvalidArgument, "scheme")
	bad("invalid env", client.WorkspaceRequest{Repo: url, Ref: "main", Environment: &invalid}, errdefs.ErrInvalidArgument, "line 3")
	bad("unknown secret", client.WorkspaceRequest{Repo: url, Ref: "main", Environment: &missing}, errdefs.ErrNotFound, "NOPE")

	// A failing step leaves the sandbox failed with step, exit code and tail.
	failing := "template: base\nsetup:\n  - name: breaks\n    run: echo failing-output; exit 7\n"
	_, err = d.Client.CreateWorkspace(ctx, client.WorkspaceRequest{Repo: url, Ref: "v1", Environment: &failing}, nil)
	var werr *client.WorkspaceError
	if !errors.As(err, &werr) || werr.Sandbox == nil {
		t.Fatalf("failing step: err = %v, want a WorkspaceError with the sandbox", err)
	}
	// The repository's script failed, not Berth.
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("failing step: err = %v (code %s), want failed_precondition", err, client.ErrorCode(err))
	}
	got, gerr := d.Client.Get(ctx, werr.Sandbox.ID)
	if gerr != nil || got.State != "failed" || !strings.Contains(got.Reason, "breaks") || !strings.Contains(got.Reason, "code 7") || !strings.Contains(got.Reason, "failing-output") {
		t.Errorf("failed sandbox = %+v, %v; want state failed naming the step, exit code and log", got, gerr)
	}

	if err := d.Client.RemoveSecret(ctx, "TOKEN"); err != nil {
		t.Errorf("RemoveSecret: %v", err)
	}
	sb.Kill(ctx)
	sb2.Kill(ctx)
	AssertNoLeaks(t, d)
	removed, err := d.Client.PruneEnvironments(ctx, "")
	if err != nil || len(removed) != 1 {
		t.Errorf("PruneEnvironments = %v, %v", removed, err)
	}
}

func TestWorkspaceCLI(t *testing.T) {
	d := StartDaemon(t)
	if _, errOut, code := d.CLI(t, strings.NewReader("hunter2\n"), "secret", "set", "API_KEY"); code != 0 {
		t.Fatalf("secret set: exit %d: %s", code, errOut)
	}
	out, _, code := d.CLI(t, nil, "secret", "ls")
	if code != 0 || !strings.Contains(out, "API_KEY") || strings.Contains(out, "hunter2") {
		t.Errorf("secret ls = %q (exit %d): want the name and never the value", out, code)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	badFile := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("setup: [make]\nsecrets: [API_KEY]\n"), 0o644)
	os.WriteFile(badFile, []byte("setup:\n  - make\nnetwork:\n  agent: {mode: wide}\n"), 0o644)
	if out, errOut, code := d.CLI(t, nil, "env", "check", good); code != 0 || !strings.Contains(out, "valid") {
		t.Errorf("env check good = %q %q (exit %d)", out, errOut, code)
	}
	if _, errOut, code := d.CLI(t, nil, "env", "check", badFile); code == 0 || !strings.Contains(errOut, "line 4") {
		t.Errorf("env check bad: exit %d, stderr %q; want a failure naming line 4", code, errOut)
	}
	if _, errOut, code := d.CLI(t, nil, "secret", "rm", "API_KEY"); code != 0 {
		t.Errorf("secret rm: exit %d: %s", code, errOut)
	}
	// Without its secret the file cannot run here: not "valid", and the
	// user's to fix, not internal.
	if out, errOut, code := d.CLI(t, nil, "env", "check", good); code != 1 || strings.Contains(out, "valid") ||
		!strings.Contains(errOut, "API_KEY") || !strings.HasSuffix(errOut, "(failed_precondition)\n") {
		t.Errorf("env check with a missing secret = %q %q (exit %d); want exit 1, no \"valid\", failed_precondition naming API_KEY", out, errOut, code)
	}
	if _, _, code := d.CLI(t, nil, "secret", "rm", "API_KEY"); code == 0 {
		t.Errorf("secret rm twice succeeded")
	}
}

// TestWorkspaceKillDuringSetup: a kill does not wait out a long setup; it
// aborts the create, which fails and leaves nothing behind.
func TestWorkspaceKillDuringSetup(t *testing.T) {
	d := StartDaemon(t)
	requireBase(t, d)
	ctx := t.Context()
	repo, _ := makeRepo(t, map[string]string{
		".berth/environment.yaml": "template: base\nsetup:\n  - name: slow\n    run: sleep 300\n",
	})
	started := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		_, err := d.Client.CreateWorkspace(ctx, client.WorkspaceRequest{Repo: "file://" + repo, Ref: "main", NoCache: true}, func(p client.WorkspaceProgress) {
			if p.Type == "setup_step" {
				once.Do(func() { close(started) })
			}
		})
		errc <- err
	}()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("create ended before its setup step ran: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("setup step did not start")
	}
	sbs, err := d.Client.List(ctx, client.ListOptions{State: client.StateCreating})
	if err != nil || len(sbs) != 1 {
		t.Fatalf("creating sandboxes = %+v, %v; want one", sbs, err)
	}
	// Readers never wait for the setup: the sandbox reads as creating,
	// and the data plane refuses it at once rather than hang until the
	// setup ends (the bound only turns a regression into a failure).
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	if got, err := d.Client.Get(rctx, sbs[0].ID); err != nil || got.State != client.StateCreating {
		t.Errorf("Get during setup = %+v, %v; want creating", got, err)
	}
	if _, err := d.Client.Sandbox(sbs[0].ID).Exec(rctx, client.ExecRequest{Cmd: "true"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec during setup = %v, want failed precondition", err)
	}
	rcancel()
	if err := d.Client.Kill(ctx, sbs[0].ID); err != nil {
		t.Fatalf("kill during setup: %v", err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("the create succeeded although the sandbox was killed during setup")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the create did not end after the kill")
	}
	got, err := d.Client.Get(ctx, sbs[0].ID)
	if err != nil || (got.State != client.StateFailed && got.State != client.StateStopped) {
		t.Errorf("after kill during setup: %+v, %v; want failed or stopped", got, err)
	}
	AssertNoLeaks(t, d)
}
