package e2bcompat

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/store"
)

// requestBuild asks for a build of name and returns its ID.
func requestBuild(t *testing.T, srv *Server, key, name string) string {
	t.Helper()
	code, body := call(t, srv, "POST", "/v3/templates", key, map[string]any{"name": name})
	if code != 202 {
		t.Fatalf("request %s = %d %v", name, code, body)
	}
	return body["buildID"].(string)
}

func buildStatus(t *testing.T, srv *Server, key, name, id string, off int) map[string]any {
	t.Helper()
	code, body := call(t, srv, "GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", name, id, off), key, nil)
	if code != 200 {
		t.Fatalf("status of %s = %d %v", id, code, body)
	}
	return body
}

// TestTemplateBuildSurvivesRestart: a build's status and log are read
// from the store, so a daemon started after the one that ran it answers
// for it: a build that was running is an error saying the daemon
// restarted, with the log it wrote; a build still waiting for its trigger
// can be triggered on the new daemon.
func TestTemplateBuildSurvivesRestart(t *testing.T) {
	synctest.Test(t, testTemplateBuildSurvivesRestart)
}

func testTemplateBuildSurvivesRestart(t *testing.T) {
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dir := t.TempDir()
	started := make(chan struct{})
	b := &fakeBuilder{built: map[string]bool{}, block: make(chan error),
		logf: func(w io.Writer) { fmt.Fprint(w, "fetching\nunpacking\n"); close(started) }}
	old, admin, _ := newTemplateServerOn(t, b, db, dir)
	running := requestBuild(t, old, admin, "app")
	waiting := requestBuild(t, old, admin, "app")
	if code, body := call(t, old, "POST", "/v2/templates/app/builds/"+running, admin, map[string]any{"fromTemplate": "base"}); code != 202 {
		t.Fatalf("trigger = %d %v", code, body)
	}
	<-started
	if body := buildStatus(t, old, admin, "app", running, 0); body["status"] != "building" || fmt.Sprint(body["logs"]) != "[fetching unpacking]" {
		t.Fatalf("status while building = %v", body)
	} else if body[e2bwire.BuildTemplateField] != "app" || fmt.Sprint(body[e2bwire.BuildTagsField]) != "[default]" || body[e2bwire.BuildRequestedField] == "" || body[e2bwire.BuildUpdatedField] == "" {
		t.Fatalf("status while building = %v: want the build's template, tags and request time", body)
	}

	// The daemon "dies" (its build goroutine is left blocked) and a new
	// one starts on the same store and directory.
	b2 := &fakeBuilder{built: map[string]bool{}}
	srv, admin2, _ := newTemplateServerOn(t, b2, db, dir)
	body := buildStatus(t, srv, admin2, "app", running, 1)
	reason, _ := body["reason"].(map[string]any)
	if body["status"] != "error" || reason == nil || !strings.Contains(fmt.Sprint(reason["message"]), "daemon restarted") {
		t.Fatalf("status after restart = %v, want error naming the restart", body)
	}
	if fmt.Sprint(body["logs"]) != "[unpacking]" {
		t.Errorf("logs from offset 1 after restart = %v, want [unpacking]", body["logs"])
	}
	if fmt.Sprint(reason["logEntries"]) == "[]" {
		t.Errorf("reason of the interrupted build has no log entries: %v", reason)
	}
	if body := buildStatus(t, srv, admin2, "app", waiting, 0); body["status"] != "waiting" {
		t.Fatalf("waiting build after restart = %v", body)
	}
	if code, body := call(t, srv, "POST", "/v2/templates/app/builds/"+waiting, admin2, map[string]any{"fromTemplate": "base"}); code != 202 {
		t.Fatalf("trigger of the waiting build on the new daemon = %d %v", code, body)
	}
	// Let the old daemon's build go; what it records is not read again.
	b.block <- errors.New("the old daemon's build")
	synctest.Wait()
	if code, _ := call(t, srv, "GET", "/templates/other/builds/"+running+"/status", admin2, nil); code != 404 {
		t.Errorf("status under another name = %d, want 404", code)
	}
}

// TestTemplateBuildsBounded: a build's log stops at maxLogLines with a
// line saying so, long lines are cut, and only the newest keptBuilds
// builds of a name are kept.
func TestTemplateBuildsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		long := strings.Repeat("x", maxLogLine+100)
		b := &fakeBuilder{built: map[string]bool{}, logf: func(w io.Writer) {
			fmt.Fprintln(w, long)
			fmt.Fprint(w, strings.Repeat("line\n", maxLogLines+50))
		}}
		srv, admin, _ := newTemplateServer(t, b)
		first := requestBuild(t, srv, admin, "app")
		if code, body := call(t, srv, "POST", "/v2/templates/app/builds/"+first, admin, map[string]any{"fromTemplate": "base"}); code != 202 {
			t.Fatalf("trigger = %d %v", code, body)
		}
		synctest.Wait()
		body := buildStatus(t, srv, admin, "app", first, 0)
		logs, _ := body["logs"].([]any)
		if len(logs) != maxLogLines {
			t.Fatalf("%d log lines, want the cap %d", len(logs), maxLogLines)
		}
		if l := fmt.Sprint(logs[0]); len(l) > maxLogLine+len("…") {
			t.Errorf("first line is %d bytes, want at most %d", len(l), maxLogLine)
		}
		if last := fmt.Sprint(logs[len(logs)-1]); !strings.Contains(last, "cut at") {
			t.Errorf("last line %q, want it to say the log is cut", last)
		}
		for range keptBuilds {
			time.Sleep(time.Millisecond) // the fake clock: each is newer
			requestBuild(t, srv, admin, "app")
		}
		if code, _ := call(t, srv, "GET", "/templates/app/builds/"+first+"/status", admin, nil); code != 404 {
			t.Errorf("oldest build past %d newer ones = %d, want 404 (pruned)", keptBuilds, code)
		}
	})
}

// uploadVia asks for hash's upload link as name and uploads files to it.
func uploadVia(t *testing.T, srv *Server, key, name, hash string, files map[string]string) {
	t.Helper()
	code, body := call(t, srv, "GET", "/templates/"+name+"/files/"+hash, key, nil)
	if code != 201 {
		t.Fatalf("upload link = %d %v", code, body)
	}
	if body["present"] == true {
		return
	}
	u, err := url.Parse(fmt.Sprint(body["url"]))
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := call(t, srv, "PUT", u.Path+"?"+u.RawQuery, "", tgz(t, files)); code != 200 {
		t.Fatalf("upload = %d", code)
	}
}

func uploadsLeft(t *testing.T, srv *Server) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(srv.tpl.dir, "files"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestUploadsPruned: an upload is kept while a build of its name waits
// for its trigger or copies it, and removed once the builds end; an
// upload no build ever used is removed once it ages out, as is one a
// previous daemon left behind.
func TestUploadsPruned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBuilder{built: map[string]bool{}}
		srv, admin, _ := newTemplateServer(t, b)
		go srv.SweepUploads(t.Context())
		h1, h2 := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
		copyStep := func(h string) map[string]any {
			return map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "COPY", "args": []string{"f", "/f"}, "filesHash": h}}}
		}

		// Two builds of app want h1; the first ends while the second
		// waits, so h1 stays until the second ends.
		one, two := requestBuild(t, srv, admin, "app"), requestBuild(t, srv, admin, "app")
		uploadVia(t, srv, admin, "app", h1, map[string]string{"f": "1"})
		uploadVia(t, srv, admin, "app", h1, nil) // present: the second build's check
		if code, _ := call(t, srv, "POST", "/v2/templates/app/builds/"+one, admin, copyStep(h1)); code != 202 {
			t.Fatalf("trigger one = %d", code)
		}
		synctest.Wait()
		if left := uploadsLeft(t, srv); len(left) != 1 {
			t.Fatalf("uploads after the first build, with a second waiting = %v, want h1 kept", left)
		}
		if code, body := call(t, srv, "POST", "/v2/templates/app/builds/"+two, admin, copyStep(h1)); code != 202 {
			t.Fatalf("trigger two = %d %v", code, body)
		}
		synctest.Wait()
		if st := buildStatus(t, srv, admin, "app", two, 0); st["status"] != "ready" {
			t.Fatalf("second build = %v", st)
		}
		if left := uploadsLeft(t, srv); len(left) != 0 {
			t.Fatalf("uploads after every build ended = %v, want none", left)
		}

		// An upload whose build is never triggered ages out.
		requestBuild(t, srv, admin, "lost")
		uploadVia(t, srv, admin, "lost", h2, map[string]string{"f": "2"})
		if left := uploadsLeft(t, srv); len(left) != 1 {
			t.Fatalf("uploads = %v, want h2", left)
		}
		// synctest's fake clock: these sleeps move time for the sweeper
		// and wait for nothing real; synctest.Wait settles it.
		time.Sleep(uploadMaxAge / 2)
		synctest.Wait()
		if left := uploadsLeft(t, srv); len(left) != 1 {
			t.Fatalf("uploads half way to the age bound = %v, want h2 kept", left)
		}
		time.Sleep(uploadMaxAge/2 + uploadSweepEvery)
		synctest.Wait()
		if left := uploadsLeft(t, srv); len(left) != 0 {
			t.Fatalf("uploads past the age bound = %v, want none", left)
		}
	})
}

// TestUploadsAdoptedAfterRestart: uploads a previous daemon left are aged
// from when they were written, and half-written ones go at once.
func TestUploadsAdoptedAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dir := t.TempDir()
		files := filepath.Join(dir, "files")
		if err := os.MkdirAll(files, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{strings.Repeat("c3", 32), ".upload-123"} {
			if err := os.WriteFile(filepath.Join(files, n), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		srv, _, _ := newTemplateServerOn(t, &fakeBuilder{built: map[string]bool{}}, db, dir)
		go srv.SweepUploads(t.Context())
		if left := uploadsLeft(t, srv); len(left) != 1 || left[0] != strings.Repeat("c3", 32) {
			t.Fatalf("uploads after start = %v, want the whole one only", left)
		}
		time.Sleep(uploadMaxAge + uploadSweepEvery) // synctest's fake clock, as above
		synctest.Wait()
		if left := uploadsLeft(t, srv); len(left) != 0 {
			t.Fatalf("left uploads past the age bound = %v, want none", left)
		}
	})
}
