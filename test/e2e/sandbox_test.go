package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

func TestCreateExecKill(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		out, errOut, code := d.CLI(t, nil, "create", "--template", "minimal", "--isolation", iso, "--env", "GREETING=hello", "--label", "team=e2e")
		if code != 0 {
			t.Fatalf("berth create exited %d: %s", code, errOut)
		}
		id := strings.TrimSpace(out)
		if err := types.ValidSandboxID(id); err != nil {
			t.Fatalf("berth create printed %q: %v", id, err)
		}
		// Ready means the agent answers: exec works right away.
		out, errOut, code = d.CLI(t, nil, "exec", id, "--", "sh", "-c", "echo out-$GREETING; echo err >&2; exit 7")
		if code != 7 || out != "out-hello\n" || errOut != "err\n" {
			t.Errorf("exec = (%q, %q, %d), want (out-hello, err, 7)", out, errOut, code)
		}
		// stdin is forwarded.
		out, _, code = d.CLI(t, strings.NewReader("piped input\n"), "exec", id, "--", "cat")
		if code != 0 || out != "piped input\n" {
			t.Errorf("exec cat with stdin = (%q, %d), want piped input", out, code)
		}
		// cwd, env and user.
		out, errOut, code = d.CLI(t, nil, "exec", id, "--cwd", "/tmp", "--env", "X=1", "--user", "user", "--", "sh", "-c", "pwd; echo $X; id -u; echo $HOME")
		if code != 0 || out != "/tmp\n1\n1000\n/home/user\n" {
			t.Errorf("exec with cwd/env/user = (%q, %q, %d)", out, errOut, code)
		}
		// A signal ends it: 128+n.
		_, _, code = d.CLI(t, nil, "exec", id, "--", "sh", "-c", "kill -KILL $$")
		if code != 128+9 {
			t.Errorf("exec killed by SIGKILL exited %d, want 137", code)
		}
		// ls and inspect show it.
		out, _, code = d.CLI(t, nil, "ls")
		if code != 0 || !strings.Contains(out, id) {
			t.Errorf("berth ls = (%q, %d), want it to list %s", out, code, id)
		}
		out, _, code = d.CLI(t, nil, "ls", "--json", "--label", "team=nobody")
		if code != 0 || strings.Contains(out, id) {
			t.Errorf("berth ls --label team=nobody = (%q, %d), want no %s", out, code, id)
		}
		out, _, code = d.CLI(t, nil, "inspect", id)
		if code != 0 || !strings.Contains(out, `"state": "ready"`) || !strings.Contains(out, `"template": "minimal"`) {
			t.Errorf("berth inspect = (%q, %d)", out, code)
		}
		if _, errOut, code = d.CLI(t, nil, "kill", id); code != 0 {
			t.Fatalf("berth kill: %d %s", code, errOut)
		}
		sb, err := d.Client.Get(t.Context(), id)
		if err != nil || sb.State != client.StateStopped {
			t.Errorf("after kill: %+v, %v; want state stopped", sb, err)
		}
		// Exec on a dead sandbox is a clear error, and a non-zero exit.
		_, errOut, code = d.CLI(t, nil, "exec", id, "--", "true")
		if code == 0 || errOut == "" {
			t.Errorf("exec on a killed sandbox = (%q, %d), want an error", errOut, code)
		}
		AssertNoLeaks(t, d)
	})
}

func TestBackgroundProcesses(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		sb := d.Create(t, client.CreateRequest{Isolation: iso})
		out, errOut, code := d.CLI(t, nil, "exec", sb.ID, "--background", "--tag", "ticker", "--", "sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done")
		if code != 0 {
			t.Fatalf("exec --background: %d %s", code, errOut)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil || pid <= 1 {
			t.Fatalf("exec --background printed %q, want a pid", out)
		}
		out, _, code = d.CLI(t, nil, "ps", sb.ID)
		if code != 0 || !strings.Contains(out, strconv.Itoa(pid)) {
			t.Errorf("berth ps = (%q, %d), want pid %d", out, code, pid)
		}
		// Re-attach: output keeps coming.
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var buf syncBuffer
		attached := make(chan int, 1)
		go func() {
			c, _ := sb.Attach(ctx, uint32(pid), &buf, &buf)
			attached <- c
		}()
		waitFor(t, time.Minute, "output after attach", func() bool { return strings.Contains(buf.String(), "tick") })
		if _, errOut, code = d.CLI(t, nil, "signal", sb.ID, strconv.Itoa(pid), "TERM"); code != 0 {
			t.Fatalf("berth signal: %d %s", code, errOut)
		}
		select {
		case c := <-attached:
			if c != 128+15 {
				t.Errorf("attached process ended with %d, want 143 (SIGTERM)", c)
			}
		case <-ctx.Done():
			t.Fatal("attach did not end after SIGTERM")
		}
	})
}

func TestBadInput(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	tests := []struct {
		req   client.CreateRequest
		field string
	}{
		{client.CreateRequest{Template: "nope"}, "template"},
		{client.CreateRequest{Memory: "lots"}, "memory"},
		{client.CreateRequest{Disk: "-1G"}, "disk"},
		{client.CreateRequest{Timeout: "soon"}, "timeout"},
		{client.CreateRequest{Memory: "1K"}, "memory"},
		{client.CreateRequest{Env: map[string]string{"BAD=KEY": "x"}}, "env"},
		{client.CreateRequest{Env: map[string]string{"BERTH_AGENT_TOKEN": "chosen"}}, "env"},
		{client.CreateRequest{Env: map[string]string{"BERTH_AGENT_CRED_FD": "0"}}, "env"},
	}
	for _, tt := range tests {
		if tt.req.Template == "" {
			tt.req.Template = "minimal"
		}
		_, err := d.Client.Create(ctx, tt.req)
		var we *errdefs.Error
		if !errors.As(err, &we) || !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Create(%+v) err = %v, want invalid argument or not found", tt.req, err)
			continue
		}
		if !strings.Contains(we.Message, tt.field) {
			t.Errorf("Create(%+v) message %q does not name %q", tt.req, we.Message, tt.field)
		}
	}
	// Nothing was made by the failures.
	sbs, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.State != client.StateFailed {
			t.Errorf("after bad creates, sandbox %s is %s", sb.ID, sb.State)
		}
	}
	AssertNoLeaks(t, d)

	if _, err := d.Client.Get(ctx, "doesnotexist"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want not found", err)
	}
	_, errOut, code := d.CLI(t, nil, "kill", "doesnotexist")
	if code == 0 || !strings.Contains(errOut, "not_found") {
		t.Errorf("berth kill unknown = (%q, %d), want not_found and non-zero", errOut, code)
	}
	_, errOut, code = d.CLI(t, nil, "create", "--memory", "huge")
	if code == 0 || !strings.Contains(errOut, "memory") {
		t.Errorf("berth create --memory huge = (%q, %d), want an error naming memory", errOut, code)
	}
	_, errOut, code = d.CLI(t, nil, "timeout", "doesnotexist", "forever")
	if code == 0 || errOut == "" {
		t.Errorf("berth timeout bad = (%q, %d), want an error", errOut, code)
	}
	// Raw API: unknown field, oversized body, malformed JSON.
	for _, body := range []string{`{"template":"minimal","bogus":1}`, `{"memory":`, `{"template":"` + strings.Repeat("a", 2<<20) + `"}`} {
		code, msg := postRaw(t, d.URL+"/v1/sandboxes", body)
		if code != 400 || !strings.Contains(msg, `"code": "invalid_argument"`) || !strings.Contains(msg, `"field"`) {
			t.Errorf("POST %.40q = %d %s, want 400 invalid_argument naming the field", body, code, msg)
		}
	}
}

func TestFiles(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		sb := d.Create(t, client.CreateRequest{Isolation: iso})
		ctx := t.Context()
		// Round trip a file through the API, large enough to need streaming.
		payload := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
		if err := sb.WriteFile(ctx, "/tmp/dir/sub/big.bin", bytes.NewReader(payload)); err != nil {
			t.Fatal(err)
		}
		var back bytes.Buffer
		if err := sb.ReadFile(ctx, "/tmp/dir/sub/big.bin", &back); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back.Bytes(), payload) {
			t.Errorf("read back %d bytes, want the %d written", back.Len(), len(payload))
		}
		if got := MustRun(t, sb, "wc -c < /tmp/dir/sub/big.bin"); strings.TrimSpace(got) != strconv.Itoa(len(payload)) {
			t.Errorf("inside, size = %q", got)
		}
		st, err := sb.Stat(ctx, "/tmp/dir/sub/big.bin")
		if err != nil || st.Size != int64(len(payload)) || st.IsDir() {
			t.Errorf("Stat = %+v, %v", st, err)
		}
		ents, err := sb.ListDir(ctx, "/tmp/dir", 2)
		if err != nil || len(ents) != 2 {
			t.Errorf("ListDir depth 2 = %+v, %v; want sub and sub/big.bin", ents, err)
		}
		if _, err := sb.MakeDir(ctx, "/tmp/made"); err != nil {
			t.Error(err)
		}
		if _, err := sb.Move(ctx, "/tmp/dir/sub/big.bin", "/tmp/made/moved.bin"); err != nil {
			t.Error(err)
		}
		if err := sb.Remove(ctx, "/tmp/made"); err != nil {
			t.Error(err)
		}
		if _, err := sb.Stat(ctx, "/tmp/made"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Stat after Remove = %v, want not found", err)
		}

		// berth cp, both ways, files and directories.
		local := t.TempDir()
		writeTree(t, local+"/src", map[string]string{"a.txt": "alpha", "d/b.txt": "beta", "d/e/c.txt": "gamma"})
		if _, errOut, code := d.CLI(t, nil, "cp", local+"/src", sb.ID+":/home/user/src"); code != 0 {
			t.Fatalf("cp dir up: %s", errOut)
		}
		if got := MustRun(t, sb, "cat /home/user/src/a.txt /home/user/src/d/b.txt /home/user/src/d/e/c.txt"); got != "alphabetagamma" {
			t.Errorf("uploaded tree reads %q", got)
		}
		// A link inside the tree stays relative in the copy (the agent
		// reports targets absolute, as envd does).
		MustRun(t, sb, "ln -s ../b.txt /home/user/src/d/e/link")
		if _, errOut, code := d.CLI(t, nil, "cp", sb.ID+":/home/user/src", local+"/down"); code != 0 {
			t.Fatalf("cp dir down: %s", errOut)
		}
		assertTree(t, local+"/down", map[string]string{"a.txt": "alpha", "d/b.txt": "beta", "d/e/c.txt": "gamma", "d/e/link": "beta"})
		if target, err := os.Readlink(local + "/down/d/e/link"); err != nil || target != "../b.txt" {
			t.Errorf("copied link = %q, %v; want ../b.txt", target, err)
		}
		if _, errOut, code := d.CLI(t, nil, "cp", sb.ID+":/etc/passwd", local+"/passwd"); code != 0 {
			t.Fatalf("cp file down: %s", errOut)
		}

		// Paths cannot leave the sandbox: a symlink to / inside resolves in
		// the sandbox's root, never the host's.
		MustRun(t, sb, "ln -s / /tmp/root-link; ln -s /etc/passwd /tmp/pw-link")
		var pw bytes.Buffer
		if err := sb.ReadFile(ctx, "/tmp/pw-link", &pw); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(pw.String(), "daemon:x:1:1:") || !strings.Contains(pw.String(), "user:x:1000:") {
			t.Errorf("reading a symlink inside the sandbox returned the host's /etc/passwd")
		}
		// A file that exists only on the host is out of reach by any path.
		secret := hostSecret(t)
		MustRun(t, sb, "ln -s "+secret+" /tmp/secret-link")
		for _, p := range []string{secret, "/../../../.." + secret, "/tmp/secret-link", "/proc/1/root" + secret, "/proc/self/root" + secret} {
			var esc bytes.Buffer
			if err := sb.ReadFile(ctx, p, &esc); err == nil || strings.Contains(esc.String(), "host-only") {
				t.Errorf("ReadFile(%q) = %q, %v; want not found", p, esc.String(), err)
			}
		}
	})
}

func TestInspectEventsTimeout(t *testing.T) {
	d := StartDaemon(t)
	// A timeout long enough that no loaded host reaches it before the
	// test moves it: the deadline under test is the 2 s one set below.
	sb := d.Create(t, client.CreateRequest{Timeout: "10m", CPU: 0.5, Memory: "256M", Disk: "512M"})
	got, err := d.Client.Get(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.CPU != 0.5 || got.MemoryBytes != 256<<20 || got.DiskBytes != 512<<20 || got.Usage == nil {
		t.Errorf("Get = %+v, want the limits asked for and usage", got)
	}
	// Move the deadline, then bring it close and let it pass.
	if _, errOut, code := d.CLI(t, nil, "timeout", sb.ID, "30m"); code != 0 {
		t.Fatalf("berth timeout: %s", errOut)
	}
	got, _ = d.Client.Get(t.Context(), sb.ID)
	if until := time.Until(got.Deadline); until < 29*time.Minute {
		t.Errorf("deadline after timeout 30m is %s away", until)
	}
	if _, err := d.Client.SetTimeout(t.Context(), sb.ID, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	var types []string
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = d.Client.FollowEvents(ctx, sb.ID, func(e client.Event) error {
		types = append(types, e.Type)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"created", "ready", "timeout_changed", "timeout_changed", "deadline", "destroyed"}
	if strings.Join(types, ",") != strings.Join(want, ",") {
		t.Errorf("events = %v, want %v", types, want)
	}
	out, _, code := d.CLI(t, nil, "events", sb.ID)
	if code != 0 || !strings.Contains(out, "deadline") {
		t.Errorf("berth events = (%q, %d)", out, code)
	}
	got, _ = d.Client.Get(t.Context(), sb.ID)
	if got.State != client.StateStopped || !strings.Contains(got.Reason, "deadline") {
		t.Errorf("after deadline: state %s reason %q", got.State, got.Reason)
	}
	AssertNoLeaks(t, d)
}
