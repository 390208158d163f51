package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestSplitExecArgs(t *testing.T) {
	tests := []struct {
		args    []string
		dash    int
		id      string
		argv    []string
		wantErr bool
	}{
		{[]string{"sb1", "ls", "-la"}, 1, "sb1", []string{"ls", "-la"}, false},
		{[]string{"sb1", "echo", "--", "x"}, 1, "sb1", []string{"echo", "--", "x"}, false},
		{[]string{"sb1", "ls"}, -1, "sb1", []string{"ls"}, false},
		{[]string{"sb1"}, -1, "", nil, true},
		{[]string{"sb1"}, 1, "", nil, true},
		{[]string{"ls"}, 0, "", nil, true},
		{[]string{"sb1", "sb2", "ls"}, 2, "", nil, true},
		{nil, -1, "", nil, true},
	}
	for _, tt := range tests {
		id, argv, err := splitExecArgs(tt.args, tt.dash)
		if (err != nil) != tt.wantErr || id != tt.id || !slices.Equal(argv, tt.argv) {
			t.Errorf("splitExecArgs(%q, %d) = %q, %q, %v; want %q, %q, error %v", tt.args, tt.dash, id, argv, err, tt.id, tt.argv, tt.wantErr)
		}
	}
}

func TestParseCpArg(t *testing.T) {
	tests := []struct {
		in   string
		want cpArg
	}{
		{"sb1:/tmp/x", cpArg{"sb1", "/tmp/x"}},
		{"k2m4:rel/path", cpArg{"k2m4", "rel/path"}},
		{"sb1:", cpArg{"sb1", ""}},
		{"./a:b", cpArg{"", "./a:b"}},
		{"/abs/a:b", cpArg{"", "/abs/a:b"}},
		{"../a:b", cpArg{"", "../a:b"}},
		{"plain", cpArg{"", "plain"}},
		{"dir/a:b", cpArg{"", "dir/a:b"}},
		{"My-File:x", cpArg{"", "My-File:x"}},
		{"C:/x", cpArg{"", "C:/x"}},
		{":x", cpArg{"", ":x"}},
	}
	for _, tt := range tests {
		if got := parseCpArg(tt.in); got != tt.want {
			t.Errorf("parseCpArg(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParseCpArgs(t *testing.T) {
	tests := []struct {
		src, dst string
		wantErr  bool
	}{
		{"local.txt", "sb1:/tmp/", false},
		{"sb1:/etc/hosts", ".", false},
		{"sb1:/a", "sb2:/b", true},
		{"a", "b", true},
		{"sb1:", "x", true},
	}
	for _, tt := range tests {
		_, _, err := parseCpArgs(tt.src, tt.dst)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseCpArgs(%q, %q) error = %v, want error %v", tt.src, tt.dst, err, tt.wantErr)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("parseCpArgs(%q, %q) error %v is not invalid_argument", tt.src, tt.dst, err)
		}
	}
}

func TestReportError(t *testing.T) {
	tests := []struct {
		err      error
		wantCode int
		wantText string
	}{
		{nil, 0, ""},
		{exitCodeError{137}, 137, ""},
		{fmt.Errorf("wrapped: %w", exitCodeError{3}), 3, ""},
		{invalidf("--env %q: want KEY=VALUE", "X"), 1, "berth: --env \"X\": want KEY=VALUE (invalid_argument)\n"},
		{&errdefs.Error{Code: "not_found", Message: "sandbox x not found"}, 1, "berth: sandbox x not found (not_found)\n"},
		{errors.New("boom"), 1, "berth: boom (internal)\n"},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if got := reportError(&buf, tt.err); got != tt.wantCode || buf.String() != tt.wantText {
			t.Errorf("reportError(%v) = %d, %q; want %d, %q", tt.err, got, buf.String(), tt.wantCode, tt.wantText)
		}
	}
}

// runBerth runs the CLI in-process against url.
func runBerth(t *testing.T, url string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), append([]string{"--url", url}, args...), streams{in: strings.NewReader(""), out: &out, err: &errb})
	return code, out.String(), errb.String()
}

func TestLocalValidation(t *testing.T) {
	// Nothing listens here: validation must fail before any request.
	const url = "http://127.0.0.1:1"
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"create", "--env", "NOEQUALS"}, "--env"},
		{[]string{"create", "--label", "=v"}, "--label"},
		{[]string{"create", "--memory", "lots"}, "--memory"},
		{[]string{"create", "--disk", "2X"}, "--disk"},
		{[]string{"create", "--timeout", "soon"}, "--timeout"},
		{[]string{"create", "--cpu", "-1"}, "--cpu"},
		{[]string{"create", "--pids", "0"}, "--pids"},
		{[]string{"exec", "sb1", "--env", "X", "--", "ls"}, "--env"},
		{[]string{"exec", "sb1"}, "command"},
		{[]string{"exec", "sb1", "--timeout", "soon", "--", "ls"}, "--timeout"},
		{[]string{"exec", "sb1", "--timeout", "-1s", "--", "ls"}, "timeout"},
		{[]string{"signal", "sb1", "12", "BOGUS"}, "BOGUS"},
		{[]string{"signal", "sb1", "notapid"}, "pid"},
		{[]string{"timeout", "sb1", "forever"}, "forever"},
		{[]string{"cp", "a", "b"}, "ID:PATH"},
		{[]string{"ls", "--label", "x"}, "--label"},
		{[]string{"create", "--nope"}, "unknown flag"},
		{[]string{"kill"}, "sandbox ID"},
		{[]string{"pause"}, "sandbox ID"},
		{[]string{"resume"}, "sandbox ID"},
		{[]string{"pause", "--all", "sb1"}, "--all"},
		{[]string{"resume", "--all", "--label", "k=v"}, "--all"},
		{[]string{"pause", "--label", "k"}, "--label"},
		{[]string{"resume", "--parallel", "0", "sb1"}, "--parallel"},
		{[]string{"resume", "--timeout", "soon", "sb1"}, "--timeout"},
	}
	for _, tt := range tests {
		code, _, stderr := runBerth(t, url, tt.args...)
		if code != 1 || !strings.Contains(stderr, tt.want) || !strings.HasSuffix(stderr, "(invalid_argument)\n") || !strings.HasPrefix(stderr, "berth: ") {
			t.Errorf("berth %q = %d, stderr %q; want 1 and an invalid_argument error naming %q", tt.args, code, stderr, tt.want)
		}
	}
}

func TestCreateAndList(t *testing.T) {
	var gotBody map[string]any
	var gotQuery string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &gotBody)
		w.WriteHeader(201)
		io.WriteString(w, `{"id":"abc123","state":"ready","template":"base"}`)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		gotQuery = r.URL.RawQuery
		io.WriteString(w, `{"sandboxes":[{"id":"abc123","state":"ready","template":"base","memory_bytes":536870912,"labels":{"k":"v"}}]}`)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		fmt.Fprintf(w, `{"code":"not_found","message":"sandbox %s not found"}`, r.PathValue("id"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	code, out, stderr := runBerth(t, srv.URL, "create", "--memory", "1G", "--pids", "64", "--env", "A=b=c", "--label", "k=v")
	if code != 0 || out != "abc123\n" {
		t.Fatalf("create = %d, %q, %q", code, out, stderr)
	}
	want := map[string]any{"memory": "1G", "pids": 64, "env": map[string]any{"A": "b=c"}, "labels": map[string]any{"k": "v"}}
	if fmt.Sprint(gotBody) != fmt.Sprint(want) {
		t.Errorf("create sent %v, want only the set flags %v", gotBody, want)
	}

	code, out, _ = runBerth(t, srv.URL, "ls", "--label", "k=v")
	if code != 0 || !strings.Contains(out, "abc123") || !strings.Contains(out, "512M") || gotQuery != "label=k%3Dv&state=creating%2Cready%2Cpaused%2Cstopping" {
		t.Errorf("ls = %d, %q (query %q)", code, out, gotQuery)
	}
	code, out, _ = runBerth(t, srv.URL, "ls", "--json")
	var list []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 {
		t.Errorf("ls --json = %d, %q", code, out)
	}

	code, _, stderr = runBerth(t, srv.URL, "kill", "zzz")
	if code != 1 || stderr != "berth: kill zzz: sandbox zzz not found (not_found)\n" {
		t.Errorf("kill = %d, %q", code, stderr)
	}
}

func TestHumanBytes(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{{0, "0"}, {1023, "1023"}, {1024, "1K"}, {536870912, "512M"}, {1610612736, "1.5G"}, {2147483648, "2G"}}
	for _, tt := range tests {
		if got := humanBytes(tt.n); got != tt.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

// TestConfigKeysDocumented: serve --help lists every config key (from
// daemon.Config's tags) and so must the README.
func TestConfigKeysDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	keys := configKeys()
	for _, want := range []string{"listen", "dns_upstream", "public_test_nets", "egress_ca_file", "commit_author"} {
		if !slices.Contains(keys, want) {
			t.Errorf("configKeys() = %v, lacks %s", keys, want)
		}
	}
	for _, k := range keys {
		if !strings.Contains(string(readme), "`"+k+"`") {
			t.Errorf("README does not list config key %s", k)
		}
	}
}
