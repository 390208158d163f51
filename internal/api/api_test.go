package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// TestOpenAPIMatchesRoutes holds the checked-in document to the route
// table the mux is built from, in both directions: every route is
// documented with its method, and every documented operation is served.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	// OpenAPI names the proxy's catch-all {path}; the mux, {rest...}.
	docPath := func(pattern string) string { return strings.ReplaceAll(pattern, "{rest...}", "{path}") }
	served := map[string]map[string]bool{}
	for _, r := range (&Server{}).routeTable() {
		p := docPath(r.pattern)
		if served[p] == nil {
			served[p] = map[string]bool{}
		}
		served[p][strings.ToLower(r.method)] = true
		item, ok := doc.Paths[p]
		if !ok {
			t.Errorf("route %s %s is missing from openapi.json", r.method, p)
			continue
		}
		if r.method == "" {
			continue // any method: the operations documented are examples
		}
		if _, ok := item[strings.ToLower(r.method)]; !ok {
			t.Errorf("route %s %s: openapi.json has no %s", r.method, p, strings.ToLower(r.method))
		}
	}
	ops := map[string]bool{"get": true, "put": true, "post": true, "delete": true, "patch": true, "head": true, "options": true, "trace": true}
	for p, item := range doc.Paths {
		for m := range item {
			if !ops[m] {
				continue // parameters, description, …
			}
			if !served[p][m] && !served[p][""] {
				t.Errorf("openapi.json documents %s %s, which no route serves", strings.ToUpper(m), p)
			}
		}
	}
}

// TestRouteTableRegistered checks the mux serves exactly the table: a
// route of an unconfigured subsystem answers the catch-all not_found, one
// of a configured one reaches its handler.
func TestRouteTableRegistered(t *testing.T) {
	bare := New(Config{})
	for _, r := range bare.routeTable() {
		method := r.method
		if method == "" {
			method = http.MethodGet
		}
		path := strings.NewReplacer("{id}", "sbx", "{name}", "base", "{rest...}", "x").Replace(r.pattern)
		req := httptest.NewRequest(method, path, nil)
		_, pattern := bare.mux.Handler(req)
		want := r.muxPattern()
		if r.on != nil && !r.on(bare.cfg) {
			want = "/"
		}
		if pattern != want {
			t.Errorf("%s %s is served by %q, want %q", method, path, pattern, want)
		}
	}
}

func TestParseCreate(t *testing.T) {
	half := 0.5
	neg := -1.0
	tests := []struct {
		in    createRequest
		field string
	}{
		{createRequest{CreateRequest: types.CreateRequest{Memory: "512M", Disk: "1G", Timeout: "5m"}, CPU: &half}, ""},
		{createRequest{CreateRequest: types.CreateRequest{Memory: "lots"}}, "memory"},
		{createRequest{CreateRequest: types.CreateRequest{Disk: "1Q"}}, "disk"},
		{createRequest{CreateRequest: types.CreateRequest{Timeout: "-1m"}}, "timeout"},
		{createRequest{CreateRequest: types.CreateRequest{Timeout: "0s"}}, "timeout"},
		{createRequest{CPU: &neg}, "cpu"},
		{createRequest{CreateRequest: types.CreateRequest{PIDs: -3}}, "pids"},
		{createRequest{CreateRequest: types.CreateRequest{Memory: "0"}}, "memory"},
		{createRequest{CreateRequest: types.CreateRequest{Memory: "0M"}}, "memory"},
		{createRequest{CreateRequest: types.CreateRequest{Disk: "0"}}, "disk"},
		{createRequest{CPU: new(float64)}, "cpu"},
	}
	for _, tt := range tests {
		got, err := parseCreate(tt.in)
		if tt.field == "" {
			if err != nil || got.Limits.MemoryBytes != 512<<20 || got.Limits.CPUMillis != 500 {
				t.Errorf("parseCreate(%+v) = %+v, %v", tt.in, got, err)
			}
			continue
		}
		var fe *fieldError
		if !errors.As(err, &fe) || fe.field != tt.field || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("parseCreate(%+v) err = %v, want invalid %s", tt.in, err, tt.field)
		}
	}
}

// TestParseCreateOnNodeLost: a daemon places nothing, so on_node_lost (the
// Kubernetes gateway's) is refused as not implemented, naming the field.
func TestParseCreateOnNodeLost(t *testing.T) {
	for _, v := range []string{types.OnNodeLostFail, types.OnNodeLostRecreate, "other"} {
		_, err := parseCreate(createRequest{CreateRequest: types.CreateRequest{OnNodeLost: v}})
		var fe *fieldError
		if !errors.As(err, &fe) || fe.field != "on_node_lost" || !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("parseCreate(on_node_lost %q) err = %v, want not implemented on on_node_lost", v, err)
		}
	}
}

func TestErrorBody(t *testing.T) {
	rec := httptest.NewRecorder()
	writeError(rec, badField("memory", errdefs.ErrInvalidArgument))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("status = %d, want 400", rec.Code)
	}
	var body errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Code != "invalid_argument" || body.Field != "memory" {
		t.Errorf("body = %s (%v)", rec.Body.String(), err)
	}
}

func FuzzDecodeCreate(f *testing.F) {
	for _, s := range []string{`{}`, `{"template":"base","cpu":1,"memory":"512M"}`, `{"memory":1}`, `{"x":1}`, `[]`, `{"env":{"A":"b"}}`, `{} {}`, `{"cpu":1e400}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in createRequest
		if err := decodeBytes(data, &in); err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("decode error %v is not invalid argument", err)
			}
			return
		}
		req, err := parseCreate(in)
		if err != nil {
			var fe *fieldError
			if !errors.As(err, &fe) || fe.field == "" {
				t.Errorf("parseCreate error %v names no field", err)
			}
			return
		}
		if req.Limits.MemoryBytes < 0 || req.Limits.DiskBytes < 0 || req.Timeout < 0 || req.Limits.CPUMillis < 0 {
			t.Errorf("parseCreate accepted negative limits: %+v", req)
		}
	})
}
