package node

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// fakeDaemon serves on a unix socket what the daemon's agent proxy would:
// it echoes the request it got, then streams lines until the client's
// body ends.
func fakeDaemon(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "berth.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("X-Got-Path", r.URL.Path)
		w.Header().Set("X-Got-Query", r.URL.RawQuery)
		w.Header().Set("X-Got-Key", r.Header.Get("X-API-Key"))
		w.Header().Set("X-Got-Auth", r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusOK)
		// Echo each line of the body as it comes: the client sees the
		// first answer before it sends the second line only if both
		// directions stream.
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			_, _ = io.WriteString(w, "echo "+sc.Text()+"\n")
			_ = http.NewResponseController(w).Flush()
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

func TestDataPlane(t *testing.T) {
	sock := fakeDaemon(t)
	p := &Pods{pods: map[string]*podState{
		"ns/a": {sandboxID: "sba"},
		"ns/b": {sandboxID: "sbgone", deleted: true},
	}}
	mux := http.NewServeMux()
	handleDataPlane(mux, sock, p.ownsSandbox, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// A sandbox of this node's pods: proxied with the path rewritten, the
	// gateway's key dropped and the agent user's Basic auth kept; both
	// directions stream.
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), "POST", srv.URL+DataPlanePrefix+"/v1/sandboxes/sba/agent/process.Process/Start?x=1", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "e2b_secret")
	req.Header.Set("Authorization", "Basic cm9vdDo=")
	go func() { _, _ = io.WriteString(pw, "one\n") }()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for h, want := range map[string]string{"X-Got-Path": "/v1/sandboxes/sba/agent/process.Process/Start", "X-Got-Query": "x=1", "X-Got-Key": "", "X-Got-Auth": "Basic cm9vdDo="} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("daemon saw %s %q, want %q", h, got, want)
		}
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "echo one\n" {
		t.Fatalf("first streamed line = %q, %v", line, err)
	}
	go func() { _, _ = io.WriteString(pw, "two\n"); _ = pw.Close() }()
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "echo two\n" {
		t.Errorf("rest = %q, %v", rest, err)
	}

	// A bearer key goes no further either.
	req, _ = http.NewRequestWithContext(t.Context(), "GET", srv.URL+DataPlanePrefix+"/v1/sandboxes/sba/agent/files", nil)
	req.Header.Set("Authorization", "Bearer e2b_secret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Got-Auth"); got != "" {
		t.Errorf("daemon saw Authorization %q, want none", got)
	}

	// The review routes reach the daemon's routes of the sandbox, reads
	// only: a write to one is no route here.
	for _, rt := range ReviewRoutes {
		resp, err := http.Get(srv.URL + DataPlanePrefix + "/v1/sandboxes/sba/" + rt + "?follow=1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if p, q := resp.Header.Get("X-Got-Path"), resp.Header.Get("X-Got-Query"); resp.StatusCode != 200 || p != "/v1/sandboxes/sba/"+rt || q != "follow=1" {
			t.Errorf("GET %s: %d, daemon saw %q ? %q", rt, resp.StatusCode, p, q)
		}
	}
	for _, r := range []struct{ method, path string }{{"PUT", "network"}, {"GET", "exec"}, {"POST", "pause"}} {
		req, _ := http.NewRequestWithContext(t.Context(), r.method, srv.URL+DataPlanePrefix+"/v1/sandboxes/sba/"+r.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("X-Got-Path") != "" || resp.StatusCode < 400 {
			t.Errorf("%s %s = %d, proxied to %q; want refused", r.method, r.path, resp.StatusCode, resp.Header.Get("X-Got-Path"))
		}
	}

	// Other sandboxes of the host, deleted pods' and bad IDs are refused
	// with the API's JSON errors.
	for _, tc := range []struct {
		id   string
		code string
	}{{"other", errdefs.CodeNotFound}, {"sbgone", errdefs.CodeNotFound}, {"Bad_ID", errdefs.CodeInvalidArgument}} {
		for _, rest := range []string{"agent/files", "events"} {
			resp, err := http.Get(srv.URL + DataPlanePrefix + "/v1/sandboxes/" + tc.id + "/" + rest)
			if err != nil {
				t.Fatal(err)
			}
			var e errdefs.Error
			err = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if err != nil || e.Code != tc.code || resp.Header.Get("X-Got-Path") != "" || !strings.Contains(e.Message, tc.id) {
				t.Errorf("sandbox %s, %s: %d %+v (%v), want %s and no proxying", tc.id, rest, resp.StatusCode, e, err, tc.code)
			}
		}
	}
}

// TestDataPlaneSnapshots: a snapshot of one of the node's pods' sandboxes
// is taken through its route; GET and DELETE of a snapshot reach the
// daemon only for one taken of this node's pods (its berth.dev/node
// label), never another of the host's daemon. The daemon's template
// routes reach it as they are.
func TestDataPlaneSnapshots(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "berth.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got", r.Method+" "+r.URL.Path)
		w.Header().Set("X-Got-Query", r.URL.RawQuery)
		node := map[string]string{"/v1/snapshots/mine": "n1", "/v1/snapshots/theirs": "n2"}[r.URL.Path]
		switch {
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/export"):
			_, _ = io.WriteString(w, "archive")
		case r.Method == "GET" && node != "":
			_ = json.NewEncoder(w).Encode(types.Snapshot{ID: strings.TrimPrefix(r.URL.Path, "/v1/snapshots/"), Labels: map[string]string{LabelNode: node}})
		case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/snapshots/"):
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeNotFound, Message: "no such snapshot"})
		case r.Method == "GET" && r.URL.Path == "/v1/templates":
			_ = json.NewEncoder(w).Encode(types.TemplateList{Templates: []types.Template{{Name: "minimal", Built: true}}})
		case r.Method == "DELETE":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(types.Snapshot{ID: "new"})
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := client.New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	p := &Pods{pods: map[string]*podState{"ns/a": {sandboxID: "sba"}}, sb: FromClient(c)}
	mux := http.NewServeMux()
	handleDataPlane(mux, sock, p.ownsSandbox, slog.New(slog.DiscardHandler))
	var changes atomic.Int32
	handleSnapshots(mux, sock, "n1", p, func() { changes.Add(1) }, slog.New(slog.DiscardHandler))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, hs.URL+DataPlanePrefix+path, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// An import is labelled with the node's name, never the
		// client's.
		if q := resp.Header.Get("X-Got-Query"); strings.Contains(path, "/import") && q != "id=sbkeep&label=team%3Dx&label=berth.dev%2Fnode%3Dn1" {
			t.Errorf("import reached the daemon with query %q, want the ID, the client's team label and the node's", q)
		}
		return resp.StatusCode, resp.Header.Get("X-Got")
	}
	for _, tc := range []struct {
		method, path string
		status       int
		got          string
	}{
		{"POST", "/v1/sandboxes/sba/snapshots", 201, "POST /v1/sandboxes/sba/snapshots"},
		{"POST", "/v1/sandboxes/other/snapshots", 404, ""},
		{"GET", "/v1/snapshots/mine", 200, "GET /v1/snapshots/mine"},
		{"DELETE", "/v1/snapshots/mine", 204, "DELETE /v1/snapshots/mine"},
		{"GET", "/v1/snapshots/theirs", 404, ""},
		{"DELETE", "/v1/snapshots/theirs", 404, ""},
		{"DELETE", "/v1/snapshots/none", 404, ""},
		{"DELETE", "/v1/snapshots/Bad_ID", 400, ""},
		{"GET", "/v1/snapshots/mine/export", 200, "GET /v1/snapshots/mine/export"},
		{"GET", "/v1/snapshots/theirs/export", 404, ""},
		{"POST", "/v1/snapshots/import?label=berth.dev/node=n2&label=team=x&id=sbkeep", 201, "POST /v1/snapshots/import"},
		// The daemon's template routes, for the gateway's; a name is one
		// path segment.
		{"GET", "/v1/templates", 200, "GET /v1/templates"},
		{"POST", "/v1/templates", 201, "POST /v1/templates"},
		{"POST", "/v1/templates/minimal/build", 201, "POST /v1/templates/minimal/build"},
		{"POST", "/v1/templates/py/dockerfile?dockerfile=D", 201, "POST /v1/templates/py/dockerfile"},
		{"DELETE", "/v1/templates/minimal", 204, "DELETE /v1/templates/minimal"},
		{"POST", "/v1/templates/..%2Fsandboxes%2Fsba/build", 400, ""},
		{"PUT", "/v1/templates/minimal/isolation", 201, "PUT /v1/templates/minimal/isolation"},
		{"PUT", "/v1/templates/minimal/warm", 201, "PUT /v1/templates/minimal/warm"},
		{"POST", "/v1/templates/prune", 201, "POST /v1/templates/prune"},
		{"GET", "/v1/registries", 201, "GET /v1/registries"},
		{"PUT", "/v1/registries/ghcr.io", 201, "PUT /v1/registries/ghcr.io"},
		{"DELETE", "/v1/registries/ghcr.io", 204, "DELETE /v1/registries/ghcr.io"},
		{"PUT", "/v1/registries/a%2Fb", 400, ""},
		// E2B's template builds, at the daemon's own E2B paths.
		{"POST", "/e2b/v3/templates", 201, "POST /v3/templates"},
		{"GET", "/e2b/templates/app/files/" + strings.Repeat("a", 64), 201, "GET /templates/app/files/" + strings.Repeat("a", 64)},
		{"PUT", "/e2b/templates/app/files/" + strings.Repeat("a", 64) + "?expires=1&signature=s", 201, "PUT /templates/app/files/" + strings.Repeat("a", 64)},
		{"POST", "/e2b/v2/templates/app/builds/b1", 201, "POST /v2/templates/app/builds/b1"},
		{"GET", "/e2b/templates/app/builds/b1/status?logsOffset=3", 201, "GET /templates/app/builds/b1/status"},
		{"GET", "/e2b/templates/..%2F..%2Fv1%2Fsandboxes/builds/b1/status", 400, ""},
		{"GET", "/e2b/templates/app/builds/x%2Fy/status", 400, ""},
	} {
		if status, got := do(tc.method, tc.path); status != tc.status || got != tc.got {
			t.Errorf("%s %s = %d, daemon saw %q; want %d, %q", tc.method, tc.path, status, got, tc.status, tc.got)
		}
	}
	// Each template change that reached the daemon had the node report
	// its templates again (Close waits for the handlers to return).
	hs.Close()
	if n := changes.Load(); n != 13 {
		t.Errorf("changes reported %d times, want 13 (template create, build, Dockerfile build, delete, isolation, warm, prune; login, logout; E2B request, upload, trigger, status)", n)
	}
}
