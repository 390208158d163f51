package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestOpenAPICoversRoutes keeps the checked-in document in step with the
// routes the server registers.
func TestOpenAPICoversRoutes(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	src := routeSource(t)
	re := regexp.MustCompile(`HandleFunc\("(GET|POST|DELETE|PUT) (/v1/[^"]*)"`)
	for _, m := range re.FindAllStringSubmatch(src, -1) {
		method, path := strings.ToLower(m[1]), m[2]
		item, ok := doc.Paths[path]
		if !ok {
			t.Errorf("route %s %s is missing from openapi.json", m[1], path)
			continue
		}
		if _, ok := item[method]; !ok {
			t.Errorf("route %s %s: openapi.json has no %s", m[1], path, method)
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
		{createRequest{Memory: "512M", Disk: "1G", Timeout: "5m", CPU: &half}, ""},
		{createRequest{Memory: "lots"}, "memory"},
		{createRequest{Disk: "1Q"}, "disk"},
		{createRequest{Timeout: "-1m"}, "timeout"},
		{createRequest{Timeout: "0s"}, "timeout"},
		{createRequest{CPU: &neg}, "cpu"},
		{createRequest{Pids: -3}, "pids"},
		{createRequest{Memory: "0"}, "memory"},
		{createRequest{Memory: "0M"}, "memory"},
		{createRequest{Disk: "0"}, "disk"},
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

// routeSource is every non-test Go file of the package: routes are
// registered in several of them.
func routeSource(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.String()
}
