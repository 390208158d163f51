package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	fspb "github.com/berth-sandbox/berth/proto/filesystem"
	"github.com/berth-sandbox/berth/test/harness"
)

func (e *env) do(t *testing.T, method, path string, q url.Values, ctype string, body io.Reader, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.url+path+"?"+q.Encode(), body)
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if e.token != "" {
		req.Header.Set("X-Access-Token", e.token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// A bare transport: no transparent gzip decoding, so tests see the wire.
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestFilesRoundTrip(t *testing.T) {
	e := newEnv(t, "")
	q := url.Values{"path": {"sub/dir/a.txt"}, "username": {"tester"}}
	resp := e.do(t, "POST", "/files", q, "application/octet-stream", strings.NewReader("hello"), nil)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upload = %d %s", resp.StatusCode, b)
	}
	var entries []uploadEntry
	if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil {
		t.Fatal(err)
	}
	thome := filepath.Join(filepath.Dir(e.home), "tester")
	want := filepath.Join(thome, "sub/dir/a.txt")
	if len(entries) != 1 || entries[0].Path != want || entries[0].Name != "a.txt" || entries[0].Type != "file" {
		t.Fatalf("upload answer = %+v, want %s", entries, want)
	}
	for _, p := range []string{want, filepath.Dir(want), filepath.Dir(filepath.Dir(want))} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || st.Uid != 1234 || st.Gid != 1234 {
			t.Errorf("%s owner = %d:%d (%v), want 1234:1234", p, st.Uid, st.Gid, err)
		}
	}

	resp = e.do(t, "GET", "/files", q, "", nil, nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "hello" {
		t.Errorf("download = %d %q", resp.StatusCode, b)
	}
	resp = e.do(t, "GET", "/files", q, "", nil, map[string]string{"Accept-Encoding": "gzip"})
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(zr); string(b) != "hello" {
		t.Errorf("gzip download = %q", b)
	}

	for _, tc := range []struct {
		path string
		want int
	}{{"/nope/missing", 404}, {"/", 400}} {
		resp := e.do(t, "GET", "/files", url.Values{"path": {tc.path}}, "", nil, nil)
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != tc.want || body.Code != tc.want || body.Message == "" {
			t.Errorf("GET %s = %d %+v, want %d", tc.path, resp.StatusCode, body, tc.want)
		}
	}

	// Multipart: two files, no path: their names are taken from home.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, n := range []string{"m1.txt", "deep/m2.txt"} {
		w, _ := mw.CreateFormFile("file", n)
		fmt.Fprintf(w, "content of %s", n)
	}
	mw.Close()
	resp = e.do(t, "POST", "/files", nil, mw.FormDataContentType(), &buf, nil)
	entries = nil
	_ = json.NewDecoder(resp.Body).Decode(&entries)
	if resp.StatusCode != 200 || len(entries) != 2 {
		t.Fatalf("multipart = %d %+v", resp.StatusCode, entries)
	}
	if b, _ := os.ReadFile(filepath.Join(e.home, "deep/m2.txt")); string(b) != "content of deep/m2.txt" {
		t.Errorf("multipart file = %q", b)
	}

	// gzip-encoded upload body.
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte("zipped"))
	zw.Close()
	resp = e.do(t, "POST", "/files", url.Values{"path": {"/tmp/" + filepath.Base(e.home) + "-z"}}, "application/octet-stream", &zb, map[string]string{"Content-Encoding": "gzip"})
	if resp.StatusCode != 200 {
		t.Errorf("gzip upload = %d", resp.StatusCode)
	}
	if b, _ := os.ReadFile("/tmp/" + filepath.Base(e.home) + "-z"); string(b) != "zipped" {
		t.Errorf("gzip upload content = %q", b)
	}
	os.Remove("/tmp/" + filepath.Base(e.home) + "-z")
}

func TestFilesSignature(t *testing.T) {
	e := newEnv(t, "tok")
	target := filepath.Join(e.home, "s.txt")
	writeTestFile(t, target, "signed")
	exp := time.Now().Add(time.Minute).Unix()
	tests := []struct {
		name string
		q    url.Values
		want int
	}{
		{"none", url.Values{"path": {target}}, 401},
		{"good", url.Values{"path": {target}, "signature": {Signature(target, "read", "", "tok", 0)}}, 200},
		{"good-exp", url.Values{"path": {target}, "signature": {Signature(target, "read", "", "tok", exp)}, "signature_expiration": {fmt.Sprint(exp)}}, 200},
		{"expired", url.Values{"path": {target}, "signature": {Signature(target, "read", "", "tok", 1)}, "signature_expiration": {"1"}}, 401},
		{"write-sig-for-read", url.Values{"path": {target}, "signature": {Signature(target, "write", "", "tok", 0)}}, 401},
	}
	noTok := *e
	noTok.token = ""
	for _, tt := range tests {
		resp := noTok.do(t, "GET", "/files", tt.q, "", nil, nil)
		if resp.StatusCode != tt.want {
			t.Errorf("%s: GET /files = %d, want %d", tt.name, resp.StatusCode, tt.want)
		}
	}
}

// TestLargeUploadConstantMemory streams 200 MiB up and back down and checks
// the heap did not grow with it.
func TestLargeUploadConstantMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("large transfer")
	}
	e := newEnv(t, "")
	const size = 200 << 20
	path := filepath.Join(e.home, "big.bin")
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	resp := e.do(t, "POST", "/files", url.Values{"path": {path}}, "application/octet-stream", io.LimitReader(zeroReader{}, size), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("upload = %d", resp.StatusCode)
	}
	resp = e.do(t, "GET", "/files", url.Values{"path": {path}}, "", nil, nil)
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n != size {
		t.Fatalf("download %d bytes, %v", n, err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.HeapInuse > before.HeapInuse+64<<20 {
		t.Errorf("heap grew from %d to %d during a %d-byte transfer", before.HeapInuse, after.HeapInuse, size)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestFilesystemRPCs(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	mk, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b/c"}))
	if err != nil {
		t.Fatal(err)
	}
	if mk.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || mk.Msg.GetEntry().GetPath() != filepath.Join(e.home, "a/b/c") {
		t.Errorf("MakeDir entry = %v", mk.Msg.GetEntry())
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b/c"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("MakeDir again: %v, want already_exists", err)
	}
	writeTestFile(t, filepath.Join(e.home, "a/b/c/f.txt"), "12345")
	os.Symlink("f.txt", filepath.Join(e.home, "a/b/c/link"))

	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a/b/c/f.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if en := st.Msg.GetEntry(); en.GetSize() != 5 || en.GetName() != "f.txt" || en.GetOwner() != "root" || en.GetPermissions() != "-rw-r--r--" || en.GetMode() != 0o644 {
		t.Errorf("Stat = %v", en)
	}
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a/b/c/link"}))
	// envd reports the target resolved and absolute.
	if err != nil || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_SYMLINK || st.Msg.GetEntry().GetSymlinkTarget() != filepath.Join(e.home, "a/b/c/f.txt") {
		t.Errorf("Stat symlink = %v, %v", st, err)
	}
	os.Symlink("../gone", filepath.Join(e.home, "a/b/c/dangling"))
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a/b/c/dangling"}))
	if err != nil || st.Msg.GetEntry().GetSymlinkTarget() != filepath.Join(e.home, "a/b/gone") {
		t.Errorf("Stat dangling symlink = %v, %v", st, err)
	}
	os.Remove(filepath.Join(e.home, "a/b/c/dangling"))
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "nope"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Stat missing: %v", err)
	}

	for _, tc := range []struct {
		depth uint32
		want  int
	}{{1, 1}, {2, 2}, {3, 4}} {
		ls, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "a", Depth: tc.depth}))
		if err != nil {
			t.Fatal(err)
		}
		if len(ls.Msg.GetEntries()) != tc.want {
			t.Errorf("ListDir depth %d: %d entries, want %d: %v", tc.depth, len(ls.Msg.GetEntries()), tc.want, ls.Msg.GetEntries())
		}
	}

	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "a/b/c/f.txt", Destination: "x/y.txt"}))
	if err != nil || mv.Msg.GetEntry().GetPath() != filepath.Join(e.home, "x/y.txt") {
		t.Fatalf("Move = %v, %v", mv, err)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.home, "a")); !os.IsNotExist(err) {
		t.Errorf("after Remove: %v", err)
	}
	// As envd: removing what is not there succeeds.
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "a"})); err != nil {
		t.Errorf("Remove missing: %v", err)
	}
}

func TestWatchDirRecursive(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	os.MkdirAll(filepath.Join(e.home, "w"), 0o755)
	stream, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "w", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	os.Mkdir(filepath.Join(e.home, "w/sub"), 0o755)
	seen := map[string]bool{}
	want := func(key string) {
		t.Helper()
		for !seen[key] {
			if !stream.Receive() {
				t.Fatalf("stream ended waiting for %s: %v (seen %v)", key, stream.Err(), seen)
			}
			ev := stream.Msg().GetFilesystem()
			if ev != nil {
				seen[ev.GetName()+":"+ev.GetType().String()] = true
			}
		}
	}
	want("sub:EVENT_TYPE_CREATE")
	// Events under the new subdirectory arrive too: poll by rewriting until seen,
	// since the subdirectory watch is added asynchronously.
	done := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				os.WriteFile(filepath.Join(e.home, "w/sub/f"), []byte(fmt.Sprint(i)), 0o644)
			}
		}
	}()
	want("sub/f:EVENT_TYPE_WRITE")
	close(done)
	os.Remove(filepath.Join(e.home, "w/sub/f"))
	want("sub/f:EVENT_TYPE_REMOVE")

	// Polling watcher.
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(e.home, "w/p"), "x")
	deadline := time.Now().Add(10 * time.Second)
	got := false
	for !got && time.Now().Before(deadline) {
		ev, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()}))
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ev.Msg.GetEvents() {
			got = got || (x.GetName() == "p" && x.GetType() == fspb.EventType_EVENT_TYPE_CREATE)
		}
	}
	if !got {
		t.Error("polling watcher saw no CREATE of p")
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: cw.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("events of removed watcher: %v", err)
	}
}

// reaperEnv is an agent whose processes the agent's Reaper collects, the
// test process being a child subreaper for the test's length, as the agent
// is PID 1 in a sandbox.
func reaperEnv(t *testing.T) (*env, *Reaper) {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	r := NewReaper()
	t.Cleanup(r.Close)
	e := newEnv(t, "")
	e.srv.procs.spawner = spawner{reaper: r}
	return e, r
}

// TestReaperReapsOrphans makes the test process a child subreaper with the
// agent's Reaper, starts a shell that leaves an orphan behind, and checks
// the shell's own status still arrives and the orphan leaves no zombie.
// It must not run in parallel with tests that wait for their own children.
func TestReaperReapsOrphans(t *testing.T) {
	e, _ := reaperEnv(t)

	res := e.run(t, "", sh(`sh -c 'sleep 0.2 & echo $!' ; exit 5`))
	if res.end.GetExitCode() != 5 {
		t.Fatalf("end = %v, want exit 5", res.end)
	}
	orphan := strings.TrimSpace(res.stdout)
	harness.WaitFor(t, 10*time.Second, "orphan "+orphan+" to be reaped", func() bool {
		_, err := os.Stat("/proc/" + orphan)
		return err != nil
	})
}

// TestStartWaitingForForkLetsReaperRun: a start that waits for the fork
// lock (the pids killer holds it while it empties the sandbox and waits
// for the reaper to collect what it killed) must not hold the reaper's
// lock meanwhile, or nothing is reaped until the killer gives up, and the
// start then forks into the dead processes' unreaped count.
func TestStartWaitingForForkLetsReaperRun(t *testing.T) {
	e, r := reaperEnv(t)

	e.srv.procs.forkMu.Lock()
	started := make(chan error, 1)
	go func() {
		stream, err := e.proc.Start(t.Context(), connect.NewRequest(sh("true")))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
		}
		started <- err
	}()
	// Until the start is parked on the fork lock: no event says so, so
	// the goroutine's stack is read, bounded.
	harness.WaitFor(t, 10*time.Second, "the start to wait for the fork lock", func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "oomForFork")
	})
	if !r.mu.TryLock() {
		e.srv.procs.forkMu.Unlock()
		t.Fatal("a start waiting for the fork lock holds the reaper's lock")
	}
	r.mu.Unlock()
	e.srv.procs.forkMu.Unlock()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
}

// A FIFO is listed as what it is and refused, at once, for reading and
// writing: opening it plainly would wait for a peer forever.
func TestFilesNonRegular(t *testing.T) {
	e := newEnv(t, "")
	fifo := filepath.Join(e.home, "pipe")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	ls, err := e.fs.ListDir(t.Context(), connect.NewRequest(&fspb.ListDirRequest{Path: e.home}))
	if err != nil {
		t.Fatal(err)
	}
	var got *fspb.EntryInfo
	for _, en := range ls.Msg.GetEntries() {
		if en.GetName() == "pipe" {
			got = en
		}
	}
	if got == nil || got.GetType() != fspb.FileType_FILE_TYPE_UNSPECIFIED || !strings.HasPrefix(got.GetPermissions(), "p") {
		t.Errorf("ListDir entry for a FIFO = %v, want type unspecified and permissions starting with p", got)
	}
	q := url.Values{"path": {fifo}}
	resp := e.do(t, "GET", "/files", q, "", nil, nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "FIFO") {
		t.Errorf("GET /files on a FIFO = %d %s, want 400 naming the FIFO", resp.StatusCode, b)
	}
	resp = e.do(t, "POST", "/files", q, "application/octet-stream", strings.NewReader("x"), nil)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "not a regular file") {
		t.Errorf("POST /files onto a FIFO = %d %s, want 400", resp.StatusCode, b)
	}
}

func TestFileMetadata(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	upload := func(path string, md map[string]string) (*http.Response, []uploadEntry) {
		t.Helper()
		hdr := map[string]string{}
		for k, v := range md {
			hdr["X-Metadata-"+k] = v
		}
		resp := e.do(t, "POST", "/files", url.Values{"path": {path}}, "application/octet-stream", strings.NewReader("x"), hdr)
		var out []uploadEntry
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
		}
		return resp, out
	}
	resp, out := upload("m/a.txt", map[string]string{"Owner": "alice", "stage": "draft v1"})
	if resp.StatusCode != 200 || len(out) != 1 || fmt.Sprint(out[0].Metadata) != "map[owner:alice stage:draft v1]" {
		t.Fatalf("upload with metadata = %d %+v", resp.StatusCode, out)
	}
	path := filepath.Join(e.home, "m/a.txt")
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(path, "user.e2b.owner", buf); err != nil || string(buf[:n]) != "alice" {
		t.Errorf("user.e2b.owner = %q, %v", buf[:n], err)
	}
	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "m/a.txt"}))
	if err != nil || fmt.Sprint(st.Msg.GetEntry().GetMetadata()) != "map[owner:alice stage:draft v1]" {
		t.Errorf("Stat metadata = %v, %v", st.Msg.GetEntry().GetMetadata(), err)
	}
	// Attributes outside user.e2b. are not metadata.
	if err := unix.Setxattr(path, "user.other", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	ls, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "m"}))
	if err != nil || len(ls.Msg.GetEntries()) != 1 || fmt.Sprint(ls.Msg.GetEntries()[0].GetMetadata()) != "map[owner:alice stage:draft v1]" {
		t.Errorf("ListDir metadata = %v, %v", ls.Msg.GetEntries(), err)
	}
	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "m/a.txt", Destination: "m/b.txt"}))
	if err != nil || mv.Msg.GetEntry().GetMetadata()["owner"] != "alice" {
		t.Errorf("Move metadata = %v, %v", mv.Msg.GetEntry(), err)
	}
	// An upload replaces the whole set; one without metadata clears it.
	if _, out := upload("m/b.txt", map[string]string{"stage": "final"}); len(out) != 1 || fmt.Sprint(out[0].Metadata) != "map[stage:final]" {
		t.Errorf("re-upload = %+v", out)
	}
	if _, out := upload("m/b.txt", nil); len(out) != 1 || out[0].Metadata != nil {
		t.Errorf("upload without metadata = %+v", out)
	}
	if n, err := unix.Getxattr(filepath.Join(e.home, "m/b.txt"), "user.other", buf); err != nil || string(buf[:n]) != "x" {
		t.Errorf("an upload touched user.other: %q, %v", buf[:n], err)
	}
	for _, bad := range []map[string]string{
		{"k": "caf\u00e9"},
		{"k": "tab\there"},
		{"k": strings.Repeat("v", maxMetadataValue+1)},
	} {
		if resp, _ := upload("m/c.txt", bad); resp.StatusCode != 400 {
			t.Errorf("upload with metadata %q = %d, want 400", bad, resp.StatusCode)
		}
	}
	if _, err := os.Stat(filepath.Join(e.home, "m/c.txt")); !os.IsNotExist(err) {
		t.Errorf("a refused upload wrote its file: %v", err)
	}
}

func TestMetadataFromHeaders(t *testing.T) {
	for _, tc := range []struct {
		hdr  http.Header
		want string
		ok   bool
	}{
		{http.Header{"Content-Type": {"x"}}, "map[]", true},
		{http.Header{"X-Metadata-Owner": {"alice"}, "x-metadata-b": {"2"}}, "map[b:2 owner:alice]", true},
		{http.Header{"X-Metadata-": {"v"}}, "map[]", true},
		{http.Header{"X-Metadata-Bad Key": {"v"}}, "", false},
		{http.Header{"X-Metadata-K": {"\x01"}}, "", false},
		{http.Header{"X-Metadata-" + strings.Repeat("k", maxMetadataKey+1): {"v"}}, "", false},
	} {
		md, err := metadataFromHeaders(tc.hdr)
		if (err == nil) != tc.ok || (tc.ok && fmt.Sprint(md) != tc.want) {
			t.Errorf("metadataFromHeaders(%v) = %v, %v; want %s ok %v", tc.hdr, md, err, tc.want, tc.ok)
		}
	}
	many := http.Header{}
	for i := range maxMetadataKeys + 1 {
		many.Set(fmt.Sprintf("X-Metadata-K%d", i), "v")
	}
	if _, err := metadataFromHeaders(many); err == nil {
		t.Errorf("%d metadata entries accepted", maxMetadataKeys+1)
	}
}
