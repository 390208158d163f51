package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

// e2bHeaders routes requests to a sandbox's agent through the daemon's
// E2B data plane, as the E2B SDKs do.
type e2bHeaders struct{ id, key string }

func (h e2bHeaders) Do(r *http.Request) (*http.Response, error) {
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	r.Header.Set("X-API-Key", h.key)
	r.Header.Set("Authorization", "Basic cm9vdDo=") // "root:"
	return http.DefaultClient.Do(r)
}

func findEntry(es []client.WorklogEntry, pred func(client.WorklogEntry) bool) *client.WorklogEntry {
	for i := range es {
		if pred(es[i]) {
			return &es[i]
		}
	}
	return nil
}

func TestWorklog(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	sb := d.Create(t, client.CreateRequest{})

	// Native SDK: a command with output on both streams and an exit code.
	var o, e bytes.Buffer
	code, err := sb.Exec(ctx, client.ExecRequest{
		Cmd: "/bin/sh", Args: []string{"-c", "head -c 3000 /dev/zero | tr '\\0' a; printf END; printf oops >&2; exit 3"},
		Cwd: "/tmp", Env: map[string]string{"API_TOKEN": "s3cr3t-value"}, Stdout: &o, Stderr: &e,
	})
	if err != nil || code != 3 {
		t.Fatalf("exec = %d, %v", code, err)
	}
	if err := sb.WriteFile(ctx, "/tmp/note.txt", strings.NewReader("hello worklog")); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.MakeDir(ctx, "/tmp/newdir"); err != nil {
		t.Fatal(err)
	}

	// E2B data plane: a sandbox made through the E2B API, a command sent as
	// a Connect JSON request with the E2b-Sandbox-Id header.
	key := createKey(t, d, "wl")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.URL+"/sandboxes", strings.NewReader(`{"templateID":"minimal"}`))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 || created.SandboxID == "" {
		t.Fatalf("E2B create: %s", resp.Status)
	}
	pc := processconnect.NewProcessClient(e2bHeaders{created.SandboxID, key}, d.URL, connect.WithProtoJSON())
	st, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/echo", Args: []string{"via", "e2b"}}}))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	if err := st.Err(); err != nil {
		t.Fatalf("e2b start stream: %v", err)
	}
	st.Close()

	es, err := d.Client.Worklog(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	ex := findEntry(es, func(e client.WorklogEntry) bool { return e.Kind == "exec" && e.Cmd == "/bin/sh" })
	if ex == nil {
		t.Fatalf("no exec entry in %+v", es)
	}
	if ex.API != "native" || ex.Cwd != "/tmp" || len(ex.Args) != 2 || !ex.Done || ex.ExitCode != 3 || ex.PID == 0 {
		t.Errorf("exec entry = %+v", *ex)
	}
	if strings.Join(ex.EnvNames, ",") != "API_TOKEN" {
		t.Errorf("env names = %v", ex.EnvNames)
	}
	if ex.Stdout.Bytes != 3003 || string(ex.Stdout.Head) != strings.Repeat("a", 1024) || !strings.HasSuffix(string(ex.Stdout.Tail), "aEND") || len(ex.Stdout.Tail) != 1024 {
		t.Errorf("stdout = %d bytes, head %q…, tail …%q", ex.Stdout.Bytes, ex.Stdout.Head[:8], ex.Stdout.Tail[len(ex.Stdout.Tail)-8:])
	}
	if ex.Stderr.Bytes != 4 || string(ex.Stderr.Head) != "oops" {
		t.Errorf("stderr = %+v", ex.Stderr)
	}
	if w := findEntry(es, func(e client.WorklogEntry) bool { return e.Kind == "write" }); w == nil || w.Path != "/tmp/note.txt" || w.Size != int64(len("hello worklog")) || w.HTTPStatus != 200 {
		t.Errorf("write entry = %+v", w)
	}
	if m := findEntry(es, func(e client.WorklogEntry) bool { return e.Kind == "mkdir" }); m == nil || m.Path != "/tmp/newdir" {
		t.Errorf("mkdir entry = %+v", m)
	}

	e2b, err := d.Client.Worklog(ctx, created.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	ee := findEntry(e2b, func(e client.WorklogEntry) bool { return e.Kind == "exec" && e.Cmd == "/bin/echo" })
	if ee == nil || ee.API != "e2b" || ee.User != "root" || ee.Stdout.Bytes != int64(len("via e2b\n")) || !ee.Done || ee.ExitCode != 0 {
		t.Errorf("e2b exec entry = %+v (all: %+v)", ee, e2b)
	}

	// CLI, and the record outlives the sandbox.
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.CLI(t, nil, "worklog", sb.ID)
	if code != 0 || !strings.Contains(out, `"/bin/sh"`) || !strings.Contains(out, "/tmp/note.txt") || strings.Contains(out, "s3cr3t") {
		t.Errorf("berth worklog after destroy = %q, %q, %d", out, errOut, code)
	}
	out, _, code = d.CLI(t, nil, "worklog", sb.ID, "--json")
	if code != 0 || strings.Count(out, "\n") != len(es) || strings.Contains(out, "s3cr3t") {
		t.Errorf("berth worklog --json = %d lines (want %d), code %d", strings.Count(out, "\n"), len(es), code)
	}
}
