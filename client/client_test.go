package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// fakeDaemon implements the control-plane JSON of docs/api.md in memory.
type fakeDaemon struct {
	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	lastQuery string
	lastBody  string
	next      int
}

func newFakeDaemon(t *testing.T) (*fakeDaemon, *Client) {
	t.Helper()
	f := &fakeDaemon{sandboxes: map[string]*Sandbox{}}
	srv := httptest.NewServer(f.routes())
	t.Cleanup(srv.Close)
	c, err := New(srv.URL)
	if err != nil {
		t.Fatalf("New(%q): %v", srv.URL, err)
	}
	return f, c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error, field string) {
	writeJSON(w, errdefs.HTTPStatus(err), map[string]string{"code": errdefs.Code(err), "message": err.Error(), "field": field})
}

func (f *fakeDaemon) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, Health{Status: "ok", Version: "test"})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var req CreateRequest
		if err := dec.Decode(&req); err != nil {
			writeErr(w, fmt.Errorf("bad body: %w", errdefs.ErrInvalidArgument), "body")
			return
		}
		if req.Memory == "lots" {
			writeErr(w, fmt.Errorf("memory %q: %w", req.Memory, errdefs.ErrInvalidArgument), "memory")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.lastBody = string(b)
		f.next++
		sb := &Sandbox{Sandbox: types.Sandbox{ID: fmt.Sprintf("sb%d", f.next), State: StateReady, Template: req.Template, CPU: req.CPU,
			Labels: req.Labels, Env: req.Env, CreatedAt: time.Unix(1700000000, 0).UTC()}}
		f.sandboxes[sb.ID] = sb
		writeJSON(w, 201, sb)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.lastQuery = r.URL.RawQuery
		var out []*Sandbox
		for _, sb := range f.sandboxes {
			out = append(out, sb)
		}
		writeJSON(w, 200, map[string]any{"sandboxes": out})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		sb, ok := f.sandboxes[r.PathValue("id")]
		if !ok {
			writeErr(w, fmt.Errorf("sandbox %s: %w", r.PathValue("id"), errdefs.ErrNotFound), "")
			return
		}
		cp := *sb
		cp.Usage = &Usage{CPUSeconds: 0.5, PIDs: 2}
		writeJSON(w, 200, &cp)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.sandboxes[r.PathValue("id")]; !ok {
			writeErr(w, fmt.Errorf("sandbox %s: %w", r.PathValue("id"), errdefs.ErrNotFound), "")
			return
		}
		delete(f.sandboxes, r.PathValue("id"))
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Timeout string `json:"timeout"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		d, err := time.ParseDuration(body.Timeout)
		if err != nil {
			writeErr(w, fmt.Errorf("timeout: %w", errdefs.ErrInvalidArgument), "timeout")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		sb, ok := f.sandboxes[r.PathValue("id")]
		if !ok {
			writeErr(w, errdefs.ErrNotFound, "")
			return
		}
		sb.Deadline = time.Unix(1700000000, 0).Add(d).UTC()
		writeJSON(w, 200, sb)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		evs := []Event{
			{Time: time.Unix(1, 0).UTC(), SandboxID: r.PathValue("id"), Type: EventCreated},
			{Time: time.Unix(2, 0).UTC(), SandboxID: r.PathValue("id"), Type: EventReady},
		}
		if r.URL.Query().Get("follow") != "true" {
			writeJSON(w, 200, map[string]any{"events": evs})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		evs = append(evs, Event{Time: time.Unix(3, 0).UTC(), SandboxID: r.PathValue("id"), Type: EventDestroyed})
		enc := json.NewEncoder(w)
		for _, ev := range evs {
			_ = enc.Encode(ev)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"templates": []Template{{Name: "base", Built: true}}})
	})
	mux.HandleFunc("POST /v1/templates/{name}/build", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		if r.PathValue("name") == "broken" {
			fmt.Fprintln(w, `{"log":"step 1"}`)
			fmt.Fprintln(w, `{"error":{"code":"failed_precondition","message":"build failed"}}`)
			return
		}
		fmt.Fprintln(w, `{"log":"step 1"}`)
		fmt.Fprintln(w, `{"log":"step 2\n"}`)
		fmt.Fprintf(w, `{"template":{"name":%q,"built":true,"size_bytes":42}}`+"\n", r.PathValue("name"))
	})
	return mux
}

func TestControlPlane(t *testing.T) {
	f, c := newFakeDaemon(t)
	ctx := t.Context()

	h, err := c.Health(ctx)
	if err != nil || h.Status != "ok" {
		t.Fatalf("Health() = %+v, %v; want ok", h, err)
	}

	sb, err := c.Create(ctx, CreateRequest{Template: "minimal", CPU: 0.5, Memory: "256M", Labels: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sb.ID == "" || sb.State != StateReady || sb.Template != "minimal" {
		t.Fatalf("Create() = %+v", sb)
	}
	// Unset optional fields must not be sent: the daemon fills defaults.
	if strings.Contains(f.lastBody, "disk") || strings.Contains(f.lastBody, "timeout") {
		t.Errorf("create body %s sends unset fields", f.lastBody)
	}

	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.Usage == nil || got.Usage.PIDs != 2 {
		t.Fatalf("Get(%q) = %+v, %v", sb.ID, got, err)
	}

	list, err := c.List(ctx, ListOptions{Labels: map[string]string{"b": "2", "a": "1"}, State: StateReady})
	if err != nil || len(list) != 1 {
		t.Fatalf("List() = %v, %v; want 1 sandbox", list, err)
	}
	if want := "label=a%3D1&label=b%3D2&state=ready"; f.lastQuery != want {
		t.Errorf("List query = %q, want %q", f.lastQuery, want)
	}

	upd, err := c.SetTimeout(ctx, sb.ID, 30*time.Minute)
	if err != nil || !upd.Deadline.Equal(time.Unix(1700000000, 0).Add(30*time.Minute)) {
		t.Fatalf("SetTimeout = %+v, %v", upd, err)
	}

	evs, err := c.Events(ctx, sb.ID)
	if err != nil || len(evs) != 2 || evs[1].Type != EventReady {
		t.Fatalf("Events = %+v, %v", evs, err)
	}
	var followed []string
	if err := c.FollowEvents(ctx, sb.ID, func(ev Event) error {
		followed = append(followed, ev.Type)
		return nil
	}); err != nil {
		t.Fatalf("FollowEvents: %v", err)
	}
	if want := "created,ready,destroyed"; strings.Join(followed, ",") != want {
		t.Errorf("FollowEvents types = %v, want %s", followed, want)
	}
	stop := errors.New("stop")
	if err := c.FollowEvents(ctx, sb.ID, func(Event) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("FollowEvents with failing callback = %v, want %v", err, stop)
	}

	if err := sb.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Kill = %v, want not found", err)
	}
	if err := c.Kill(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Kill twice = %v, want not found", err)
	}
}

func TestTemplates(t *testing.T) {
	_, c := newFakeDaemon(t)
	ctx := t.Context()
	ts, err := c.Templates(ctx)
	if err != nil || len(ts) != 1 || ts[0].Name != "base" {
		t.Fatalf("Templates() = %+v, %v", ts, err)
	}
	var log bytes.Buffer
	tmpl, err := c.BuildTemplate(ctx, "minimal", &log)
	if err != nil || tmpl.Name != "minimal" || tmpl.SizeBytes != 42 {
		t.Fatalf("BuildTemplate = %+v, %v", tmpl, err)
	}
	if log.String() != "step 1\nstep 2\n" {
		t.Errorf("build log = %q", log.String())
	}
	_, err = c.BuildTemplate(ctx, "broken", io.Discard)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("BuildTemplate(broken) = %v, want failed precondition", err)
	}
}

func TestErrorDecoding(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		wantCode string
		wantIs   error
		wantText string
	}{
		{"coded", 404, `{"code":"not_found","message":"sandbox x: not found"}`, "not_found", errdefs.ErrNotFound, "sandbox x: not found"},
		{"field", 400, `{"code":"invalid_argument","message":"bad size","field":"memory"}`, "invalid_argument", errdefs.ErrInvalidArgument, "bad size"},
		{"field named", 400, `{"code":"invalid_argument","message":"memory: bad size","field":"memory"}`, "invalid_argument", errdefs.ErrInvalidArgument, "memory: bad size"},
		{"policy", 403, `{"code":"policy_denied","message":"no"}`, "policy_denied", errdefs.ErrPolicyDenied, "no"},
		{"plain text", 503, "upstream down", "unavailable", errdefs.ErrUnavailable, "upstream down"},
		{"empty", 504, "", "deadline_exceeded", errdefs.ErrDeadlineExceeded, "504 Gateway Timeout"},
		{"internal", 500, `{"code":"internal","message":"boom"}`, "internal", nil, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c, err := New(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Get(t.Context(), "x")
			var e *errdefs.Error
			if !errors.As(err, &e) {
				t.Fatalf("Get error = %T %v, want *errdefs.Error", err, err)
			}
			if e.Code != tt.wantCode || e.Message != tt.wantText {
				t.Errorf("error = {%q %q}, want {%q %q}", e.Code, e.Message, tt.wantCode, tt.wantText)
			}
			if strings.Contains(tt.body, `"field":"memory"`) && e.Field != "memory" {
				t.Errorf("error field = %q, want memory", e.Field)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			if got := ErrorCode(err); got != tt.wantCode {
				t.Errorf("ErrorCode = %q, want %q", got, tt.wantCode)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		url     string
		wantErr bool
	}{
		{"http://127.0.0.1:2378", false},
		{"http://127.0.0.1:2378/", false},
		{"https://berth.example", false},
		{"127.0.0.1:2378", true},
		{"ftp://x", true},
		{"http://", true},
	}
	for _, tt := range tests {
		_, err := New(tt.url)
		if (err != nil) != tt.wantErr {
			t.Errorf("New(%q) error = %v, want error %v", tt.url, err, tt.wantErr)
		}
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv("BERTH_URL", "")
	c, err := FromEnv()
	if err != nil || c.URL() != DefaultURL {
		t.Fatalf("FromEnv() with no BERTH_URL = %v, %v; want %s", c, err, DefaultURL)
	}
	t.Setenv("BERTH_URL", "http://127.0.0.1:9999/")
	c, err = FromEnv()
	if err != nil || c.URL() != "http://127.0.0.1:9999" {
		t.Fatalf("FromEnv() = %v, %v", c, err)
	}
}

func TestUnboundHandle(t *testing.T) {
	var sb Sandbox
	if err := sb.Kill(t.Context()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Kill on a decoded-only Sandbox = %v, want failed precondition", err)
	}
}

func TestUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	c, err := New(url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.List(t.Context(), ListOptions{})
	if !errors.Is(err, errdefs.ErrUnavailable) || ErrorCode(err) != errdefs.CodeUnavailable {
		t.Errorf("List with no daemon = %v (code %s), want unavailable", err, ErrorCode(err))
	}
	if !strings.Contains(err.Error(), url) {
		t.Errorf("error %q does not name the daemon URL", err)
	}
}
