package e2bcompat

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/dockerfile"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/template"
)

// fakeBuilder records build requests; the builder itself is tested in
// internal/dockerfile and end to end.
type fakeBuilder struct {
	mu     sync.Mutex
	reqs   []dockerfile.Request
	files  map[string]string // the copies' context, read during the build
	fail   error
	built  map[string]bool
	copies [][2]string
	// logf, when set, writes the build's log instead of the default.
	logf func(io.Writer)
	// block, when set, holds every build (after its log) until it
	// yields the build's result.
	block chan error
}

func (f *fakeBuilder) BuildPlan(_ context.Context, req dockerfile.Request, log io.Writer) (template.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	f.files = map[string]string{}
	_ = filepath.Walk(req.Context, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(req.Context, p)
			f.files[rel] = string(b)
		}
		return nil
	})
	logf, block := f.logf, f.block
	if logf == nil {
		logf = func(w io.Writer) {
			fmt.Fprintln(w, "step one")
			fmt.Fprint(w, "partial line")
		}
	}
	if block != nil {
		f.mu.Unlock()
		logf(log)
		err := <-block
		f.mu.Lock()
		if err != nil {
			return template.Template{}, err
		}
	} else {
		logf(log)
	}
	if f.fail != nil {
		return template.Template{}, f.fail
	}
	f.built[req.Name] = true
	return template.Template{Name: req.Name, Built: true}, nil
}

func (f *fakeBuilder) Template(_ context.Context, name string) (template.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := template.ValidName(name); err != nil {
		return template.Template{}, err
	}
	t := template.Template{Name: name, Built: f.built[name]}
	if t.Built {
		t.BuildID = fakeBuildID(name)
	}
	return t, nil
}

// fakeBuildID is the build ID fakeBuilder gives template name.
func fakeBuildID(name string) string { return fmt.Sprintf("%032x", len(name)) }

func (f *fakeBuilder) Copy(_ context.Context, src, dst string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.copies = append(f.copies, [2]string{src, dst})
	f.built[dst] = true
	return nil
}

func newTemplateServer(t *testing.T, b *fakeBuilder) (srv *Server, admin, user string) {
	t.Helper()
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return newTemplateServerOn(t, b, db, t.TempDir())
}

// newTemplateServerOn serves the template API on db and dir, as a daemon
// started (or restarted) on them would.
func newTemplateServerOn(t *testing.T, b *fakeBuilder, db *store.DB, dir string) (srv *Server, admin, user string) {
	t.Helper()
	keys := NewKeys(db)
	_, admin, err := keys.CreateWith(t.Context(), "admin", true, core.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	_, user, err = keys.Create(t.Context(), "user")
	if err != nil {
		t.Fatal(err)
	}
	srv = New(Config{Manager: &fakeManager{sbs: map[string]sandbox.Sandbox{}}, Store: db, Keys: keys,
		Templates: b, TemplateDir: dir, BuildContext: t.Context()})
	return srv, admin, user
}

func call(t *testing.T, srv *Server, method, target, key string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req := httptest.NewRequest(method, target, rd)
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	out := map[string]any{}
	_ = json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out
}

func tgz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestTemplateBuildFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBuilder{built: map[string]bool{}}
		srv, admin, user := newTemplateServer(t, b)
		hash := strings.Repeat("ab", 32)

		if code, body := call(t, srv, "POST", "/v3/templates", user, map[string]any{"name": "app"}); code != 403 || !strings.Contains(fmt.Sprint(body["message"]), "admin") {
			t.Fatalf("request with a user key = %d %v, want 403 naming admin", code, body)
		}
		if code, body := call(t, srv, "POST", "/v3/templates", admin, map[string]any{"name": "Bad Name"}); code != 400 || !strings.Contains(fmt.Sprint(body["message"]), "name") {
			t.Fatalf("bad name = %d %v", code, body)
		}
		code, body := call(t, srv, "POST", "/v3/templates", admin, map[string]any{"name": "app", "tags": []string{"v1"}})
		if code != 202 {
			t.Fatalf("request = %d %v", code, body)
		}
		buildID := body["buildID"].(string)
		if body["templateID"] != "app" || fmt.Sprint(body["tags"]) != "[v1]" {
			t.Fatalf("request answer %v", body)
		}

		// The upload link: signed, served here.
		code, body = call(t, srv, "GET", "/templates/app/files/"+hash, admin, nil)
		if code != 201 || body["present"] != false {
			t.Fatalf("upload link = %d %v", code, body)
		}
		u, err := url.Parse(body["url"].(string))
		if err != nil || u.Path != "/templates/app/files/"+hash {
			t.Fatalf("upload url %v (%v)", body["url"], err)
		}
		archive := tgz(t, map[string]string{"src/a.txt": "hello\n"})
		bad := u.Query()
		bad.Set("signature", strings.Repeat("0", 64))
		if code, _ := call(t, srv, "PUT", u.Path+"?"+bad.Encode(), "", archive); code != 403 {
			t.Fatalf("upload with a bad signature = %d, want 403", code)
		}
		if code, _ := call(t, srv, "PUT", u.Path+"?"+u.RawQuery, "", archive); code != 200 {
			t.Fatalf("upload = %d", code)
		}
		if code, body := call(t, srv, "GET", "/templates/app/files/"+hash, admin, nil); code != 201 || body["present"] != true {
			t.Fatalf("after upload = %d %v, want present", code, body)
		}

		// Unknown step types and per-build credentials are 501.
		for _, trig := range []map[string]any{
			{"fromImage": "e2bdev/base", "steps": []map[string]any{{"type": "HEALTHCHECK", "args": []string{"x"}}}},
			{"fromImage": "alpine", "fromImageRegistry": map[string]any{"type": "aws"}},
		} {
			if code, body := call(t, srv, "POST", "/v2/templates/app/builds/"+buildID, admin, trig); code != 501 {
				t.Fatalf("trigger %v = %d %v, want 501", trig, code, body)
			}
		}
		trig := map[string]any{
			"fromImage": "e2bdev/base:latest", "startCmd": "serve", "readyCmd": "test -f /ready",
			"steps": []map[string]any{
				{"type": "COPY", "args": []string{"src", "/app/", "user", "0755"}, "filesHash": hash},
				{"type": "RUN", "args": []string{"make", "root"}},
				{"type": "ENV", "args": []string{"A", "1", "B", "2"}},
				{"type": "WORKDIR", "args": []string{"/app"}},
				{"type": "USER", "args": []string{"user"}, "force": true},
			},
		}
		if code, body := call(t, srv, "POST", "/v2/templates/app/builds/"+buildID, admin, trig); code != 202 {
			t.Fatalf("trigger = %d %v", code, body)
		}
		if code, _ := call(t, srv, "POST", "/v2/templates/app/builds/"+buildID, admin, trig); code != 404 {
			t.Fatalf("second trigger = %d, want 404", code)
		}
		// Polled before its first log line, a build still lists its
		// entries as an empty array: the SDK maps it without a nil check.
		if _, body := call(t, srv, "GET", "/templates/app/builds/"+buildID+"/status", admin, nil); body["logEntries"] == nil {
			t.Fatalf("status before any log = %v, want logEntries as an array", body)
		}
		synctest.Wait()
		code, body = call(t, srv, "GET", "/templates/app/builds/"+buildID+"/status", admin, nil)
		if code != 200 || body["status"] != "ready" || body[e2bwire.BuildIDField] != fakeBuildID(fmt.Sprint(body[e2bwire.BuildTemplateField])) {
			t.Fatalf("status = %d %v, want ready with the template's build ID", code, body)
		}
		if logs := fmt.Sprint(body["logs"]); logs != "[step one partial line]" {
			t.Errorf("logs = %s", logs)
		}
		if _, body = call(t, srv, "GET", "/templates/app/builds/"+buildID+"/status?logsOffset=2", admin, nil); fmt.Sprint(body["logs"]) != "[]" || body["logEntries"] == nil {
			t.Errorf("logs from offset 2 = %v", body["logs"])
		}

		req := b.reqs[0]
		// skipCache() before the last step marks only it: the build
		// itself keeps its cache.
		if req.Name != "app-"+buildID[:8] || req.PreferUser != "user" || req.NoCache || req.Plan.FromRef != "berth:base" {
			t.Errorf("request: name %q prefer %q nocache %v from %q", req.Name, req.PreferUser, req.NoCache, req.Plan.FromRef)
		}
		if req.Start.Cmd != "serve" || req.Start.Ready == nil || req.Start.Ready.Cmd != "test -f /ready" {
			t.Errorf("start %+v", req.Start)
		}
		if b.files[hash+"/src/a.txt"] != "hello\n" {
			t.Errorf("build context %v, want the upload under its hash", b.files)
		}
		steps := req.Plan.Steps
		for i, st := range steps {
			if st.NoCache != (i == 4) {
				t.Errorf("step %d NoCache = %v, want only the forced step 5 marked", i+1, st.NoCache)
			}
		}
		if c, ok := steps[0].Cmd.(*instructions.CopyCommand); !ok || c.SourcePaths[0] != hash+"/src" || c.DestPath != "/app/" || c.Chown != "user" || c.Chmod != "0755" {
			t.Errorf("copy step %#v", steps[0].Cmd)
		}
		if c, ok := steps[1].Cmd.(*dockerfile.RunAs); !ok || c.Shell != "make" || c.User != "root" || steps[1].Line != 2 {
			t.Errorf("run step %#v line %d", steps[1].Cmd, steps[1].Line)
		}
		if c, ok := steps[2].Cmd.(*instructions.EnvCommand); !ok || len(c.Env) != 2 || c.Env[1].Key != "B" {
			t.Errorf("env step %#v", steps[2].Cmd)
		}

		// Tags: the build has v1 only; app:v1 names its template.
		if tgt, ok := srv.tpl.resolve("app:v1"); !ok || tgt != req.Name {
			t.Errorf("resolve app:v1 = %q %v", tgt, ok)
		}
		if code, _ := call(t, srv, "GET", "/templates/aliases/app", user, nil); code != 404 {
			t.Errorf("alias app (no default tag) = %d, want 404", code)
		}
		if code, _ := call(t, srv, "POST", "/templates/tags", admin, map[string]any{"target": "app:v1", "tags": []string{"default", "stable"}}); code != 201 {
			t.Fatalf("assign tags = %d", code)
		}
		if len(b.copies) != 1 || b.copies[0] != [2]string{req.Name, "app"} {
			t.Errorf("copies %v: the default tag is the template app", b.copies)
		}
		if code, body := call(t, srv, "GET", "/templates/aliases/app", user, nil); code != 200 || body["templateID"] != "app" {
			t.Errorf("alias app = %d %v", code, body)
		}
		req2 := httptest.NewRequest("GET", "/templates/app/tags", nil)
		req2.Header.Set("X-API-Key", user)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req2)
		var tags []map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &tags)
		if len(tags) != 3 || tags[0]["tag"] != "default" || tags[2]["buildID"] != buildID {
			t.Errorf("tags = %s", w.Body)
		}
		if code, _ := call(t, srv, "DELETE", "/templates/tags", admin, map[string]any{"name": "app", "tags": []string{"stable"}}); code != 204 {
			t.Errorf("remove tag = %d", code)
		}
		if code, _ := call(t, srv, "GET", "/templates/aliases/app:stable", user, nil); code != 404 {
			t.Errorf("removed tag still exists: %d", code)
		}
	})
}

func TestTemplateBuildFailureNamesStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBuilder{built: map[string]bool{}, fail: &dockerfile.StepError{Line: 2, Err: fmt.Errorf("step 2: RUN false: exit status 1: %w", errdefs.ErrFailedPrecondition)}}
		srv, admin, _ := newTemplateServer(t, b)
		_, body := call(t, srv, "POST", "/v3/templates", admin, map[string]any{"name": "app"})
		id := body["buildID"].(string)
		trig := map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"true"}}, {"type": "RUN", "args": []string{"false"}}}}
		if code, _ := call(t, srv, "POST", "/v2/templates/app/builds/"+id, admin, trig); code != 202 {
			t.Fatalf("trigger = %d", code)
		}
		synctest.Wait()
		_, body = call(t, srv, "GET", "/templates/app/builds/"+id+"/status", admin, nil)
		reason, _ := body["reason"].(map[string]any)
		if body["status"] != "error" || reason["step"] != "2" || !strings.Contains(fmt.Sprint(reason["message"]), "exit status 1") {
			t.Errorf("status %v", body)
		}
		if b.reqs[0].Name != "app" || b.reqs[0].Plan.FromRef != "berth:base" {
			t.Errorf("request %q from %q", b.reqs[0].Name, b.reqs[0].Plan.FromRef)
		}
		if _, ok := srv.tpl.resolve("app"); ok {
			t.Error("a failed build was tagged")
		}
		if !errors.Is(b.fail, errdefs.ErrFailedPrecondition) {
			t.Fatal("fail lost its class")
		}
	})
}
