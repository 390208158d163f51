package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/test/harness"
)

// TestVersionStamped: scripts/build.sh stamps the version and commit it
// is given (or git describe and HEAD); the daemon reports the version of
// its binary through health (a plain go build, the harness's, names the
// commit from the toolchain's VCS stamp where -buildvcs is on).
func TestVersionStamped(t *testing.T) {
	harness.RequireHost(t)
	root := repoRoot(t)
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	commit := strings.TrimSpace(string(head))[:12]
	dir := t.TempDir()
	cmd := exec.Command("./scripts/build.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BERTH_BIN_DIR="+dir, "BERTH_VERSION=v9.8.7-test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build.sh: %v\n%s", err, out)
	}
	out, _ := exec.Command(filepath.Join(dir, "berth"), "version").CombinedOutput()
	if !strings.Contains(string(out), "client: v9.8.7-test (commit "+commit) {
		t.Errorf("berth version of a build.sh build:\n%s\nwant client: v9.8.7-test (commit %s…)", out, commit)
	}
	d := StartDaemon(t)
	stdout, _, code := d.CLI(t, nil, "version")
	lines := strings.Split(stdout, "\n")
	if code != 0 || len(lines) < 2 || !strings.HasPrefix(lines[0], "client: ") || !strings.Contains(lines[0], " (commit ") ||
		strings.TrimPrefix(lines[0], "client: ") != strings.TrimPrefix(lines[1], "server: ") {
		t.Errorf("berth version (harness build) = %d:\n%s\nwant the same VERSION (commit REV) for client and server", code, stdout)
	}
}

// TestDaemonPIDFileAndLock: the daemon writes <data-dir>/berth.pid; a
// second daemon on the same data dir refuses, naming it; a SIGKILLed
// daemon's stale pid file does not stop the next start; a clean stop
// removes it. --log-file sends the log to a file.
func TestDaemonPIDFileAndLock(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "log", "berth.log")
	d := StartDaemon(t, "--log-file", logFile)
	pidPath := filepath.Join(d.DataDir, "berth.pid")
	readPID := func() int {
		t.Helper()
		b, err := os.ReadFile(pidPath)
		if err != nil {
			t.Fatalf("pid file: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("pid file %q: %v", b, err)
		}
		return n
	}
	if got := readPID(); got != d.PID() {
		t.Errorf("pid file = %d, want the daemon's pid %d", got, d.PID())
	}
	second := exec.Command(bin.Berth, "serve", "--listen", "127.0.0.1:0", "--data-dir", d.DataDir, "--instance", d.Instance,
		"--cache-dir", harness.CacheDir(), "--agent", bin.Agent)
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by berth daemon pid "+strconv.Itoa(d.PID())) {
		t.Errorf("second daemon on the same data dir: %v\n%s\nwant a refusal naming pid %d", err, out, d.PID())
	}
	if got := readPID(); got != d.PID() {
		t.Errorf("the refused daemon changed the pid file to %d", got)
	}
	logged, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(logged), "msg=daemon_ready") {
		t.Errorf("--log-file %s: %v\n%s\nwant the daemon's log", logFile, err, logged)
	}

	d.Kill9()
	if _, err := os.Stat(pidPath); err != nil {
		t.Fatalf("pid file after SIGKILL: %v (want it left, stale)", err)
	}
	d.Start()
	if got := readPID(); got != d.PID() {
		t.Errorf("pid file after a restart over a stale one = %d, want %d", got, d.PID())
	}
	d.Stop()
	if _, err := os.Stat(pidPath); !os.IsNotExist(err) {
		t.Errorf("pid file after a clean stop: %v, want it gone", err)
	}
	d.Start()
}
