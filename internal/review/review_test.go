package review

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestParseAuthor(t *testing.T) {
	tests := []struct {
		in          string
		name, email string
		ok          bool
	}{
		{"Ada Lovelace <ada@example.com>", "Ada Lovelace", "ada@example.com", true},
		{"  Bot <bot@x>  ", "Bot", "bot@x", true},
		{"<only@mail>", "", "", false},
		{"No Mail", "", "", false},
		{"Two <a@b> <c@d>", "", "", false},
		{"New\nLine <a@b>", "", "", false},
	}
	for _, tt := range tests {
		name, email, err := ParseAuthor(tt.in)
		if (err == nil) != tt.ok || name != tt.name || email != tt.email {
			t.Errorf("ParseAuthor(%q) = %q, %q, %v; want %q, %q, ok %v", tt.in, name, email, err, tt.name, tt.email, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseAuthor(%q) error %v is not invalid argument", tt.in, err)
		}
	}
}

// The scripts run here with the host's sh and git on a repository the test
// makes; in production they run in the sandbox the same way.
func runScript(t *testing.T, script string, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"-c", prelude + script, "berth-review"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=T", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestScripts(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	origin := t.TempDir()
	git(t, origin, "init", "-q")
	os.WriteFile(filepath.Join(origin, "a.txt"), []byte("one\n"), 0o644)
	git(t, origin, "add", ".")
	git(t, origin, "commit", "-q", "-m", "init")
	work := filepath.Join(t.TempDir(), "w")
	git(t, "/", "clone", "-q", origin, work)

	if _, e, code := runScript(t, diffScript, nil, "/nonexistent"); code != exitNoDir {
		t.Errorf("diff of a missing dir exited %d (%s), want %d", code, e, exitNoDir)
	}
	if _, e, code := runScript(t, diffScript, nil, t.TempDir()); code != exitNoRepo {
		t.Errorf("diff of a non-repo exited %d (%s), want %d", code, e, exitNoRepo)
	}
	os.WriteFile(filepath.Join(work, "a.txt"), []byte("two\n"), 0o644)
	os.WriteFile(filepath.Join(work, "new.txt"), []byte("new\n"), 0o644)
	os.WriteFile(filepath.Join(work, "bin.dat"), []byte{0, 1, 2, 255}, 0o644)
	out, e, code := runScript(t, diffScript, nil, work)
	if code != 0 || !strings.Contains(out, "+two") || !strings.Contains(out, "new.txt") || !strings.Contains(out, "GIT binary patch") {
		t.Fatalf("diff = %q, %q, %d", out, e, code)
	}
	if st := git(t, work, "status", "--porcelain"); !strings.Contains(st, "?? new.txt") {
		t.Errorf("diff changed the user's index: status %q", st)
	}
	author := map[string]string{"GIT_AUTHOR_NAME": "Rev", "GIT_AUTHOR_EMAIL": "rev@x", "GIT_COMMITTER_NAME": "Rev", "GIT_COMMITTER_EMAIL": "rev@x"}
	if _, e, code := runScript(t, bundleScript, nil, work); code != exitNothing {
		t.Errorf("bundle without commits exited %d (%s), want %d", code, e, exitNothing)
	}
	out, e, code = runScript(t, commitScript, author, work, "agent work", "feature")
	if code != 0 || !strings.HasSuffix(strings.TrimSpace(out), "feature") {
		t.Fatalf("commit = %q, %q, %d", out, e, code)
	}
	if got := git(t, work, "log", "-1", "--format=%an <%ae>|%s"); got != "Rev <rev@x>|agent work" {
		t.Errorf("commit author|subject = %q", got)
	}
	os.WriteFile(filepath.Join(work, "later.txt"), []byte("later\n"), 0o644)
	patch, e, code := runScript(t, patchScript, author, work)
	if code != 0 || strings.Count(patch, "\nSubject: ") != 2 {
		t.Fatalf("patch = %q, %q, %d; want two patches", patch, e, code)
	}
	fresh := filepath.Join(t.TempDir(), "f")
	git(t, "/", "clone", "-q", origin, fresh)
	am := exec.Command("git", "-C", fresh, "-c", "user.name=T", "-c", "user.email=t@t", "am", "-q")
	am.Stdin = strings.NewReader(patch)
	if out, err := am.CombinedOutput(); err != nil {
		t.Fatalf("git am: %v\n%s", err, out)
	}
	for name, want := range map[string]string{"a.txt": "two\n", "new.txt": "new\n", "bin.dat": "\x00\x01\x02\xff", "later.txt": "later\n"} {
		if got, _ := os.ReadFile(filepath.Join(fresh, name)); string(got) != want {
			t.Errorf("after am %s = %q, want %q", name, got, want)
		}
	}
	bundle, e, code := runScript(t, bundleScript, nil, work)
	if code != 0 {
		t.Fatalf("bundle: %s %d", e, code)
	}
	bf := filepath.Join(t.TempDir(), "out.bundle")
	os.WriteFile(bf, []byte(bundle), 0o644)
	fresh2 := filepath.Join(t.TempDir(), "f2")
	git(t, "/", "clone", "-q", origin, fresh2)
	git(t, fresh2, "fetch", "-q", bf, "feature:feature")
	if got := git(t, fresh2, "log", "-1", "--format=%s", "feature"); got != "agent work" {
		t.Errorf("fetched bundle's feature = %q", got)
	}
	// The recorded base wins over the upstream.
	head := git(t, work, "rev-parse", "HEAD")
	os.WriteFile(filepath.Join(work, ".git", BaseFile), []byte(head+"\n"), 0o644)
	out, _, _ = runScript(t, diffScript, nil, work)
	if strings.Contains(out, "+two") || !strings.Contains(out, "later.txt") {
		t.Errorf("diff against recorded base = %q, want only later.txt", out)
	}
}
