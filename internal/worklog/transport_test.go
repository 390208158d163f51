package worklog

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/proto/filesystem"
	"github.com/berth-sandbox/berth/proto/filesystem/filesystemconnect"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

type fakeProc struct {
	processconnect.UnimplementedProcessHandler
	// hold, when set, keeps the stream open after the end event until it
	// is closed.
	hold chan struct{}
}

func (f fakeProc) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	send := func(ev *process.ProcessEvent) error { return st.Send(&process.StartResponse{Event: ev}) }
	send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}})
	out := strings.Repeat("o", 3000) + "END"
	send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(out)}}}})
	send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte("oops")}}}})
	err := send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}}})
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
		}
	}
	return err
}

type fakeFS struct {
	filesystemconnect.UnimplementedFilesystemHandler
}

func (fakeFS) MakeDir(context.Context, *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	return connect.NewResponse(&filesystem.MakeDirResponse{}), nil
}

// agentFixture serves fake agent services and returns a log whose
// transport records traffic to it.
func agentFixture(t *testing.T) (*Log, *http.Client, string) {
	t.Helper()
	return agentFixtureProc(t, fakeProc{})
}

// agentFixtureProc is agentFixture with proc as the process service.
func agentFixtureProc(t *testing.T, proc fakeProc) (*Log, *http.Client, string) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(proc))
	mux.Handle(filesystemconnect.NewFilesystemHandler(fakeFS{}))
	mux.HandleFunc("POST /files", func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1024)
		for {
			if _, err := r.Body.Read(buf); err != nil {
				break
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[{"path":"/home/user/a.txt","name":"a.txt","type":"file"}]`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	l, err := New(Config{Dir: t.TempDir(), AgentPort: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.CloseAll)
	return l, &http.Client{Transport: l.Transport(http.DefaultTransport)}, srv.URL
}

// marked sets the sandbox on every request, as the proxies do.
type marked struct{ hc *http.Client }

func (m marked) Do(r *http.Request) (*http.Response, error) {
	return m.hc.Do(r.WithContext(WithSandbox(r.Context(), "sb1", "native")))
}

func TestTransportRecordsExec(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"proto", nil},
		{"json", []connect.ClientOption{connect.WithProtoJSON()}},
		{"gzip", []connect.ClientOption{connect.WithSendGzip()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, hc, base := agentFixture(t)
			pc := processconnect.NewProcessClient(marked{hc}, base, tt.opts...)
			cwd := "/work"
			req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sh", Args: []string{"-c", "x"}, Cwd: &cwd, Envs: map[string]string{"SECRET": "hunter2", "A": "1"}}})
			req.Header().Set("Authorization", "Basic dXNlcjo=") // "user:"
			st, err := pc.Start(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			for st.Receive() {
			}
			st.Close()
			es, err := l.Read(t.Context(), "sb1")
			if err != nil || len(es) != 1 {
				t.Fatalf("Read = %+v, %v; want one entry", es, err)
			}
			e := es[0]
			if e.Kind != KindExec || e.Cmd != "sh" || strings.Join(e.Args, " ") != "-c x" || e.Cwd != "/work" || e.User != "user" || e.PID != 42 {
				t.Errorf("entry = %+v", e)
			}
			if strings.Join(e.EnvNames, ",") != "A,SECRET" {
				t.Errorf("EnvNames = %v, want A,SECRET", e.EnvNames)
			}
			if !e.Done || e.ExitCode != 3 || !e.Exited || e.End.IsZero() {
				t.Errorf("end = done %v exit %d exited %v end %v", e.Done, e.ExitCode, e.Exited, e.End)
			}
			if e.Stdout.Bytes != 3003 || len(e.Stdout.Head) != 1024 || !strings.HasSuffix(string(e.Stdout.Tail), "END") || e.Stderr.Bytes != 4 || string(e.Stderr.Head) != "oops" {
				t.Errorf("streams = stdout %d head %d tail %q…, stderr %+v", e.Stdout.Bytes, len(e.Stdout.Head), e.Stdout.Tail[len(e.Stdout.Tail)-5:], e.Stderr)
			}
			raw, _ := readAll(l, "sb1")
			if strings.Contains(raw, "hunter2") {
				t.Errorf("a variable's value reached the log: %s", raw)
			}
		})
	}
}

// TestTransportRecordsExecEndBeforeClient: the entry says how a command
// ended by the time the client has the end event, though the stream is
// still open (a client that reads the work log once its command ended
// finds the end there).
func TestTransportRecordsExecEndBeforeClient(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	l, hc, base := agentFixtureProc(t, fakeProc{hold: hold})
	pc := processconnect.NewProcessClient(marked{hc}, base)
	st, err := pc.Start(t.Context(), connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sh"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for st.Receive() {
		if st.Msg().GetEvent().GetEnd() == nil {
			continue
		}
		es, err := l.Read(t.Context(), "sb1")
		if err != nil || len(es) != 1 || !es[0].Done || es[0].ExitCode != 3 || es[0].Stderr.Bytes != 4 {
			t.Fatalf("work log when the client has the end event = %+v, %v; want one entry, done, exit 3, its stderr", es, err)
		}
		return
	}
	t.Fatalf("the stream ended without an end event: %v", st.Err())
}

func TestTransportRecordsFiles(t *testing.T) {
	l, hc, base := agentFixture(t)
	fc := filesystemconnect.NewFilesystemClient(marked{hc}, base, connect.WithProtoJSON())
	if _, err := fc.MakeDir(t.Context(), connect.NewRequest(&filesystem.MakeDirRequest{Path: "/tmp/d"})); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(WithSandbox(t.Context(), "sb1", "e2b"), "POST", base+"/files?path=a.txt", strings.NewReader("hello world"))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Unmarked traffic (preview ports, other callers) is not recorded.
	resp, err = hc.Post(base+"/files?path=b.txt", "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Entries are written when the answer is closed, before Do returns.
	es, _ := l.Read(t.Context(), "sb1")
	if len(es) != 2 {
		t.Fatalf("entries = %+v, want 2", es)
	}
	if es[0].Kind != KindMkdir || es[0].Path != "/tmp/d" || es[0].HTTPStatus != 200 {
		t.Errorf("mkdir entry = %+v", es[0])
	}
	w := es[1]
	if w.Kind != KindWrite || w.Path != "a.txt" || w.Size != 11 || w.API != "e2b" || len(w.Paths) != 1 || w.Paths[0] != "/home/user/a.txt" {
		t.Errorf("write entry = %+v", w)
	}
}

func readAll(l *Log, id string) (string, error) {
	es, err := l.Read(context.Background(), id)
	var b strings.Builder
	for _, e := range es {
		b.WriteString(e.Cmd + strings.Join(e.EnvNames, ","))
	}
	raw, _ := http.Dir(l.cfg.Dir).Open(id + ".jsonl")
	if raw != nil {
		buf := make([]byte, 1<<20)
		n, _ := raw.Read(buf)
		b.Write(buf[:n])
		raw.Close()
	}
	return b.String(), err
}

func TestRotateKeepsRecord(t *testing.T) {
	l, err := New(Config{Dir: t.TempDir(), MaxBytes: 400, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.CloseAll()
	for i := range 20 {
		l.Append(Entry{Sandbox: "sb", Kind: KindExec, Cmd: "c" + strconv.Itoa(i)})
	}
	es, err := l.Read(t.Context(), "sb")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) == 0 || len(es) >= 20 || es[len(es)-1].Cmd != "c19" {
		t.Errorf("after rotation Read = %d entries ending %q; want the newest, some dropped", len(es), es[len(es)-1].Cmd)
	}
	if _, err := l.Read(t.Context(), "../x"); err == nil {
		t.Error("Read(../x) succeeded, want invalid argument")
	}
}
