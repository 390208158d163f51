package hostile

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestFileAPIEscapes attacks the file API: paths and links that point at
// the host. The agent resolves every path inside the sandbox's own mount
// namespace, so each must end in the sandbox (or in an error), and the
// host's planted file must neither leak nor change.
func TestFileAPIEscapes(t *testing.T) {
	harness.ForEachIsolation(t, testFileAPIEscapes)
}

func testFileAPIEscapes(t *testing.T, iso string) {
	l := newLab(t, client.CreateRequest{Isolation: iso})
	hostSecret, _ := os.ReadFile(l.canary)
	// The sandbox gets its own file at the canary's path: an attack that
	// is resolved in the sandbox finds this one, never the host's.
	harness.MustRun(t, l.sb, fmt.Sprintf("mkdir -p %s && echo sandbox-copy > %s", l.canaryDir, l.canary))

	read := func(t *testing.T, p string) (string, error) {
		t.Helper()
		var b bytes.Buffer
		err := l.sb.ReadFile(t.Context(), p, &b)
		if strings.Contains(b.String(), string(hostSecret)) {
			t.Fatalf("read %q returned the host's secret", p)
		}
		return b.String(), err
	}
	write := func(t *testing.T, p, content string) error {
		t.Helper()
		return l.sb.WriteFile(t.Context(), p, strings.NewReader(content))
	}
	// hostUntouched asserts that no attack wrote into the canary dir.
	hostUntouched := func(t *testing.T) {
		t.Helper()
		l.check(t)
	}

	reads := []struct{ name, setup, path string }{
		{"dotdot-relative", "", "../../../../../../.." + l.canary},
		{"dotdot-absolute", "", "/tmp/../../../.." + l.canary},
		{"absolute", "", l.canary},
		{"symlink-to-host-path", "ln -sfn " + l.canary + " /tmp/link", "/tmp/link"},
		{"symlinked-parent-dir", "ln -sfn " + l.canaryDir + " /tmp/dirlink", "/tmp/dirlink/secret"},
		{"relative-symlink-up", "ln -sfn ../../../../../../../../" + l.canary + " /tmp/rel", "/tmp/rel"},
		{"proc-self-root", "", "/proc/self/root" + l.canary},
		{"proc-1-root", "", "/proc/1/root" + l.canary},
		{"proc-1-cwd", "", "/proc/1/cwd/../../../.." + l.canary},
		{"symlink-to-proc-1-root", "ln -sfn /proc/1/root/../../.. /tmp/p1", "/tmp/p1" + l.canary},
		{"proc-self-environ", "", "/proc/self/environ"},
	}
	for _, r := range reads {
		t.Run("read-"+r.name, func(t *testing.T) {
			if r.setup != "" {
				harness.MustRun(t, l.sb, r.setup)
			}
			got, err := read(t, r.path)
			t.Logf("read %q = %q, %v", r.path, strings.TrimSpace(got), err)
			hostUntouched(t)
		})
	}

	writes := []struct{ name, setup, path string }{
		{"dotdot", "", "../../../../../../.." + l.canaryDir + "/pwned-dotdot"},
		{"absolute-overwrite", "", l.canary},
		{"through-symlink", "ln -sfn " + l.canary + " /tmp/wlink", "/tmp/wlink"},
		{"through-symlinked-parent", "ln -sfn " + l.canaryDir + " /tmp/wdir", "/tmp/wdir/pwned-parent"},
		{"proc-1-root", "", "/proc/1/root" + l.canaryDir + "/pwned-proc"},
		{"agent-binary", "", "/.berth/berth-agent"},
		{"proc-sysrq", "", "/proc/sysrq-trigger"},
	}
	for _, w := range writes {
		t.Run("write-"+w.name, func(t *testing.T) {
			if w.setup != "" {
				harness.MustRun(t, l.sb, w.setup)
			}
			err := write(t, w.path, "pwned")
			t.Logf("write %q: %v", w.path, err)
			hostUntouched(t)
		})
	}

	t.Run("multipart-filename-slip", func(t *testing.T) {
		// Multipart uploads take each part's file name as its path: the
		// closest thing the API has to an archive.
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for _, name := range []string{"../../../../../.." + l.canaryDir + "/pwned-mp", l.canaryDir + "/pwned-abs"} {
			fw, err := mw.CreateFormFile("file", name)
			if err != nil {
				t.Fatal(err)
			}
			fw.Write([]byte("pwned"))
		}
		mw.Close()
		u := l.d.URL + "/v1/sandboxes/" + l.sb.ID + "/agent/files?" + url.Values{"username": {"root"}}.Encode()
		resp, err := http.Post(u, mw.FormDataContentType(), &body)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		t.Logf("multipart upload: %s", resp.Status)
		hostUntouched(t)
	})

	t.Run("hardlink-to-host-file", func(t *testing.T) {
		l.shell(t, "rm -f "+l.canary+"; ! ln "+l.canary+" /tmp/hard 2>/dev/null")
		hostUntouched(t)
	})

	t.Run("nul-byte-path", func(t *testing.T) {
		u := l.d.URL + "/v1/sandboxes/" + l.sb.ID + "/agent/files?path=%2Ftmp%2Fx%00" + url.QueryEscape(l.canary)
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("NUL in path: %s, want 400", resp.Status)
		}
	})

	t.Run("download-symlink-swap-race", func(t *testing.T) {
		// A loop in the sandbox swaps /tmp/race between a regular file and
		// a symlink to the canary path while the client downloads it.
		harness.MustRun(t, l.sb, "mkdir -p "+l.canaryDir+" && echo sandbox-copy > "+l.canary)
		pid, err := l.sb.Start(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c",
			"while :; do echo decoy > /tmp/race.new; mv -f /tmp/race.new /tmp/race; ln -sfn " + l.canary + " /tmp/race; done"}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.sb.Signal(context.WithoutCancel(t.Context()), pid, 9)
		seen := map[string]int{}
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			got, err := read(t, "/tmp/race")
			if err != nil {
				seen["error"]++
				continue
			}
			seen[strings.TrimSpace(got)]++
		}
		for k := range seen {
			if k != "decoy" && k != "sandbox-copy" && k != "error" && k != "" {
				t.Errorf("download during the race returned %q", k)
			}
		}
		t.Logf("outcomes: %v", seen)
		hostUntouched(t)
	})

	t.Run("cli-cp-download-link-slip", func(t *testing.T) {
		// `berth cp ID:DIR LOCAL` must not write through links the sandbox
		// planted, nor outside LOCAL.
		harness.MustRun(t, l.sb, fmt.Sprintf(`mkdir -p /tmp/exp/sub && echo ok > /tmp/exp/sub/f
ln -sfn %[1]s /tmp/exp/a && ln -sfn ../../../../../../../%[2]s /tmp/exp/rel && ln -sfn %[1]s /tmp/exp/sub/b`, l.canaryDir, l.canary))
		local := t.TempDir()
		o, e, code := l.d.CLI(t, nil, "cp", l.sb.ID+":/tmp/exp", local)
		t.Logf("cp exited %d: %s %s", code, o, e)
		if b, err := os.ReadFile(filepath.Join(local, "exp", "sub", "f")); code == 0 && (err != nil || string(b) != "ok\n") {
			t.Errorf("downloaded sub/f = %q, %v", b, err)
		}
		hostUntouched(t)
	})
}
