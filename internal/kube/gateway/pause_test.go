package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// TestPauseResume: a pause is the pod's pause annotation, answered once
// its node reports it; the paused sandbox is listed paused and its data
// plane refused; a resume removes the annotation and gives the deadline
// the time it had left; bad input and other keys change nothing.
func TestPauseResume(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"timeout":"1h"}`, &sb); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	pods := e.kube.CoreV1().Pods(ns)
	for _, tc := range []struct {
		path, key, body string
		status          int
		code, field     string
	}{
		{"/v1/sandboxes/" + sb.ID + "/pause", keyBob, "", 404, errdefs.CodeNotFound, ""},
		{"/v1/sandboxes/" + sb.ID + "/resume", keyAlice, `{"timeout":"soon"}`, 400, errdefs.CodeInvalidArgument, "timeout"},
		{"/v1/sandboxes/" + sb.ID + "/resume", keyAlice, `{"x":1}`, 400, errdefs.CodeInvalidArgument, "body"},
	} {
		if code, eb := e.call(t, "POST", tc.path, tc.key, tc.body, nil); code != tc.status || eb.Code != tc.code || eb.Field != tc.field {
			t.Errorf("POST %s %s = %d %+v, want %d %s on %q", tc.path, tc.body, code, eb, tc.status, tc.code, tc.field)
		}
	}
	if pod, _ := pods.Get(t.Context(), sb.ID, metav1.GetOptions{}); pod.Annotations[node.AnnotationPaused] != "" {
		t.Fatalf("refused requests paused the sandbox: %v", pod.Annotations)
	}

	var got types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", keyAlice, "", &got); code != 200 || got.State != types.StatePaused || got.Pause != "filesystem" {
		t.Fatalf("pause = %d %+v %+v", code, eb, got)
	}
	pod, err := pods.Get(t.Context(), sb.ID, metav1.GetOptions{})
	if err != nil || pod.Annotations[node.AnnotationPaused] == "" {
		t.Fatalf("after the pause: %v, %v", pod.Annotations, err)
	}
	var list types.SandboxList
	if code, eb := e.call(t, "GET", "/v1/sandboxes?state=paused", keyAlice, "", &list); code != 200 || len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("list paused = %d %+v %+v", code, eb, list)
	}
	// Pausing again changes nothing.
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", keyAlice, "", &got); code != 200 || got.State != types.StatePaused {
		t.Errorf("pause again = %d %+v", code, eb)
	}
	// Its data plane is refused: it was made without auto_resume.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", e.url+"/v1/sandboxes/"+sb.ID+"/agent/process.Process/Start", bytes.NewReader([]byte("x")))
	req.Header.Set("X-API-Key", keyAlice)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("agent request to a paused sandbox = %d, want 409", resp.StatusCode)
	}

	// The resume gives back what was left: about an hour.
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", keyAlice, "", &got); code != 200 || got.State != types.StateReady {
		t.Fatalf("resume = %d %+v %+v", code, eb, got)
	}
	if left := time.Until(got.Deadline); left < 55*time.Minute || left > time.Hour+2*time.Second {
		t.Errorf("resumed deadline %v is %v from now, want about the hour it had", got.Deadline, left)
	}
	pod, _ = pods.Get(t.Context(), sb.ID, metav1.GetOptions{})
	if _, ok := pod.Annotations[node.AnnotationPaused]; ok {
		t.Errorf("resumed pod keeps the pause annotation: %v", pod.Annotations)
	}
	// A resume that names a timeout sets it from now.
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", keyAlice, "", nil); code != 200 {
		t.Fatalf("pause = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", keyAlice, `{"timeout":"3h"}`, &got); code != 200 || time.Until(got.Deadline) < 2*time.Hour {
		t.Errorf("resume for 3h = %d %+v, deadline %v", code, eb, got.Deadline)
	}

	// A timeout set while paused is what it gets once resumed.
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", keyAlice, "", nil); code != 200 {
		t.Fatalf("pause = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/timeout", keyAlice, `{"timeout":"2h"}`, nil); code != 200 {
		t.Fatalf("timeout while paused = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", keyAlice, "", &got); code != 200 {
		t.Fatalf("resume = %d %+v", code, eb)
	}
	if left := time.Until(got.Deadline); left < 2*time.Hour-5*time.Second || left > 2*time.Hour+2*time.Second {
		t.Errorf("resumed after a 2h timeout set while paused: %v left", left)
	}

	// A key's max_timeout bounds a resume's timeout as it bounds a
	// create's.
	var cs types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyCarol, `{"timeout":"30m","memory":"128M"}`, &cs); code != 201 {
		t.Fatalf("carol's create = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+cs.ID+"/pause", keyCarol, "", nil); code != 200 {
		t.Fatalf("carol's pause = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+cs.ID+"/resume", keyCarol, `{"timeout":"2h"}`, nil); code != 429 || eb.Code != errdefs.CodeResourceExhausted || eb.Field != "timeout" {
		t.Errorf("resume past carol's max_timeout = %d %+v, want resource_exhausted on timeout", code, eb)
	}

	// A pause its node's daemon refuses for want of disk room is the
	// daemon's 429 with its words; the sandbox runs on, unpaused.
	var full types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"labels":{"disk":"full"}}`, &full); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+full.ID+"/pause", keyAlice, "", nil); code != 429 || eb.Code != errdefs.CodeResourceExhausted || !strings.Contains(eb.Message, noRoomWords) {
		t.Errorf("pause its node has no room for = %d %+v, want 429 resource_exhausted with the daemon's words", code, eb)
	}
	if code, _ := e.call(t, "GET", "/v1/sandboxes/"+full.ID, keyAlice, "", &got); code != 200 || got.State != types.StateReady {
		t.Errorf("after the refused pause: %d %+v, want ready", code, got)
	}
	if pod, _ := pods.Get(t.Context(), full.ID, metav1.GetOptions{}); pod.Annotations[node.AnnotationPaused] != "" {
		t.Errorf("the refused pause is still asked for on the pod: %v", pod.Annotations)
	}

	// auto_resume: the next data-plane request resumes it and goes on.
	var auto types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"auto_resume":true}`, &auto); code != 201 || !auto.AutoResume {
		t.Fatalf("create auto_resume = %d %+v %+v", code, eb, auto)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+auto.ID+"/pause", keyAlice, "", nil); code != 200 {
		t.Fatalf("pause = %d %+v", code, eb)
	}
	req, _ = http.NewRequestWithContext(t.Context(), "POST", e.url+"/v1/sandboxes/"+auto.ID+"/agent/process.Process/Start", bytes.NewReader([]byte("x")))
	req.Header.Set("X-API-Key", keyAlice)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("agent request to a paused auto_resume sandbox = %d, want 200", resp.StatusCode)
	}
	if code, _ := e.call(t, "GET", "/v1/sandboxes/"+auto.ID, keyAlice, "", &got); code != 200 || got.State != types.StateReady {
		t.Errorf("after the request: %+v, want ready", got)
	}
}

// TestUsage: a get of one sandbox carries its node's measure of its
// usage; E2B's metrics are the node's readings of it over time, in the
// range asked, and a reading taken now when the range has no end.
func TestUsage(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, "", &sb); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	var got types.Sandbox
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.ID, keyAlice, "", &got); code != 200 || got.Usage == nil || got.Usage.MemoryBytes != 40<<20 {
		t.Errorf("get = %d %+v, usage %+v", code, eb, got.Usage)
	}
	e2 := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	metrics := func(query string) []e2bwire.MetricBody {
		t.Helper()
		code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+e2.SandboxID+"/metrics"+query, keyAlice, "", nil)
		var ms []e2bwire.MetricBody
		if code != 200 || json.Unmarshal(data, &ms) != nil {
			t.Fatalf("metrics%s = %d %s", query, code, data)
		}
		return ms
	}
	ms := metrics("")
	if len(ms) != 4 || ms[0].MemUsed != 40<<20 || ms[2].MemUsed != 50<<20 || ms[3].MemUsed != 60<<20 || ms[0].MemTotal != 512<<20 ||
		ms[0].CPUCount != 1 || ms[0].DiskTotal != 1<<30 || ms[0].CPUUsedPct != 20 || ms[3].CPUUsedPct != 10 {
		t.Errorf("metrics = %+v", ms)
	}
	// A range ending before now: the node's readings in it, none taken
	// now. E2B's whole seconds reach the node as since and until.
	now := time.Now()
	start, end := strconv.FormatInt(now.Add(-17*time.Second).Unix(), 10), strconv.FormatInt(now.Add(-8*time.Second).Unix(), 10)
	if ms := metrics("?start=" + start + "&end=" + end); len(ms) != 2 || ms[0].MemUsed != 45<<20 || ms[1].MemUsed != 50<<20 {
		t.Errorf("metrics of [-17 s, -8 s] = %+v", ms)
	}
	past := strconv.FormatInt(now.Add(-time.Hour).Unix(), 10)
	if ms := metrics("?end=" + past); len(ms) != 0 {
		t.Errorf("metrics of a past range = %+v, want []", ms)
	}
	if ms := metrics("?start=" + end + "&end=" + start); len(ms) != 0 {
		t.Errorf("metrics of a range ending before it starts = %+v, want []", ms)
	}
	if code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+e2.SandboxID+"/metrics?start=soon", keyAlice, "", nil); code != 400 || !bytes.Contains(data, []byte("start")) {
		t.Errorf("metrics with a bad start = %d %s", code, data)
	}
	if code, _, _ := e.e2bCall(t, "GET", "/sandboxes/"+e2.SandboxID+"/metrics", keyBob, "", nil); code != 404 {
		t.Errorf("another key's metrics = %d, want 404", code)
	}

	// Many at once: the node's reading taken now of each running one
	// asked for; another key's and unknown ones left out.
	many := func(key, query string) (int, e2bwire.ManyMetricsBody) {
		t.Helper()
		code, data, _ := e.e2bCall(t, "GET", "/sandboxes/metrics"+query, key, "", nil)
		var out e2bwire.ManyMetricsBody
		_ = json.Unmarshal(data, &out)
		return code, out
	}
	if code, out := many(keyAlice, "?sandbox_ids="+e2.SandboxID+",nosuchsandbox0000000"); code != 200 || len(out.Sandboxes) != 1 || out.Sandboxes[e2.SandboxID].MemUsed != 60<<20 {
		t.Errorf("GET /sandboxes/metrics = %d %+v", code, out)
	}
	if code, out := many(keyBob, "?sandbox_ids="+e2.SandboxID); code != 200 || len(out.Sandboxes) != 0 {
		t.Errorf("another key's GET /sandboxes/metrics = %d %+v", code, out)
	}
	if code, _ := many(keyAlice, ""); code != 400 {
		t.Errorf("GET /sandboxes/metrics without sandbox_ids = %d, want 400", code)
	}

	// Its logs: what the node recorded of it, events and commands.
	code, data, _ := e.e2bCall(t, "GET", "/v2/sandboxes/"+e2.SandboxID+"/logs", keyAlice, "", nil)
	var logs e2bwire.LogsV2Body
	if code != 200 || json.Unmarshal(data, &logs) != nil || len(logs.Logs) != 2 || logs.Logs[0].Message != "ready" || logs.Logs[1].Message != "exec ls (exit 0)" {
		t.Errorf("v2 logs = %d %s", code, data)
	}
	code, data, _ = e.e2bCall(t, "GET", "/sandboxes/"+e2.SandboxID+"/logs?limit=1", keyAlice, "", nil)
	var v1 e2bwire.LogsBody
	if code != 200 || json.Unmarshal(data, &v1) != nil || len(v1.Logs) != 1 || v1.Logs[0].Line != "[info] ready" {
		t.Errorf("v1 logs = %d %s", code, data)
	}
	if code, _, _ := e.e2bCall(t, "GET", "/v2/sandboxes/"+e2.SandboxID+"/logs?level=loud", keyAlice, "", nil); code != 400 {
		t.Errorf("logs at a bad level = %d, want 400", code)
	}
	if code, _, _ := e.e2bCall(t, "GET", "/v2/sandboxes/"+e2.SandboxID+"/logs", keyBob, "", nil); code != 404 {
		t.Errorf("another key's logs = %d, want 404", code)
	}
}

// TestE2BPause: E2B's pause answers 204, then 409; the sandbox lists as
// paused; connect resumes it with 201 and its token.
func TestE2BPause(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", keyAlice, "", nil); code != 204 {
		t.Fatalf("pause = %d %s", code, data)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", keyAlice, "", nil); code != 409 {
		t.Errorf("pause again = %d %s, want 409", code, data)
	}
	listed, _ := e.e2bList(t, "/v2/sandboxes?state=paused", keyAlice)
	if len(listed) != 1 || listed[0].SandboxID != sb.SandboxID || listed[0].State != "paused" {
		t.Errorf("paused listing = %+v", listed)
	}
	if running, _ := e.e2bList(t, "/v2/sandboxes?state=running", keyAlice); len(running) != 0 {
		t.Errorf("running listing holds the paused sandbox: %+v", running)
	}
	var body e2bwire.SandboxBody
	code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", keyAlice, `{"timeout":60}`, nil)
	if code != 201 {
		t.Fatalf("connect to a paused sandbox = %d %s, want 201", code, data)
	}
	if err := json.Unmarshal(data, &body); err != nil || body.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("connect body %s: %v", data, err)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/resume", keyAlice, "", nil); code != 409 {
		t.Errorf("resume of a running sandbox = %d %s, want 409", code, data)
	}
	// A pause its node has no disk room for: E2B's 429 with the daemon's
	// words, the sandbox running on.
	full := e.e2bCreate(t, keyAlice, `{"templateID":"minimal","metadata":{"disk":"full"}}`)
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+full.SandboxID+"/pause", keyAlice, "", nil); code != 429 || !strings.Contains(string(data), "no room on the disk") {
		t.Errorf("pause its node has no room for = %d %s, want 429 with the daemon's words", code, data)
	}
	running, _ := e.e2bList(t, "/v2/sandboxes?state=running", keyAlice)
	if !slices.ContainsFunc(running, func(l e2bwire.ListedBody) bool { return l.SandboxID == full.SandboxID }) {
		t.Errorf("after the refused pause, running: %+v, want it among them", running)
	}
}

// TestAsOwner: an automatic resume acts as the sandbox's owner key (its
// quota caps the deadline given), whoever woke it; the operator where
// there are no keys or the owner's key is gone from the file.
func TestAsOwner(t *testing.T) {
	keys := "keys:\n" +
		"  - {id: alice, sha256: " + auth.HashKey(keyAlice) + ", admin: true}\n" +
		"  - {id: carol, sha256: " + auth.HashKey(keyCarol) + ", quota: {max_timeout: 1h}}\n"
	ks, err := LoadKeys(writeFile(t, "keys.yaml", []byte(keys)))
	if err != nil {
		t.Fatal(err)
	}
	pod := func(owner string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelOwner: owner}}}
	}
	g := &Gateway{cfg: Config{Keys: ks}}
	if p := g.asOwner(pod("carol")); p.Operator || p.Key.ID != "carol" || p.Key.Quota.MaxTimeout != time.Hour {
		t.Errorf("carol's sandbox resumes as %+v, want carol's key with its 1h max_timeout", p)
	}
	if p := g.asOwner(pod("dave")); !p.Operator || p.Key.ID != "" {
		t.Errorf("a sandbox of a key gone from the file resumes as %+v, want the operator", p)
	}
	if p := (&Gateway{}).asOwner(pod("carol")); !p.Operator {
		t.Errorf("without keys: %+v, want the operator", p)
	}
	// The quota reaches the deadline: paused with under a second left,
	// a resume gives the default timeout, capped at carol's 1h.
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	p := pod("carol")
	p.Annotations = map[string]string{
		node.AnnotationPaused:   now.Add(-time.Minute).Format(time.RFC3339Nano),
		node.AnnotationDeadline: now.Add(-time.Minute).Format(time.RFC3339),
	}
	g.cfg.DefaultTimeout = 2 * time.Hour
	dl, ok := g.resumeDeadline(p, now, 0, g.asOwner(p).Key.Quota.MaxTimeout)
	if want := deadlineAt(now, time.Hour); !ok || dl != want {
		t.Errorf("resume deadline %q %v, want %q", dl, ok, want)
	}
}
