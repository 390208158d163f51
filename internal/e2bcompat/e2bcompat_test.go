package e2bcompat

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/usage"
	"github.com/berth-sandbox/berth/proto/envd"
)

func TestParseHost(t *testing.T) {
	tests := []struct {
		host, domain string
		id           string
		port         int
		ok           bool
	}{
		{"8080-abc123.berth.localhost", "berth.localhost", "abc123", 8080, true},
		{"49983-abc123.berth.localhost:2378", "berth.localhost", "abc123", 49983, true},
		{"8080-ABC123.Berth.Localhost", "berth.localhost", "abc123", 8080, true},
		{"8080-abc123.example.com", "berth.localhost", "", 0, false},
		{"8080-abc-123.berth.localhost", "berth.localhost", "", 0, false},
		{"0-abc.berth.localhost", "berth.localhost", "", 0, false},
		{"65536-abc.berth.localhost", "berth.localhost", "", 0, false},
		{"x80-abc.berth.localhost", "berth.localhost", "", 0, false},
		{"8080-.berth.localhost", "berth.localhost", "", 0, false},
		{"8080-abc.sub.berth.localhost", "berth.localhost", "", 0, false},
		{"berth.localhost", "berth.localhost", "", 0, false},
		{"127.0.0.1:2378", "berth.localhost", "", 0, false},
		{"8080-abc.berth.localhost", "", "", 0, false},
	}
	for _, tt := range tests {
		id, port, ok := ParseHost(tt.host, tt.domain)
		if id != tt.id || port != tt.port || ok != tt.ok {
			t.Errorf("ParseHost(%q, %q) = %q, %d, %v, want %q, %d, %v", tt.host, tt.domain, id, port, ok, tt.id, tt.port, tt.ok)
		}
	}
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"8080-abc.berth.localhost", "1-a.berth.localhost:1", "-.berth.localhost", "[::1]:80", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		id, port, ok := ParseHost(host, "berth.localhost")
		if !ok {
			return
		}
		if !validID(id) || port < 1 || port > 65535 {
			t.Errorf("ParseHost(%q) = %q, %d: accepted an invalid target", host, id, port)
		}
	})
}

// fakeManager holds sandboxes (and snapshots) in memory.
type fakeManager struct {
	sbs   map[string]sandbox.Sandbox
	snaps map[string]core.Snapshot
	// lastCreate is the last create request it was given.
	lastCreate sandbox.CreateRequest
}

func (f *fakeManager) SetNetworkPolicy(ctx context.Context, id string, p policy.Policy) (policy.Policy, error) {
	return p, nil
}

func (f *fakeManager) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	f.lastCreate = req
	sb := sandbox.Sandbox{Sandbox: core.Sandbox{ID: "sb" + string(rune('a'+len(f.sbs))), State: string(sandbox.StateReady), Template: req.Template,
		Owner: req.Owner, Metadata: req.Metadata, User: req.User, Token: "tok", CreatedAt: time.Now(), Deadline: time.Now().Add(req.Timeout),
		OnTimeout: req.OnTimeout, AutoResume: req.AutoResume}}
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fakeManager) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	sb, ok := f.sbs[id]
	if !ok {
		return sb, errdefs.ErrNotFound
	}
	return sb, nil
}

func (f *fakeManager) ListOwned(ctx context.Context, opts sandbox.OwnedListOptions) ([]sandbox.Sandbox, error) {
	var out []sandbox.Sandbox
	for _, sb := range f.sbs {
		if sb.Owner == opts.Owner {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (f *fakeManager) List(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.Sandbox, error) {
	var out []sandbox.Sandbox
	for _, sb := range f.sbs {
		out = append(out, sb)
	}
	return out, nil
}

func (f *fakeManager) Destroy(ctx context.Context, id, reason string) error {
	delete(f.sbs, id)
	return nil
}

func (f *fakeManager) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return f.sbs[id], nil
}

func (f *fakeManager) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	sb := f.sbs[id]
	sb.State, sb.Pause = string(sandbox.StatePaused), core.PauseFilesystem
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeManager) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	sb := f.sbs[id]
	sb.State, sb.Pause = string(sandbox.StateReady), ""
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeManager) AgentSession(ctx context.Context, id string) (context.Context, sandbox.AgentEndpoint, context.CancelFunc, error) {
	return nil, sandbox.AgentEndpoint{}, nil, errdefs.ErrNotFound
}

func (f *fakeManager) CheckRunning(ctx context.Context, id string) {}

func TestControlPlaneAuth(t *testing.T) {
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	keys := NewKeys(db)
	_, k1, err := keys.Create(t.Context(), "one")
	if err != nil {
		t.Fatal(err)
	}
	rec2, k2, err := keys.Create(t.Context(), "two")
	if err != nil {
		t.Fatal(err)
	}
	native := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := New(Config{Manager: &fakeManager{sbs: map[string]sandbox.Sandbox{}}, Store: db, Keys: keys, Native: native})
	do := func(method, path, key, body string) (int, map[string]any) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		var out map[string]any
		json.Unmarshal(w.Body.Bytes(), &out)
		return w.Code, out
	}
	if code, _ := do("GET", "/v1/health", "", ""); code != http.StatusTeapot {
		t.Errorf("GET /v1/health went to %d, want the native API", code)
	}
	for _, key := range []string{"", "e2b_ffff", "nope"} {
		code, body := do("GET", "/v2/sandboxes", key, "")
		if code != 401 || body["code"] != float64(401) {
			t.Errorf("list with key %q = %d %v, want 401 with code 401", key, code, body)
		}
	}
	code, body := do("POST", "/sandboxes", k1, `{"templateID":"base","metadata":{"a":"b"},"extra":1}`)
	if code != 201 {
		t.Fatalf("create = %d %v", code, body)
	}
	id := body["sandboxID"].(string)
	if body["envdAccessToken"] != "tok" || body["domain"] != DefaultDomain || body["envdVersion"] != envd.Version {
		t.Errorf("create answered %v", body)
	}
	if code, _ := do("GET", "/sandboxes/"+id, k2, ""); code != 404 {
		t.Errorf("get with another key = %d, want 404", code)
	}
	if code, _ := do("DELETE", "/sandboxes/"+id, k2, ""); code != 404 {
		t.Errorf("delete with another key = %d, want 404", code)
	}
	if code, _ := do("POST", "/sandboxes/"+id+"/pause", k2, ""); code != 404 {
		t.Errorf("pause with another key = %d, want 404", code)
	}
	if code, _ := do("POST", "/sandboxes/"+id+"/pause", k1, ""); code != 204 {
		t.Errorf("pause = %d, want 204", code)
	}
	if code, _ := do("POST", "/sandboxes/"+id+"/pause", k1, ""); code != 409 {
		t.Errorf("pause of a paused sandbox = %d, want 409 (already paused)", code)
	}
	if code, _ := do("GET", "/v2/sandboxes?state=paused", k1, ""); code != 200 {
		t.Errorf("list paused = %d, want 200", code)
	}
	if code, _ := do("POST", "/sandboxes/"+id+"/connect", k1, `{"timeout":60}`); code != 201 {
		t.Errorf("connect to a paused sandbox = %d, want 201 (resumed)", code)
	}
	if code, _ := do("POST", "/sandboxes/"+id+"/resume", k1, ""); code != 409 {
		t.Errorf("resume of a running sandbox = %d, want 409", code)
	}
	if code, _ := do("GET", "/sandboxes/"+id, k1, ""); code != 200 {
		t.Errorf("get with the owner's key = %d, want 200", code)
	}
	if err := keys.Revoke(t.Context(), rec2.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := do("GET", "/v2/sandboxes", k2, ""); code != 401 {
		t.Errorf("list with a revoked key = %d, want 401", code)
	}
	if code, _ := do("DELETE", "/sandboxes/"+id, k1, ""); code != 204 {
		t.Errorf("delete with the owner's key = %d, want 204", code)
	}
}

func TestEgressPolicy(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		in       e2bwire.NetworkConfig
		update   bool
		mode     policy.Mode
		allow    string
		deny     string
		internet bool
		wantErr  bool
	}{
		// A create that says nothing gets Berth's default, no egress; an
		// update that says nothing clears every rule, as on E2B.
		{in: e2bwire.NetworkConfig{}, mode: policy.ModeNone},
		{in: e2bwire.NetworkConfig{}, update: true, mode: policy.ModeOpen, internet: true},
		{in: e2bwire.NetworkConfig{AllowInternetAccess: &no}, mode: policy.ModeNone},
		{in: e2bwire.NetworkConfig{AllowInternetAccess: &no}, update: true, mode: policy.ModeNone},
		{in: e2bwire.NetworkConfig{AllowInternetAccess: &yes}, mode: policy.ModeOpen, internet: true},
		{in: e2bwire.NetworkConfig{AllowInternetAccess: &yes, DenyOut: []string{"198.51.100.7"}}, mode: policy.ModeOpen, deny: "198.51.100.7/32", internet: true},
		// Denying some destinations means the rest is open, create or update.
		{in: e2bwire.NetworkConfig{DenyOut: []string{"198.51.100.7"}}, mode: policy.ModeOpen, deny: "198.51.100.7/32", internet: true},
		{in: e2bwire.NetworkConfig{DenyOut: []string{"198.51.100.7"}}, update: true, mode: policy.ModeOpen, deny: "198.51.100.7/32", internet: true},
		{in: e2bwire.NetworkConfig{AllowInternetAccess: &yes, DenyOut: []string{"0.0.0.0/0"}}, mode: policy.ModeNone},
		{in: e2bwire.NetworkConfig{AllowOut: []string{"example.com", "198.51.100.0/24"}, DenyOut: []string{"0.0.0.0/0"}}, mode: policy.ModeAllow, allow: "example.com,198.51.100.0/24"},
		{in: e2bwire.NetworkConfig{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}}, update: true, mode: policy.ModeAllow, allow: "example.com"},
		{in: e2bwire.NetworkConfig{AllowInternetAccess: &no, AllowOut: []string{"198.51.100.1"}}, mode: policy.ModeAllow, allow: "198.51.100.1/32"},
		// allowOut alone is an allow list (stricter than E2B).
		{in: e2bwire.NetworkConfig{AllowOut: []string{"example.com"}}, update: true, mode: policy.ModeAllow, allow: "example.com"},
		// Open with an allowOut outside the denied ranges: nothing to add.
		{in: e2bwire.NetworkConfig{AllowOut: []string{"example.com", "203.0.113.1"}, DenyOut: []string{"198.51.100.0/24"}}, mode: policy.ModeOpen, deny: "198.51.100.0/24", internet: true},
		// An allowOut inside a partial denyOut would stay denied in Berth.
		{in: e2bwire.NetworkConfig{AllowOut: []string{"198.51.100.1"}, DenyOut: []string{"198.51.100.0/24"}}, wantErr: true},
		{in: e2bwire.NetworkConfig{DenyOut: []string{"not-an-ip"}}, wantErr: true},
		{in: e2bwire.NetworkConfig{DenyOut: []string{"example.com"}}, update: true, wantErr: true},
		{in: e2bwire.NetworkConfig{AllowOut: []string{"bad domain!"}}, wantErr: true},
		{in: e2bwire.NetworkConfig{Rules: []byte(`{"x":1}`)}, wantErr: true},
	}
	for _, tt := range tests {
		p, internet, err := e2bwire.EgressPolicy(tt.in, tt.update, false)
		if tt.wantErr {
			if err == nil {
				t.Errorf("e2bwire.EgressPolicy(%+v, update %v) = %+v, want an error", tt.in, tt.update, p)
			} else if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("e2bwire.EgressPolicy(%+v) = %v, want invalid argument", tt.in, err)
			}
			continue
		}
		if err != nil || p.Mode != tt.mode || strings.Join(p.Allow, ",") != tt.allow || strings.Join(p.Deny, ",") != tt.deny || internet != tt.internet {
			t.Errorf("e2bwire.EgressPolicy(%+v, update %v) = %+v, internet %v, %v; want mode %s allow %q deny %q internet %v", tt.in, tt.update, p, internet, err, tt.mode, tt.allow, tt.deny, tt.internet)
		}
	}
}

func TestStoredNetwork(t *testing.T) {
	no := false
	n := e2bwire.NetworkConfig{AllowOut: []string{"a.test"}, AllowPublicTraffic: &no}
	cfg, internet := e2bwire.StoredNetwork(n.StoreJSON(true))
	if !internet || string(cfg) != `{"allowOut":["a.test"],"allowPublicTraffic":false}` {
		t.Errorf("storedNetwork = %s, %v", cfg, internet)
	}
	// Records written before the flag was kept mean no internet.
	if cfg, internet := e2bwire.StoredNetwork(`{"allowOut":["a.test"]}`); internet || string(cfg) != `{"allowOut":["a.test"]}` {
		t.Errorf("e2bwire.StoredNetwork(old record) = %s, %v", cfg, internet)
	}
	if cfg, internet := e2bwire.StoredNetwork(""); internet || cfg != nil {
		t.Errorf("e2bwire.StoredNetwork(\"\") = %s, %v", cfg, internet)
	}
}

// newTestServer returns a server over a fake manager and a real store, with
// one API key.
func newTestServer(t *testing.T, mgr *fakeManager) (*Server, string, core.APIKey) {
	t.Helper()
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	keys := NewKeys(db)
	rec, secret, err := keys.Create(t.Context(), "one")
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Manager: mgr, Store: db, Keys: keys}), secret, rec
}

// serve sends a GET of path with key to srv and returns the answer.
func serve(srv http.Handler, key, path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", path, nil)
	req.Header.Set("X-API-Key", key)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	return w
}

func listIDs(t *testing.T, srv *Server, key, query string) ([]string, string) {
	t.Helper()
	req := httptest.NewRequest("GET", "/v2/sandboxes?"+query, nil)
	req.Header.Set("X-API-Key", key)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	if w.Code != 200 {
		t.Fatalf("list ?%s = %d %s", query, w.Code, w.Body)
	}
	var out []e2bwire.ListedBody
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, l := range out {
		ids = append(ids, l.SandboxID)
	}
	return ids, w.Header().Get("X-Next-Token")
}

func TestListOrderFiltersAndPages(t *testing.T) {
	mgr := &fakeManager{sbs: map[string]sandbox.Sandbox{}}
	srv, key, rec := newTestServer(t, mgr)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	add := func(id, tmpl string, at time.Time) {
		mgr.sbs[id] = sandbox.Sandbox{Sandbox: core.Sandbox{ID: id, State: string(sandbox.StateReady), Template: tmpl, Owner: rec.ID, CreatedAt: at}}
	}
	add("sba", "base", t0)
	add("sbb", "py", t0.Add(time.Second))
	add("sbc", "base", t0.Add(2*time.Second))
	add("sbd", "base", t0.Add(2*time.Second)) // same start: the ID breaks the tie
	add("sbe", "py", t0.Add(3*time.Second))

	tests := []struct{ query, want string }{
		{"", "sbe,sbd,sbc,sbb,sba"},
		{"order=desc", "sbe,sbd,sbc,sbb,sba"},
		{"order=asc", "sba,sbb,sbc,sbd,sbe"},
		{"template=base", "sbd,sbc,sba"},
		{"template=unknown-template", ""},
		{"startedAfter=" + t0.Add(2*time.Second).Format(time.RFC3339), "sbe,sbd,sbc"},
		{"startedBefore=" + t0.Add(time.Second).Format(time.RFC3339), "sbb,sba"},
		{"startedAfter=" + t0.Add(time.Second).Format(time.RFC3339) + "&startedBefore=" + t0.Add(2*time.Second).Format(time.RFC3339) + "&template=base&order=asc", "sbc,sbd"},
	}
	for _, tt := range tests {
		if got, _ := listIDs(t, srv, key, tt.query); strings.Join(got, ",") != tt.want {
			t.Errorf("list ?%s = %v, want %s", tt.query, got, tt.want)
		}
	}

	// Pages: what is created between two pages does not shift the rest
	// (newest first, so it sorts before the cursor).
	for _, order := range []string{"desc", "asc"} {
		var all []string
		q := "limit=2&order=" + order
		page, next := listIDs(t, srv, key, q)
		all = append(all, page...)
		add("sbz"+order[:1], "base", t0.Add(time.Hour))
		for next != "" {
			page, next = listIDs(t, srv, key, q+"&nextToken="+next)
			all = append(all, page...)
		}
		delete(mgr.sbs, "sbz"+order[:1])
		want := map[string]string{"desc": "sbe,sbd,sbc,sbb,sba", "asc": "sba,sbb,sbc,sbd,sbe,sbza"}[order]
		if strings.Join(all, ",") != want {
			t.Errorf("paging %s with a create in between = %v, want %s", order, all, want)
		}
	}

	for _, bad := range []string{"order=sideways", "startedAfter=yesterday", "state=dead", "nextToken=zz"} {
		req := httptest.NewRequest("GET", "/v2/sandboxes?"+bad, nil)
		req.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		if w.Code != 400 {
			t.Errorf("list ?%s = %d, want 400", bad, w.Code)
		}
	}
}

func TestUnimplementedRoutesAre501(t *testing.T) {
	srv, key, _ := newTestServer(t, &fakeManager{sbs: map[string]sandbox.Sandbox{}})
	for _, rt := range []string{
		"GET /sandboxes/abc/logs", "GET /v2/sandboxes/abc/logs", "GET /templates",
		"DELETE /templates/team/base:v1", "DELETE /templates/Base-Image", "GET /templates/base",
		"GET /templates/aliases/base", "POST /v3/templates", "GET /volumes", "GET /teams", "POST /secrets",
	} {
		method, path, _ := strings.Cut(rt, " ")
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		var body e2bwire.ErrorBody
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != 501 || body.Code != 501 || !strings.Contains(body.Message, "not implemented by Berth: ") {
			t.Errorf("%s = %d %s, want 501 naming what is missing", rt, w.Code, w.Body)
		}
	}
	req := httptest.NewRequest("GET", "/no/such/route", nil)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	if w.Code != 404 {
		t.Errorf("GET /no/such/route = %d, want 404", w.Code)
	}
}

func TestSignedFilesFindTheirSandbox(t *testing.T) {
	mgr := &fakeManager{sbs: map[string]sandbox.Sandbox{}}
	for _, id := range []string{"sba", "sbb"} {
		mgr.sbs[id] = sandbox.Sandbox{Sandbox: core.Sandbox{ID: id, State: string(sandbox.StateReady), Token: "token-of-" + id}}
	}
	srv, _, _ := newTestServer(t, mgr)
	do := func(method, query string) (int, string) {
		req := httptest.NewRequest(method, "/files?"+query, nil)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	sig := envd.FileSignature("/tmp/x", "read", "", "token-of-sbb", 0)
	// The fake has no agent for the sandbox: reaching serveSandbox for sbb
	// shows the signature found it.
	if code, body := do("GET", "path=/tmp/x&signature="+sig); code != 502 || !strings.Contains(body, `The sandbox was not found: \"sbb\"`) {
		t.Errorf("signed read = %d %s, want the proxy's answer for sbb", code, body)
	}
	if code, _ := do("POST", "path=/tmp/x&signature="+sig); code != 401 {
		t.Errorf("read signature used for a write = %d, want 401", code)
	}
	if code, _ := do("GET", "path=/tmp/y&signature="+sig); code != 401 {
		t.Errorf("signature for another path = %d, want 401", code)
	}
	if code, _ := do("GET", "path=/tmp/x&signature=v1_bogus"); code != 401 {
		t.Errorf("unknown signature = %d, want 401", code)
	}
	expired := envd.FileSignature("/tmp/x", "read", "", "token-of-sba", 1)
	if code, body := do("GET", "path=/tmp/x&signature="+expired+"&signature_expiration=1"); code != 401 || !strings.Contains(body, "expired") {
		t.Errorf("expired signature = %d %s, want 401 expired", code, body)
	}
	if code, _ := do("DELETE", "path=/tmp/x&signature="+sig); code != 405 {
		t.Errorf("DELETE signed = %d, want 405", code)
	}
}

func TestMetricsHistory(t *testing.T) {
	mgr := &fakeManager{sbs: map[string]sandbox.Sandbox{}}
	srv, key, rec := newTestServer(t, mgr)
	history := usage.NewHistory(5*time.Second, 0)
	srv.cfg.History = history
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	set := func(at time.Duration, cpu time.Duration, mem int64) {
		st := runtime.Stats{CPUUsage: cpu, MemoryBytes: mem, MemoryLimit: 512 << 20}
		mgr.sbs["sba"] = sandbox.Sandbox{
			Sandbox: core.Sandbox{ID: "sba", State: string(sandbox.StateReady), Owner: rec.ID, CPUMillis: 1000, MemoryBytes: 512 << 20, CreatedAt: t0},
			Usage:   &st,
		}
		history.Observe(sandbox.UsageSample{ID: "sba", Owner: rec.ID, Time: t0.Add(at), Stats: st})
	}
	set(5*time.Second, 0, 1<<20)
	set(10*time.Second, 2500*time.Millisecond, 2<<20) // half of one CPU over 5 s
	set(15*time.Second, 2500*time.Millisecond, 3<<20)

	get := func(query string) []e2bwire.MetricBody {
		t.Helper()
		w := serve(srv, key, "/sandboxes/sba/metrics?"+query)
		if w.Code != 200 {
			t.Fatalf("metrics ?%s = %d %s", query, w.Code, w.Body)
		}
		var out []e2bwire.MetricBody
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	unix := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }
	ms := get("start=" + unix(0) + "&end=" + unix(20*time.Second))
	if len(ms) != 3 || ms[0].MemUsed != 1<<20 || ms[1].MemUsed != 2<<20 || ms[2].MemUsed != 3<<20 {
		t.Fatalf("metrics over the history = %+v", ms)
	}
	if ms[1].CPUUsedPct != 50 || ms[2].CPUUsedPct != 0 || ms[1].TimestampUnix != t0.Add(10*time.Second).Unix() ||
		ms[1].CPUCount != 1 || ms[1].MemTotal != 512<<20 {
		t.Errorf("second sample = %+v, third %+v", ms[1], ms[2])
	}
	if ms := get("start=" + unix(10*time.Second) + "&end=" + unix(10*time.Second)); len(ms) != 1 || ms[0].MemUsed != 2<<20 {
		t.Errorf("metrics at one second = %+v", ms)
	}
	for _, q := range []string{"start=" + unix(-time.Hour) + "&end=" + unix(-time.Minute), "start=" + unix(20*time.Second) + "&end=" + unix(10*time.Second)} {
		if ms := get(q); len(ms) != 0 {
			t.Errorf("metrics ?%s = %+v, want []", q, ms)
		}
	}
	// No range: the whole history, then a sample taken now.
	if ms := get(""); len(ms) != 4 || ms[3].TimestampUnix < time.Now().Unix()-1 || ms[3].MemUsed != 3<<20 {
		t.Errorf("metrics without a range = %+v", ms)
	}
	// A start alone: from there, and now.
	if ms := get("start=" + unix(12*time.Second)); len(ms) != 2 || ms[0].MemUsed != 3<<20 {
		t.Errorf("metrics from 12 s = %+v", ms)
	}
	// Many at once: a reading taken now of each running one asked for.
	w := serve(srv, key, "/sandboxes/metrics?sandbox_ids=sba,nosuchsandbox&sandbox_ids=sba")
	var many e2bwire.ManyMetricsBody
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &many) != nil || len(many.Sandboxes) != 1 || many.Sandboxes["sba"].MemUsed != 3<<20 ||
		many.Sandboxes["sba"].TimestampUnix < time.Now().Unix()-1 {
		t.Errorf("GET /sandboxes/metrics = %d %s", w.Code, w.Body)
	}
	var tooMany []string
	for i := range e2bwire.MaxMetricsIDs + 1 {
		tooMany = append(tooMany, "s"+strconv.Itoa(i))
	}
	for _, q := range []string{"", "?sandbox_ids=,", "?sandbox_ids=" + strings.Join(tooMany, ",")} {
		if w := serve(srv, key, "/sandboxes/metrics"+q); w.Code != 400 || !strings.Contains(w.Body.String(), "sandbox_ids") {
			t.Errorf("GET /sandboxes/metrics%s = %d %s, want 400 on sandbox_ids", q, w.Code, w.Body)
		}
	}
	for _, q := range []string{"start=soon", "end=1.5"} {
		if w := serve(srv, key, "/sandboxes/sba/metrics?"+q); w.Code != 400 {
			t.Errorf("metrics ?%s = %d %s, want 400", q, w.Code, w.Body)
		}
	}
}

// TestEgressPolicyDefaultNetworkNone: under e2b_default_network: none,
// asking for internet access gets no egress (allowOut entries still get
// out), and getInfo reports no internet.
func TestEgressPolicyDefaultNetworkNone(t *testing.T) {
	yes := true
	p, internet, err := e2bwire.EgressPolicy(e2bwire.NetworkConfig{AllowInternetAccess: &yes}, false, true)
	if err != nil || p.Mode != policy.ModeNone || internet {
		t.Errorf("e2bwire.EgressPolicy(internet, none) = %+v, internet %v, %v; want mode none, no internet", p, internet, err)
	}
	p, internet, err = e2bwire.EgressPolicy(e2bwire.NetworkConfig{AllowInternetAccess: &yes, AllowOut: []string{"198.51.100.1"}}, false, true)
	if err != nil || p.Mode != policy.ModeAllow || len(p.Allow) != 1 || internet {
		t.Errorf("e2bwire.EgressPolicy(internet + allowOut, none) = %+v, internet %v, %v; want mode allow with one entry", p, internet, err)
	}
	p, internet, err = e2bwire.EgressPolicy(e2bwire.NetworkConfig{AllowInternetAccess: &yes}, false, false)
	if err != nil || p.Mode != policy.ModeOpen || !internet {
		t.Errorf("e2bwire.EgressPolicy(internet, open) = %+v, internet %v, %v; want mode open", p, internet, err)
	}
}

// TestCreateAllowsSudo: E2B sandboxes get sudo for their user (as E2B's
// base image gives it), unless the operator turned it off.
func TestCreateAllowsSudo(t *testing.T) {
	for _, noSudo := range []bool{false, true} {
		mgr := &fakeManager{sbs: map[string]sandbox.Sandbox{}}
		srv, key, _ := newTestServer(t, mgr)
		srv.cfg.NoSudo = noSudo
		req := httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
		req.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		if w.Code != 201 {
			t.Fatalf("create = %d %s", w.Code, w.Body)
		}
		// Always said, never left to a snapshot's default.
		if got := mgr.lastCreate.AllowSudo; got == nil || *got == noSudo {
			t.Errorf("NoSudo %v: create asked AllowSudo %v, want %v", noSudo, got, !noSudo)
		}
	}
}

// TestSandboxLogs: E2B's sandbox logs are what the host recorded of the
// caller's sandbox (Records), v1 and v2; another key's is not found.
func TestSandboxLogs(t *testing.T) {
	mgr := &fakeManager{sbs: map[string]sandbox.Sandbox{}}
	srv, key, rec := newTestServer(t, mgr)
	mgr.sbs["sba"] = sandbox.Sandbox{Sandbox: core.Sandbox{ID: "sba", State: string(sandbox.StateReady), Owner: rec.ID, CreatedAt: time.Now()}}
	mgr.sbs["sbb"] = sandbox.Sandbox{Sandbox: core.Sandbox{ID: "sbb", State: string(sandbox.StateReady), Owner: "another key", CreatedAt: time.Now()}}
	srv2 := New(Config{Manager: mgr, Store: srv.cfg.Store, Keys: srv.cfg.Keys,
		Records: func(_ context.Context, id string) ([]types.Event, []types.WorklogEntry, error) {
			return []types.Event{{Time: time.Unix(100, 0), SandboxID: id, Type: types.EventReady}},
				[]types.WorklogEntry{{Time: time.Unix(101, 0), Kind: "exec", Cmd: "make", Exited: true, ExitCode: 1}}, nil
		}})
	get := func(path string) (int, []byte) {
		w := serve(srv2, key, path)
		return w.Code, w.Body.Bytes()
	}
	code, body := get("/v2/sandboxes/sba/logs?level=warn")
	var v2 e2bwire.LogsV2Body
	if code != 200 || json.Unmarshal(body, &v2) != nil || len(v2.Logs) != 1 || v2.Logs[0].Message != "exec make (exit 1)" || v2.Logs[0].Level != "warn" {
		t.Errorf("v2 logs = %d %s", code, body)
	}
	code, body = get("/sandboxes/sba/logs")
	var v1 e2bwire.LogsBody
	if code != 200 || json.Unmarshal(body, &v1) != nil || len(v1.Logs) != 2 || v1.Logs[0].Line != "[info] ready" {
		t.Errorf("v1 logs = %d %s", code, body)
	}
	if code, body := get("/v2/sandboxes/sbb/logs"); code != 404 {
		t.Errorf("another key's logs = %d %s", code, body)
	}
	if code, body := get("/v2/sandboxes/sba/logs?direction=sideways"); code != 400 {
		t.Errorf("a bad direction = %d %s", code, body)
	}
}
