package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestBulkPauseResume: pause and resume act on every sandbox named or
// selected (by label among those in the state they move from, or all),
// each once, no more at a time than --parallel, print a line for each
// done, report every failure and exit non-zero if any; one ID asked by
// name prints as before, --json an object, several an array.
func TestBulkPauseResume(t *testing.T) {
	var (
		mu             sync.Mutex
		inFlight, peak int
		calls          []string
		listQuery      string
		release        = make(chan struct{})
		waiting        = make(chan struct{}, 16)
		hold           bool
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		listQuery = r.URL.RawQuery
		mu.Unlock()
		io.WriteString(w, `{"sandboxes":[{"id":"s1","state":"ready"},{"id":"s2","state":"ready"},{"id":"s3","state":"ready"},{"id":"full","state":"ready"}]}`)
	})
	act := func(verb, state string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			id := r.PathValue("id")
			mu.Lock()
			calls = append(calls, verb+" "+id)
			inFlight++
			peak = max(peak, inFlight)
			h := hold
			mu.Unlock()
			defer func() {
				mu.Lock()
				inFlight--
				mu.Unlock()
			}()
			if h {
				waiting <- struct{}{}
				<-release
			}
			if id == "full" {
				w.WriteHeader(429)
				fmt.Fprintf(w, `{"code":"resource_exhausted","message":"%s sandbox full: quota max-sandboxes 2 reached"}`, verb)
				return
			}
			fmt.Fprintf(w, `{"id":%q,"state":%q,"pause":"memory","remaining":"10m0s","deadline":"2030-01-01T00:00:00Z"}`, id, state)
		}
	}
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", act("pause", "paused"))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", act("resume", "ready"))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// One by name: as ever.
	code, out, stderr := runBerth(t, srv.URL, "pause", "s1")
	if code != 0 || out != "s1 paused (memory), 10m0s left\n" || stderr != "" {
		t.Fatalf("pause s1 = %d %q %q", code, out, stderr)
	}
	code, out, _ = runBerth(t, srv.URL, "pause", "--json", "s1")
	var one map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &one) != nil || one["id"] != "s1" {
		t.Errorf("pause --json s1 = %d %q, want one object", code, out)
	}

	// By label, two at a time: every one selected once (s1 named too),
	// the failure reported with the rest done.
	mu.Lock()
	calls, hold = nil, true
	mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		code, out, stderr = runBerth(t, srv.URL, "pause", "--label", "team=a", "--parallel", "2", "s1")
	}()
	for range 4 {
		<-waiting
		mu.Lock()
		if inFlight > 2 {
			t.Errorf("%d pauses at once under --parallel 2", inFlight)
		}
		mu.Unlock()
		release <- struct{}{}
	}
	<-done
	mu.Lock()
	slices.Sort(calls)
	if want := []string{"pause full", "pause s1", "pause s2", "pause s3"}; !slices.Equal(calls, want) || peak > 2 || listQuery != "label=team%3Da&state=ready" {
		t.Errorf("pause --label: calls %v (peak %d at once), list query %q; want %v, at most 2, ready ones with the label", calls, peak, listQuery, want)
	}
	hold = false
	mu.Unlock()
	if code != 1 || strings.Count(out, " paused (memory)") != 3 || stderr != "berth: pause full: pause sandbox full: quota max-sandboxes 2 reached (resource_exhausted)\n" {
		t.Errorf("pause --label = %d, out %q, stderr %q; want 1, three paused, the refusal named", code, out, stderr)
	}

	// Resume --all --json: an array of those resumed, the failure on
	// stderr.
	code, out, stderr = runBerth(t, srv.URL, "resume", "--all", "--json")
	var many []map[string]any
	if code != 1 || json.Unmarshal([]byte(out), &many) != nil || len(many) != 3 || !strings.Contains(stderr, "resume full:") {
		t.Errorf("resume --all --json = %d, out %q, stderr %q; want 1, an array of three, the failure", code, out, stderr)
	}
	mu.Lock()
	if listQuery != "state=paused" {
		t.Errorf("resume --all listed %q, want the paused ones", listQuery)
	}
	mu.Unlock()
}
