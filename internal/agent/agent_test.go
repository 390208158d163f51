package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/berth-sandbox/berth/proto/filesystem"
	"github.com/berth-sandbox/berth/proto/filesystem/filesystemconnect"
	pb "github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

type env struct {
	srv   *Server
	url   string
	token string
	home  string
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
}

// newEnv runs an agent on a loopback httptest server, with a temp passwd
// whose "root" and "tester" (uid 1234) have homes under a temp dir.
func newEnv(t *testing.T, token string) *env {
	t.Helper()
	dir := t.TempDir()
	// t.TempDir's directories are 0700; "tester" must be able to reach its home.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, "root")
	thome := filepath.Join(dir, "tester")
	for _, d := range []string{home, thome} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(thome, 1234, 1234); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	writeTestFile(t, passwd, "root:x:0:0:root:"+home+":/bin/sh\ntester:x:1234:1234::"+thome+":/bin/sh\n")
	writeTestFile(t, group, "root:x:0:\ntester:x:1234:\nextra:x:5555:tester\n")
	srv, err := New(Config{
		Token:      token,
		PasswdPath: passwd,
		GroupPath:  group,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SANDBOX_WIDE=yes"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.EnableHTTP2 = true
	ts.Start()
	t.Cleanup(func() { ts.Close(); srv.Close() })
	var opts []connect.ClientOption
	if token != "" {
		opts = append(opts, connect.WithInterceptors(tokenInterceptor(token)))
	}
	return &env{
		srv: srv, url: ts.URL, token: token, home: home,
		proc: processconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON()),
		fs:   filesystemconnect.NewFilesystemClient(ts.Client(), ts.URL, opts...),
	}
}

func writeTestFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

type tokenInterceptor string

func (ti tokenInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
		r.Header().Set("X-Access-Token", string(ti))
		return next(ctx, r)
	}
}
func (ti tokenInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn {
		c := next(ctx, s)
		c.RequestHeader().Set("X-Access-Token", string(ti))
		return c
	}
}
func (ti tokenInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

type result struct {
	pid            uint32
	stdout, stderr string
	pty            string
	end            *pb.ProcessEvent_EndEvent
}

func collect(t *testing.T, stream interface {
	Receive() bool
	Err() error
}, msg func() *pb.ProcessEvent) result {
	t.Helper()
	var r result
	for stream.Receive() {
		switch ev := msg().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			r.pid = ev.Start.GetPid()
		case *pb.ProcessEvent_Data:
			r.stdout += string(ev.Data.GetStdout())
			r.stderr += string(ev.Data.GetStderr())
			r.pty += string(ev.Data.GetPty())
		case *pb.ProcessEvent_End:
			r.end = ev.End
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if r.end == nil {
		t.Fatalf("stream ended without end event (stdout %q)", r.stdout)
	}
	return r
}

func (e *env) run(t *testing.T, user string, req *pb.StartRequest) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	creq := connect.NewRequest(req)
	if user != "" {
		creq.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	stream, err := e.proc.Start(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
}

func sh(script string) *pb.StartRequest {
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}}
}

func TestStartOutputAndExit(t *testing.T) {
	e := newEnv(t, "")
	tests := []struct {
		name           string
		script         string
		stdout, stderr string
		code           int32
		exited         bool
		status         string
		wantErr        bool
	}{
		{"ok", "echo hi; echo err >&2", "hi\n", "err\n", 0, true, "exit status 0", false},
		{"fail", "exit 3", "", "", 3, true, "exit status 3", true},
		{"killed", "kill -9 $$", "", "", -1, false, "signal: killed", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.run(t, "", sh(tt.script))
			if r.stdout != tt.stdout || r.stderr != tt.stderr {
				t.Errorf("output = %q/%q, want %q/%q", r.stdout, r.stderr, tt.stdout, tt.stderr)
			}
			if r.end.GetExitCode() != tt.code || r.end.GetExited() != tt.exited || r.end.GetStatus() != tt.status {
				t.Errorf("end = %v, want code %d exited %v status %q", r.end, tt.code, tt.exited, tt.status)
			}
			if (r.end.Error != nil) != tt.wantErr {
				t.Errorf("end.error = %v, want set %v", r.end.Error, tt.wantErr)
			}
			if r.pid == 0 {
				t.Error("no start event with pid")
			}
		})
	}
}

func TestEnvCwdUser(t *testing.T) {
	e := newEnv(t, "")
	req := sh(`echo "$HOME|$USER|$LOGNAME|$SANDBOX_WIDE|$MINE|$(pwd)|$(id -u)|$(id -G)"`)
	req.Process.Envs = map[string]string{"MINE": "x", "SANDBOX_WIDE": "overridden"}
	r := e.run(t, "tester", req)
	thome := filepath.Join(filepath.Dir(e.home), "tester")
	want := thome + "|tester|tester|overridden|x|" + thome + "|1234|1234 5555\n"
	if r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	cwd := "/tmp"
	req = sh("pwd")
	req.Process.Cwd = &cwd
	if r := e.run(t, "", req); r.stdout != "/tmp\n" {
		t.Errorf("cwd stdout = %q", r.stdout)
	}

	bad := "/does/not/exist"
	req.Process.Cwd = &bad
	stream, err := e.proc.Start(t.Context(), connect.NewRequest(req))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad cwd: err = %v, want invalid_argument naming %s", err, bad)
	}

	creq := connect.NewRequest(sh("true"))
	creq.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nobody-here:")))
	stream, err = e.proc.Start(t.Context(), creq)
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "nobody-here") {
		t.Errorf("unknown user: err = %v, want not_found naming the user", err)
	}
}

func TestStdinAndCloseStdin(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	yes := true
	req := sh("cat")
	req.Stdin = &yes
	stream, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.stdout != "hello\n" || r.end.GetExitCode() != 0 {
		t.Errorf("cat: stdout %q end %v", r.stdout, r.end)
	}

	// stdin false: the process reads /dev/null and input is refused.
	no := false
	req = sh("cat; echo done")
	req.Stdin = &no
	if r := e.run(t, "", req); r.stdout != "done\n" {
		t.Errorf("stdin=false: stdout %q", r.stdout)
	}
}

func TestPTY(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := &pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh"},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}},
		Tag:     ptr("term"),
	}
	stream, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "term"}}
	send := func(s string) {
		t.Helper()
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	send("stty size\n")
	var out string
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(out, want) {
			if !stream.Receive() {
				t.Fatalf("stream ended before %q; got %q (%v)", want, out, stream.Err())
			}
			out += string(stream.Msg().GetEvent().GetData().GetPty())
		}
	}
	readUntil("30 100")
	if _, err := e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 120, Rows: 40}}})); err != nil {
		t.Fatal(err)
	}
	send("stty size; exit 7\n")
	readUntil("40 120")
	r := collect(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.end.GetExitCode() != 7 {
		t.Errorf("pty end = %v, want exit 7", r.end)
	}
}

func ptr[T any](v T) *T { return &v }

func TestConnectListSignal(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := sh("echo started; while :; do sleep 0.05; echo tick; done")
	req.Tag = ptr("loop")
	stream, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()

	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid && p.GetTag() == "loop" && p.GetConfig().GetCmd() == "/bin/sh" {
			found = true
		}
	}
	if !found {
		t.Fatalf("List = %v, want pid %d tag loop", list.Msg, pid)
	}

	for _, sel := range []*pb.ProcessSelector{
		{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		{Selector: &pb.ProcessSelector_Tag{Tag: "loop"}},
	} {
		cctx, ccancel := context.WithCancel(ctx)
		cs, err := e.proc.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for !strings.Contains(got, "tick") && cs.Receive() {
			got += string(cs.Msg().GetEvent().GetData().GetStdout())
		}
		if !strings.Contains(got, "tick") {
			t.Errorf("Connect(%v): no further output (%v)", sel, cs.Err())
		}
		ccancel()
	}

	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.end.GetStatus() != "signal: killed" || r.end.GetExitCode() != -1 {
		t.Errorf("end after SIGKILL = %v", r.end)
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGTERM}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal after end: err = %v, want not_found", err)
	}
}

func TestTokenRequired(t *testing.T) {
	e := newEnv(t, "secret")
	// The process client carries no token.
	_, err := e.proc.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("List without token: %v, want unauthenticated", err)
	}
	// The fs client carries it.
	if _, err := e.fs.Stat(t.Context(), connect.NewRequest(&fspb.StatRequest{Path: "/"})); err != nil {
		t.Errorf("Stat with token: %v", err)
	}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/health", "", http.StatusNoContent},
		{"/envs", "", http.StatusUnauthorized},
		{"/envs", "wrong", http.StatusUnauthorized},
		{"/envs", "secret", http.StatusOK},
		{"/metrics", "secret", http.StatusOK},
	} {
		req, _ := http.NewRequest("GET", e.url+tc.path, nil)
		if tc.token != "" {
			req.Header.Set("X-Access-Token", tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s token %q = %d, want %d", tc.path, tc.token, resp.StatusCode, tc.want)
		}
	}
}

func TestResolvePath(t *testing.T) {
	tests := []struct {
		in, home, want string
		err            bool
	}{
		{"", "/home/u", "/home/u", false},
		{"~", "/home/u", "/home/u", false},
		{"~/a/../b", "/home/u", "/home/u/b", false},
		{"a/b", "/home/u", "/home/u/a/b", false},
		{"../../etc", "/home/u", "/etc", false},
		{"/x//y/", "/home/u", "/x/y", false},
		{"~other/x", "/home/u", "", true},
		{"a\x00b", "/home/u", "", true},
	}
	for _, tt := range tests {
		got, err := resolvePath(tt.in, tt.home)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want %q, err %v", tt.in, tt.home, got, err, tt.want, tt.err)
		}
		if err != nil && !errors.Is(err, errBadPath) {
			t.Errorf("resolvePath(%q) error %v is not errBadPath", tt.in, err)
		}
	}
}

func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"", "~", "~/x", "a/../../b", "/abs", "~u", "\x00", "./.", "//", "~/../.."} {
		f.Add(s, "/home/user")
	}
	f.Fuzz(func(t *testing.T, p, home string) {
		got, err := resolvePath(p, home)
		if err != nil {
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("resolvePath(%q, %q) = %q: not a clean absolute path", p, home, got)
		}
	})
}

// TestFloodBoundedMemory: a process writing fast to stdout with a slow
// reader must be slowed down (backpressure), not buffered in the agent.
func TestFloodBoundedMemory(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	stream, err := e.proc.Start(ctx, connect.NewRequest(sh("head -c 50000000 /dev/zero")))
	if err != nil {
		t.Fatal(err)
	}
	var total int
	var peak uint64
	for stream.Receive() {
		total += len(stream.Msg().GetEvent().GetData().GetStdout())
		if total%(16<<20) < outputChunk {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
		if end := stream.Msg().GetEvent().GetEnd(); end != nil && end.GetExitCode() != 0 {
			t.Errorf("end = %v", end)
		}
	}
	if total != 50000000 {
		t.Errorf("got %d bytes, want all 50000000 (nothing dropped while a stream listens)", total)
	}
	if peak > 128<<20 {
		t.Errorf("heap peaked at %d bytes while streaming", peak)
	}
}

// TestFastOutputReachesStartStream: a command that prints and exits before
// the Start handler goes on must still deliver its output on that stream.
// The hook holds startProc's caller until the process ended and its output
// was read, which is the worst case of the race: a stream that subscribed
// only after startProc returned saw nothing.
func TestFastOutputReachesStartStream(t *testing.T) {
	e := newEnv(t, "")
	e.srv.procs.afterStart = func(p *proc) { <-p.endedCh }
	r := e.run(t, "", sh("echo tok-out; echo tok-err >&2"))
	if r.stdout != "tok-out\n" || r.stderr != "tok-err\n" {
		t.Errorf("output = %q/%q, want tok-out/tok-err", r.stdout, r.stderr)
	}
	if r.end.GetExitCode() != 0 || !r.end.GetExited() {
		t.Errorf("end = %v, want exit 0", r.end)
	}
}
