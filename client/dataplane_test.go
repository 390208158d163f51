package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/filesystem"
	"github.com/berth-sandbox/berth/proto/filesystem/filesystemconnect"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

// fakeAgent scripts the agent's process and file services: enough to check
// the client's side of the wire (events, stdin, headers, exit codes).
type fakeAgent struct {
	processconnect.UnimplementedProcessHandler
	filesystemconnect.UnimplementedFilesystemHandler

	mu       sync.Mutex
	users    []string // users named by Authorization, in call order
	timeouts []string // Connect-Timeout-Ms of Start calls
	stdinOn  []bool
	stdin    chan []byte // nil chunk = CloseStdin
	input    chan []byte // pty input
	sizes    chan [2]uint32
	signals  chan process.Signal
	files    map[string][]byte
	// wholeFiles answers file reads whole, ignoring Range.
	wholeFiles bool
	// conns counts the connections the server accepted.
	conns atomic.Int64
}

func newFakeAgent() *fakeAgent {
	return &fakeAgent{
		stdin: make(chan []byte, 16), input: make(chan []byte, 16),
		sizes: make(chan [2]uint32, 4), signals: make(chan process.Signal, 4),
		files: map[string][]byte{},
	}
}

func (f *fakeAgent) note(h http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, _ := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	b, _ := base64.StdEncoding.DecodeString(u)
	f.users = append(f.users, strings.TrimSuffix(string(b), ":"))
}

func send(stream *connect.ServerStream[process.StartResponse], ev *process.ProcessEvent) error {
	return stream.Send(&process.StartResponse{Event: ev})
}

func out(b string, stderr bool) *process.ProcessEvent {
	d := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(b)}}
	if stderr {
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte(b)}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

func end(code int32, exited bool, status string) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: code, Exited: exited, Status: status}}}
}

func (f *fakeAgent) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	f.note(req.Header())
	f.mu.Lock()
	f.timeouts = append(f.timeouts, req.Header().Get("Connect-Timeout-Ms"))
	f.stdinOn = append(f.stdinOn, req.Msg.GetStdin())
	f.mu.Unlock()
	if err := send(stream, &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}}); err != nil {
		return err
	}
	switch req.Msg.GetProcess().GetCmd() {
	case "echo":
		if err := send(stream, out(strings.Join(req.Msg.GetProcess().GetArgs(), " ")+"\n", false)); err != nil {
			return err
		}
		if err := send(stream, out("warn\n", true)); err != nil {
			return err
		}
		return send(stream, end(3, true, "exit status 3"))
	case "cat":
		for {
			select {
			case b := <-f.stdin:
				if b == nil {
					return send(stream, end(0, true, "exit status 0"))
				}
				if err := send(stream, out(string(b), false)); err != nil {
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	case "sh":
		for {
			select {
			case b := <-f.input:
				ev := &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: b}}}}
				if err := send(stream, ev); err != nil {
					return err
				}
			case <-f.signals:
				return send(stream, end(-1, false, "signal: killed"))
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	case "sleep":
		<-ctx.Done()
		return ctx.Err()
	case "linger":
		// An agent that holds the stream open past the end event.
		if err := send(stream, end(7, true, "exit status 7")); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return connect.NewError(connect.CodeNotFound, errors.New("no such command"))
}

func (f *fakeAgent) SendInput(_ context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	f.note(req.Header())
	switch in := req.Msg.GetInput().GetInput().(type) {
	case *process.ProcessInput_Stdin:
		f.stdin <- in.Stdin
	case *process.ProcessInput_Pty:
		f.input <- in.Pty
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (f *fakeAgent) CloseStdin(_ context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	f.stdin <- nil
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (f *fakeAgent) Update(_ context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	s := req.Msg.GetPty().GetSize()
	f.sizes <- [2]uint32{s.GetCols(), s.GetRows()}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (f *fakeAgent) SendSignal(_ context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	f.signals <- req.Msg.GetSignal()
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (f *fakeAgent) Stat(_ context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[req.Msg.GetPath()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such file"))
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: &filesystem.EntryInfo{
		Name: "f", Path: req.Msg.GetPath(), Type: filesystem.FileType_FILE_TYPE_FILE, Size: int64(len(b)), Mode: 0o644,
	}}), nil
}

func (f *fakeAgent) serveFiles(w http.ResponseWriter, r *http.Request) {
	f.note(r.Header)
	p := r.URL.Query().Get("path")
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		b, ok := f.files[p]
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			io.WriteString(w, `{"code":404,"message":"file not found"}`)
			return
		}
		if f.wholeFiles {
			w.Write(b)
			return
		}
		// As the agent serves files: ranges honoured.
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	case http.MethodPost:
		if r.Header.Get("Content-Type") != "application/octet-stream" {
			http.Error(w, "want octet-stream", 400)
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.files[p] = b
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `[{"path":"`+p+`","name":"f","type":"file"}]`)
	}
}

// newAgentClient serves the fake agent under the daemon's proxy prefix for
// sandbox "sb1"; other sandboxes answer the daemon's not_found JSON.
func newAgentClient(t *testing.T) (*fakeAgent, *Client) {
	t.Helper()
	f := newFakeAgent()
	agent := http.NewServeMux()
	agent.Handle(processconnect.NewProcessHandler(f))
	agent.Handle(filesystemconnect.NewFilesystemHandler(f))
	agent.HandleFunc("/files", f.serveFiles)
	mux := http.NewServeMux()
	mux.Handle("/v1/sandboxes/sb1/agent/", http.StripPrefix("/v1/sandboxes/sb1/agent", agent))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, errors.Join(errors.New("sandbox gone"), errdefs.ErrNotFound), "")
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			f.conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func TestExec(t *testing.T) {
	f, c := newAgentClient(t)
	sb := c.Sandbox("sb1")
	var stdout, stderr bytes.Buffer
	code, err := sb.Exec(t.Context(), ExecRequest{Cmd: "echo", Args: []string{"hi", "there"}, Stdout: &stdout, Stderr: &stderr})
	if err != nil || code != 3 {
		t.Fatalf("Exec(echo) = %d, %v; want 3", code, err)
	}
	if stdout.String() != "hi there\n" || stderr.String() != "warn\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	// No user chosen: none is named, and the agent takes the sandbox's.
	if f.users[0] != "" || f.stdinOn[0] {
		t.Errorf("user %q stdin %v, want none, false", f.users[0], f.stdinOn[0])
	}

	stdout.Reset()
	code, err = sb.As("user").Exec(t.Context(), ExecRequest{Cmd: "cat", Stdin: strings.NewReader("piped input"), Stdout: &stdout})
	if err != nil || code != 0 || stdout.String() != "piped input" {
		t.Fatalf("Exec(cat) = %d, %v, out %q", code, err, stdout.String())
	}
	if !f.stdinOn[1] || f.users[1] != "user" {
		t.Errorf("cat: stdin flag %v user %q, want true, user", f.stdinOn[1], f.users[1])
	}

	if _, err := sb.Exec(t.Context(), ExecRequest{Cmd: "nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec(nope) = %v, want not found", err)
	}
	if _, err := c.Sandbox("gone").Exec(t.Context(), ExecRequest{Cmd: "echo"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Exec in unknown sandbox = %v, want not found (not unimplemented)", err)
	}
}

// TestExecReusesConnection: an exec reads its stream to the end, so the
// next one reuses the connection instead of dialling again (the daemon's
// proxy then keeps its own connection into the sandbox too).
func TestExecReusesConnection(t *testing.T) {
	f, c := newAgentClient(t)
	sb := c.Sandbox("sb1")
	for i := range 5 {
		if code, err := sb.Exec(t.Context(), ExecRequest{Cmd: "echo", Args: []string{"x"}}); err != nil || code != 3 {
			t.Fatalf("exec %d = %d, %v; want 3", i, code, err)
		}
	}
	if n := f.conns.Load(); n != 1 {
		t.Errorf("5 execs opened %d connections, want 1", n)
	}
	// A stream held open past its end event does not hold the exec: it
	// returns the end event's code (the read after it is bounded).
	if code, err := sb.Exec(t.Context(), ExecRequest{Cmd: "linger"}); err != nil || code != 7 {
		t.Errorf("exec linger = %d, %v; want 7", code, err)
	}
}

func TestStartHasNoDeadline(t *testing.T) {
	f, c := newAgentClient(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pid, err := c.Sandbox("sb1").Start(ctx, ExecRequest{Cmd: "sleep"})
	if err != nil || pid != 42 {
		t.Fatalf("Start = %d, %v", pid, err)
	}
	if f.timeouts[0] != "" {
		t.Errorf("Start sent Connect-Timeout-Ms %q: the agent would kill the process then", f.timeouts[0])
	}
}

func TestPTY(t *testing.T) {
	f, c := newAgentClient(t)
	p, err := c.Sandbox("sb1").StartPTY(t.Context(), PTYRequest{Cmd: "sh", Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Write([]byte("ls\x03")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := io.ReadAtLeast(p, buf, 3)
	if err != nil || string(buf[:n]) != "ls\x03" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if err := p.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	if got := <-f.sizes; got != [2]uint32{120, 40} {
		t.Errorf("Resize sent %v", got)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, p); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 137 || err != nil {
		t.Errorf("Wait = %d, %v; want 137", code, err)
	}
}

func TestFiles(t *testing.T) {
	_, c := newAgentClient(t)
	sb := c.Sandbox("sb1")
	ctx := t.Context()
	data := strings.Repeat("0123456789", 10000)
	if err := sb.WriteFile(ctx, "/tmp/a", strings.NewReader(data)); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	var got bytes.Buffer
	if err := sb.ReadFile(ctx, "/tmp/a", &got); err != nil || got.String() != data {
		t.Fatalf("ReadFile = %d bytes, %v", got.Len(), err)
	}
	if err := sb.ReadFile(ctx, "/tmp/missing", io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile(missing) = %v, want not found", err)
	}
	st, err := sb.Stat(ctx, "/tmp/a")
	if err != nil || st.Type != TypeFile || st.Size != int64(len(data)) || st.Mode != 0o644 {
		t.Errorf("Stat = %+v, %v", st, err)
	}
	if _, err := sb.Stat(ctx, "/tmp/missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat(missing) = %v, want not found", err)
	}
}

// TestReadFileRange: a range from an offset, bounded or to the end; an
// offset past the end reads nothing; an agent that ignores the range
// still gives the range.
func TestReadFileRange(t *testing.T) {
	f, c := newAgentClient(t)
	sb := c.Sandbox("sb1")
	if err := sb.WriteFile(t.Context(), "/tmp/a", strings.NewReader("0123456789")); err != nil {
		t.Fatal(err)
	}
	for _, whole := range []bool{false, true} {
		f.mu.Lock()
		f.wholeFiles = whole
		f.mu.Unlock()
		for _, tc := range []struct {
			off, n int64
			want   string
		}{{0, 0, "0123456789"}, {3, 0, "3456789"}, {3, 2, "34"}, {8, 5, "89"}, {10, 0, ""}, {12, 3, ""}} {
			var got bytes.Buffer
			if err := sb.ReadFileRange(t.Context(), "/tmp/a", tc.off, tc.n, &got); err != nil || got.String() != tc.want {
				t.Errorf("ReadFileRange(%d, %d) (range ignored: %v) = %q, %v; want %q", tc.off, tc.n, whole, got.String(), err, tc.want)
			}
		}
	}
	if err := sb.ReadFileRange(t.Context(), "/tmp/missing", 0, 0, io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFileRange(missing) = %v, want not found", err)
	}
}
