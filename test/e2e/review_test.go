package e2e

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// hostGit runs git on the host, on repositories the test made.
func hostGit(t *testing.T, dir string, stdin io.Reader, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=Host", "-c", "user.email=host@example.com", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1")
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestReview(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed on the host")
	}
	if os.Getenv("BERTH_TEST_BASE") != "1" {
		if _, err := os.Stat(harness.CacheDir() + "/debootstrap"); err != nil {
			t.Skip("the base template (git) needs debootstrap's result: set BERTH_TEST_BASE=1 (scripts/test.sh does) to build it")
		}
	}
	cfg := filepath.Join(t.TempDir(), "berth.yaml")
	if err := os.WriteFile(cfg, []byte("commit_author: \"Daemon Default <dd@example.com>\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t, "--config", cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	if _, err := d.Client.BuildTemplate(ctx, "base", io.Discard); err != nil {
		t.Fatalf("build base: %v", err)
	}

	// The origin lives on the host; the sandbox gets it as a bundle
	// through the file API and clones it to /workspace.
	origin := t.TempDir()
	hostGit(t, origin, nil, "init", "-q")
	writeTree(t, origin, map[string]string{"a.txt": "one\n", "del.txt": "bye\n", "dir/keep.txt": "keep\n"})
	hostGit(t, origin, nil, "add", ".")
	hostGit(t, origin, nil, "commit", "-q", "-m", "initial")
	ob := filepath.Join(t.TempDir(), "origin.bundle")
	hostGit(t, origin, nil, "bundle", "create", "-q", ob, "--all")
	bundleData, err := os.ReadFile(ob)
	if err != nil {
		t.Fatal(err)
	}
	sb := d.Create(t, client.CreateRequest{Template: "base"})
	if err := sb.WriteFile(ctx, "/tmp/origin.bundle", strings.NewReader(string(bundleData))); err != nil {
		t.Fatal(err)
	}
	me := strings.TrimSpace(MustRun(t, sb, "id -un"))
	if code, err := sb.Exec(ctx, client.ExecRequest{User: "root", Cmd: "install", Args: []string{"-d", "-o", me, "/workspace"}}); err != nil || code != 0 {
		t.Fatalf("make /workspace: %d %v", code, err)
	}
	MustRun(t, sb, `set -e
git clone -q /tmp/origin.bundle /workspace
cd /workspace
git config user.name Sandbox && git config user.email sb@example.com
git rev-parse HEAD > .git/berth-base
echo two > a.txt
echo new > new.txt
printf '\000\001\377binary' > bin.dat
rm del.txt`)

	// diff: tracked change, deletion, new text and binary files.
	diff, errOut, code := d.CLI(t, nil, "diff", sb.ID)
	if code != 0 {
		t.Fatalf("berth diff: %s", errOut)
	}
	for _, want := range []string{"+two", "b/new.txt", "GIT binary patch", "deleted file mode"} {
		if !strings.Contains(diff, want) {
			t.Errorf("diff lacks %q:\n%s", want, diff)
		}
	}
	if st := MustRun(t, sb, "cd /workspace && git status --porcelain"); !strings.Contains(st, "?? new.txt") {
		t.Errorf("diff touched the sandbox's index: %q", st)
	}
	want := map[string]string{"a.txt": "two\n", "new.txt": "new\n", "bin.dat": "\x00\x01\xffbinary", "dir/keep.txt": "keep\n"}
	applied := filepath.Join(t.TempDir(), "applied")
	hostGit(t, "/", nil, "clone", "-q", origin, applied)
	hostGit(t, applied, strings.NewReader(diff), "apply", "--index", "-")
	assertTree(t, applied, want)
	if _, err := os.Stat(filepath.Join(applied, "del.txt")); err == nil {
		t.Error("del.txt survived git apply")
	}

	// commit with an explicit author on a new branch.
	out, errOut, code := d.CLI(t, nil, "commit", sb.ID, "-m", "agent work", "--branch", "agent", "--author", "Rev Iewer <rev@example.com>")
	if code != 0 || !strings.Contains(out, "agent") {
		t.Fatalf("berth commit = %q, %q, %d", out, errOut, code)
	}
	if got := strings.TrimSpace(MustRun(t, sb, "cd /workspace && git log -1 --format='%an <%ae>|%s|%D'")); got != "Rev Iewer <rev@example.com>|agent work|HEAD -> agent" {
		t.Errorf("commit in sandbox = %q", got)
	}
	if _, errOut, code := d.CLI(t, nil, "commit", sb.ID, "-m", "again"); code == 0 || !strings.Contains(errOut, "nothing to commit") {
		t.Errorf("empty commit = %q, %d; want a failed precondition", errOut, code)
	}
	MustRun(t, sb, "echo later > /workspace/later.txt")

	// patch: the commit plus the uncommitted change, which the daemon's
	// default author signs; git am applies both to a fresh clone.
	patch, errOut, code := d.CLI(t, nil, "export", sb.ID, "--format", "patch")
	if code != 0 || strings.Count(patch, "\nSubject: [PATCH") != 2 || !strings.Contains(patch, "From: Daemon Default <dd@example.com>") {
		t.Fatalf("export patch = %d, %s:\n%s", code, errOut, patch)
	}
	amDir := filepath.Join(t.TempDir(), "am")
	hostGit(t, "/", nil, "clone", "-q", origin, amDir)
	hostGit(t, amDir, strings.NewReader(patch), "am", "-q")
	assertTree(t, amDir, map[string]string{"a.txt": "two\n", "new.txt": "new\n", "bin.dat": "\x00\x01\xffbinary", "later.txt": "later\n"})
	if got := hostGit(t, amDir, nil, "log", "--format=%an|%s", "-2"); got != "Daemon Default|Uncommitted changes\nRev Iewer|agent work" {
		t.Errorf("after git am, log = %q", got)
	}

	// bundle: fetchable into a fresh clone.
	bundle, errOut, code := d.CLI(t, nil, "export", sb.ID, "--format", "bundle")
	if code != 0 {
		t.Fatalf("export bundle: %s", errOut)
	}
	bf := filepath.Join(t.TempDir(), "out.bundle")
	if err := os.WriteFile(bf, []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	fetched := filepath.Join(t.TempDir(), "fetched")
	hostGit(t, "/", nil, "clone", "-q", origin, fetched)
	hostGit(t, fetched, nil, "fetch", "-q", bf, "agent:agent")
	if got := hostGit(t, fetched, nil, "log", "-1", "--format=%an|%s", "agent"); got != "Rev Iewer|agent work" {
		t.Errorf("fetched bundle: agent = %q", got)
	}

	// Bad input is a clear error.
	if _, errOut, code := d.CLI(t, nil, "diff", sb.ID, "--path", "/nowhere"); code == 0 || !strings.Contains(errOut, "not_found") {
		t.Errorf("diff of a missing path = %q, %d", errOut, code)
	}
	if _, errOut, code := d.CLI(t, nil, "export", sb.ID, "--format", "zip"); code == 0 || !strings.Contains(errOut, "invalid_argument") {
		t.Errorf("export --format zip = %q, %d", errOut, code)
	}
}
