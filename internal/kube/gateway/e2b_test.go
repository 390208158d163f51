package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/proto/envd"
)

// e2bCall sends a request (headers h, besides the key; the native API's
// call too) and returns the status, the body and the headers.
func (e env) e2bCall(t *testing.T, method, path, key, body string, h map[string]string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for k, v := range h {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data, resp.Header
}

// e2bError decodes an answer that must be in E2B's error shape.
func e2bError(t *testing.T, status int, data []byte) e2bwire.ErrorBody {
	t.Helper()
	var eb e2bwire.ErrorBody
	if err := json.Unmarshal(data, &eb); err != nil || eb.Code != status || eb.Message == "" {
		t.Fatalf("%d %q is not E2B's error shape", status, data)
	}
	return eb
}

func (e env) e2bCreate(t *testing.T, key, body string) e2bwire.SandboxBody {
	t.Helper()
	code, data, _ := e.e2bCall(t, "POST", "/sandboxes", key, body, nil)
	var sb e2bwire.SandboxBody
	if code != 201 || json.Unmarshal(data, &sb) != nil {
		t.Fatalf("E2B create = %d %s", code, data)
	}
	return sb
}

func (e env) e2bList(t *testing.T, path, key string) ([]e2bwire.ListedBody, http.Header) {
	t.Helper()
	code, data, h := e.e2bCall(t, "GET", path, key, "", nil)
	var out []e2bwire.ListedBody
	if code != 200 || json.Unmarshal(data, &out) != nil {
		t.Fatalf("GET %s = %d %s", path, code, data)
	}
	return out, h
}

func listedIDs(l []e2bwire.ListedBody) []string {
	var out []string
	for _, sb := range l {
		out = append(out, sb.SandboxID)
	}
	return out
}

// TestE2BControlPlane: E2B's create makes a pod that carries what the
// node needs (user, sudo, network) and only the token's hash; list, get
// and kill see only the key's own E2B sandboxes.
func TestE2BControlPlane(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal","timeout":60,"metadata":{"team":"a"},"envVars":{"A":"1"},"allow_internet_access":false,"secure":true}`)
	if sb.TemplateID != "minimal" || sb.EnvdAccessToken == "" || sb.Domain != e2bwire.DefaultDomain || sb.EnvdVersion != envd.Version {
		t.Errorf("created = %+v", sb)
	}
	pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.SandboxID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := pod.Annotations
	if a[AnnotationEnvdTokenSHA256] != tokenHash(sb.EnvdAccessToken) || a[node.AnnotationUser] != "user" || a[node.AnnotationAllowSudo] != "true" ||
		a[node.AnnotationNetwork] != `{"mode":"none"}` || a[node.AnnotationEnv] != `{"A":"1"}` || a[AnnotationE2BMetadata] != `{"team":"a"}` {
		t.Errorf("pod annotations = %v", a)
	}
	for k, v := range a {
		if strings.Contains(v, sb.EnvdAccessToken) {
			t.Errorf("annotation %s holds the access token", k)
		}
	}
	if dl, err := time.Parse(time.RFC3339, pod.Annotations[node.AnnotationDeadline]); err != nil || dl.Before(time.Now().Add(50*time.Second)) || dl.After(time.Now().Add(62*time.Second)) {
		t.Errorf("deadline annotation = %q (%v), want 60 s from the create", pod.Annotations[node.AnnotationDeadline], err)
	}
	// A native sandbox is no E2B sandbox.
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, "", nil); code != 201 {
		t.Fatalf("native create = %d %+v", code, eb)
	}
	more := []string{sb.SandboxID}
	for range 2 {
		more = append(more, e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`).SandboxID)
	}
	bobs := e.e2bCreate(t, keyBob, `{"templateID":"minimal","metadata":{"team":"b"}}`)

	all, _ := e.e2bList(t, "/sandboxes", keyAlice)
	got := listedIDs(all)
	slices.Sort(got)
	want := slices.Clone(more)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("alice lists %v, want %v", got, want)
	}
	if l, _ := e.e2bList(t, "/v2/sandboxes?metadata=team%3Da", keyAlice); len(l) != 1 || l[0].SandboxID != sb.SandboxID || l[0].Metadata["team"] != "a" || l[0].State != "running" {
		t.Errorf("alice's team=a = %+v", l)
	}
	if l, _ := e.e2bList(t, "/v2/sandboxes", keyBob); len(l) != 1 || l[0].SandboxID != bobs.SandboxID {
		t.Errorf("bob lists %v", listedIDs(l))
	}
	if l, _ := e.e2bList(t, "/v2/sandboxes?state=paused", keyAlice); len(l) != 0 {
		t.Errorf("paused = %v", listedIDs(l))
	}
	// Pages of two, oldest first: all three, none twice.
	var paged []string
	next := ""
	for range 3 {
		l, h := e.e2bList(t, "/v2/sandboxes?order=asc&limit=2&nextToken="+next, keyAlice)
		paged = append(paged, listedIDs(l)...)
		if next = h.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(paged) != 3 || !slices.Equal(slices.Sorted(slices.Values(paged)), want) {
		t.Errorf("paged = %v, want %v", paged, want)
	}

	code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+sb.SandboxID, keyAlice, "", nil)
	var d e2bwire.DetailBody
	if code != 200 || json.Unmarshal(data, &d) != nil || d.SandboxID != sb.SandboxID || d.AllowInternetAccess || d.EnvdAccessToken != "" || d.Domain != e2bwire.DefaultDomain {
		t.Errorf("get = %d %s", code, data)
	}
	for _, r := range []struct{ method, path string }{{"GET", "/sandboxes/" + sb.SandboxID}, {"DELETE", "/sandboxes/" + sb.SandboxID}, {"POST", "/sandboxes/" + sb.SandboxID + "/timeout"}} {
		if code, data, _ := e.e2bCall(t, r.method, r.path, keyBob, `{"timeout":30}`, nil); code != 404 {
			t.Errorf("bob %s %s = %d %s, want 404", r.method, r.path, code, data)
		} else {
			e2bError(t, 404, data)
		}
	}
	// timeout and refreshes move the pod's deadline annotation (which the
	// node follows); a bad body names its field and moves nothing.
	last := ""
	for _, c := range []struct {
		path, body string
		code       int
		after      time.Duration
	}{
		{"/timeout", `{"timeout":3600}`, 204, time.Hour},
		{"/refreshes", `{"duration":0}`, 204, e2bwire.DefaultTimeout},
		{"/refreshes", `{"duration":600}`, 204, 10 * time.Minute},
		{"/timeout", `{}`, 400, 0},
		{"/timeout", `{"timeout":-1}`, 400, 0},
		{"/refreshes", `{"duration":-1}`, 400, 0},
		{"/timeout", `{"timeout":999999999}`, 400, 0},
	} {
		before := time.Now()
		code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+c.path, keyAlice, c.body, nil)
		if code != c.code {
			t.Errorf("%s %s = %d %s, want %d", c.path, c.body, code, data, c.code)
			continue
		}
		if code != 204 {
			if eb := e2bError(t, code, data); !strings.Contains(eb.Message, "timeout") && !strings.Contains(eb.Message, "duration") {
				t.Errorf("%s %s: message %q names no field", c.path, c.body, eb.Message)
			}
		}
		got, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.SandboxID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ann := got.Annotations[node.AnnotationDeadline]
		if code != 204 {
			if ann != last {
				t.Errorf("refused %s %s moved the deadline from %q to %q", c.path, c.body, last, ann)
			}
			continue
		}
		// The annotation has whole seconds, rounded up.
		dl, err := time.Parse(time.RFC3339, ann)
		if err != nil || dl.Before(before.Add(c.after)) || dl.After(time.Now().Add(c.after+time.Second)) {
			t.Errorf("after %s %s: deadline %q (%v), want %s from the request", c.path, c.body, ann, err, c.after)
		}
		last = ann
	}
	// Not served yet: E2B-shaped 501s, never 404.
	for _, r := range []struct{ method, path string }{
		{"POST", "/snapshots"}, {"GET", "/templates"}, {"GET", "/v3/templates"}, {"GET", "/v2/templates/base/builds/b1"}, {"DELETE", "/templates/Base_1"},
	} {
		code, data, _ := e.e2bCall(t, r.method, r.path, keyAlice, `{"timeout":30}`, nil)
		if code != 501 {
			t.Errorf("%s %s = %d %s, want 501", r.method, r.path, code, data)
			continue
		}
		e2bError(t, 501, data)
	}

	if code, data, _ := e.e2bCall(t, "DELETE", "/sandboxes/"+sb.SandboxID, keyAlice, "", nil); code != 204 {
		t.Fatalf("kill = %d %s", code, data)
	}
	if slices.Contains(e.podNames(t), sb.SandboxID) {
		t.Errorf("pod %s outlived its kill", sb.SandboxID)
	}
}

// TestE2BCreateRefused: a bad create is answered in E2B's shape, naming
// the field, and makes no pod.
func TestE2BCreateRefused(t *testing.T) {
	e := startGateway(t, true)
	for _, tc := range []struct {
		body   string
		status int
		field  string
	}{
		{`{"templateID":"nosuch"}`, 404, "templateID"},
		{`{}`, 400, "templateID"},
		{`{"templateID":"minimal","timeout":-5}`, 400, "timeout"},
		{`{"templateID":"minimal","timeout":0}`, 400, "timeout"},
		{`{"templateID":"minimal","timeout":999999999}`, 400, "timeout"},
		{`{"templateID":"minimal","timeout":"10"}`, 400, "timeout"},
		{`{"templateID":"minimal","secure":false}`, 400, "secure"},
		{`{"templateID":"minimal","network":{"denyOut":["not-an-ip"]}}`, 400, "network.denyOut"},
		{`{"templateID":"minimal","metadata":{"":"x"}}`, 400, "metadata"},
		{`{"templateID":"minimal","volumeMounts":[{"name":"v","path":"/data"}]}`, 400, "volumeMounts"},
	} {
		code, data, _ := e.e2bCall(t, "POST", "/sandboxes", keyAlice, tc.body, nil)
		if code != tc.status {
			t.Errorf("create %s = %d %s, want %d", tc.body, code, data, tc.status)
			continue
		}
		if eb := e2bError(t, code, data); !strings.Contains(eb.Message, tc.field) {
			t.Errorf("create %s: message %q does not name %s", tc.body, eb.Message, tc.field)
		}
	}
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes", "", `{"templateID":"minimal"}`, nil); code != 401 {
		t.Errorf("create without a key = %d %s", code, data)
	} else {
		e2bError(t, 401, data)
	}
	if names := e.podNames(t); len(names) != 0 {
		t.Errorf("refused creates made pods %v", names)
	}
}

// TestE2BDataPlane: E2B's data plane, by header or by Host, reaches the
// node's agent route of the sandbox with its token or its owner's key,
// and nothing else does.
func TestE2BDataPlane(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	byHeader := func(extra map[string]string) map[string]string {
		h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	host := "49983-" + sb.SandboxID + "." + e2bwire.DefaultDomain
	for name, tc := range map[string]struct {
		key  string
		h    map[string]string
		code int
	}{
		"token":           {"", byHeader(map[string]string{"X-Access-Token": sb.EnvdAccessToken}), 200},
		"token by host":   {"", map[string]string{"Host": host, "X-Access-Token": sb.EnvdAccessToken}, 200},
		"owner's key":     {keyAlice, byHeader(nil), 200},
		"wrong token":     {"", byHeader(map[string]string{"X-Access-Token": "nope"}), 401},
		"wrong token+key": {keyAlice, byHeader(map[string]string{"X-Access-Token": "nope"}), 401},
		"other key":       {keyBob, byHeader(nil), 401},
		"nothing":         {"", map[string]string{"Host": host}, 401},
		"preview port":    {"", map[string]string{"Host": "3000-" + sb.SandboxID + "." + e2bwire.DefaultDomain}, 200},
		"no sandbox":      {"", map[string]string{"E2b-Sandbox-Id": "nosuchsandbox1", "X-Access-Token": sb.EnvdAccessToken}, 502},
		"bad port":        {"", byHeader(map[string]string{"E2b-Sandbox-Port": "x"}), 400},
	} {
		code, data, h := e.e2bCall(t, "POST", "/process.Process/Start?q=1", tc.key, "payload", tc.h)
		if code != tc.code {
			t.Errorf("%s: %d %s, want %d", name, code, data, tc.code)
			continue
		}
		if code != 200 {
			e2bError(t, code, data)
			continue
		}
		want := "/agent/process.Process/Start"
		if name == "preview port" {
			want = "/ports/3000/process.Process/Start"
		}
		if p := h.Get("X-Got-Path"); !strings.HasPrefix(p, node.DataPlanePrefix+"/v1/sandboxes/"+nodeSbPref) || !strings.HasSuffix(p, want) || string(data) != "payload" {
			t.Errorf("%s: node saw %q with %q", name, p, data)
		}
		if k := h.Get("X-Got-Key"); k != "" {
			t.Errorf("%s: the API key reached the node", name)
		}
	}
	// Without the header or a preview Host, the same path is no sandbox's.
	if code, _, _ := e.e2bCall(t, "POST", "/process.Process/Start", "", "", nil); code != 501 {
		t.Errorf("an unrouted path = %d, want 501", code)
	}
}

// TestE2BConnect: connect hands out the token the create returned (the
// same from any replica: it is derived from the shared key), extends the
// deadline only, and answers 404 for another key's sandbox; a pod whose
// hash is not the derived token's gets no token.
func TestE2BConnect(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal","timeout":600}`)
	pods := e.kube.CoreV1().Pods(ns)
	before, err := pods.Get(t.Context(), sb.SandboxID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got e2bwire.SandboxBody
	connect := func(key, body string) int {
		t.Helper()
		got = e2bwire.SandboxBody{}
		code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", key, body, nil)
		if code == 200 {
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
		} else {
			e2bError(t, code, data)
		}
		return code
	}
	// A shorter timeout leaves the deadline.
	if code := connect(keyAlice, `{"timeout":60}`); code != 200 || got.EnvdAccessToken != sb.EnvdAccessToken || got.SandboxID != sb.SandboxID || got.TemplateID != "minimal" {
		t.Fatalf("connect = %d %+v, want the create's token %s", code, got, sb.EnvdAccessToken)
	}
	if p, _ := pods.Get(t.Context(), sb.SandboxID, metav1.GetOptions{}); p.Annotations[node.AnnotationDeadline] != before.Annotations[node.AnnotationDeadline] {
		t.Errorf("a shorter connect timeout moved the deadline: %q → %q", before.Annotations[node.AnnotationDeadline], p.Annotations[node.AnnotationDeadline])
	}
	if code := connect(keyAlice, `{"timeout":3600}`); code != 200 {
		t.Fatalf("connect with a longer timeout = %d", code)
	}
	p, _ := pods.Get(t.Context(), sb.SandboxID, metav1.GetOptions{})
	if dl, err := time.Parse(time.RFC3339, p.Annotations[node.AnnotationDeadline]); err != nil || dl.Before(time.Now().Add(59*time.Minute)) {
		t.Errorf("a longer connect timeout left the deadline at %q", p.Annotations[node.AnnotationDeadline])
	}
	if code := connect(keyBob, `{}`); code != 404 {
		t.Errorf("another key's connect = %d, want 404", code)
	}
	if code, _, _ := e.e2bCall(t, "POST", "/v2/sandboxes/nosuchsandbox0000000/connect", keyAlice, `{}`, nil); code != 404 {
		t.Errorf("connect to no sandbox = %d, want 404", code)
	}
	// A pod whose token was not derived from this key (made under another
	// one) gets none.
	p.Annotations[AnnotationEnvdTokenSHA256] = tokenHash("a token of another key")
	if _, err := pods.Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for code := 0; code != 409; {
		// The informer's cache has the new hash once connect says so.
		if code = connect(keyAlice, `{}`); code != 200 && code != 409 {
			t.Fatalf("connect to a pod of another key's token = %d, want 409", code)
		}
	}
}

// TestE2BSignedFiles: a /files URL signed with the sandbox's token (as
// the SDKs' uploadUrl and downloadUrl make them) reaches its agent with
// no token or key, named by header or by nothing at all (the signature
// finds it); a signature for another path, operation or sandbox, or an
// expired one, is 401.
func TestE2BSignedFiles(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	other := e.e2bCreate(t, keyBob, `{"templateID":"minimal"}`)
	signed := func(path, op, token string, exp int64) string {
		q := "/files?path=" + path + "&username=user&signature=" + url.QueryEscape(envd.FileSignature(path, op, "user", token, exp))
		if exp != 0 {
			q += "&signature_expiration=" + strconv.FormatInt(exp, 10)
		}
		return q
	}
	hdr := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983"}
	later := time.Now().Add(time.Hour).Unix()
	for name, tc := range map[string]struct {
		method, url string
		h           map[string]string
		code        int
		sandbox     string
	}{
		"read by header":        {"GET", signed("/tmp/a", "read", sb.EnvdAccessToken, 0), hdr, 200, sb.SandboxID},
		"write by header":       {"POST", signed("/tmp/a", "write", sb.EnvdAccessToken, later), hdr, 200, sb.SandboxID},
		"read, no sandbox":      {"GET", signed("/tmp/a", "read", sb.EnvdAccessToken, later), nil, 200, sb.SandboxID},
		"other's, no sandbox":   {"GET", signed("/tmp/a", "read", other.EnvdAccessToken, 0), nil, 200, other.SandboxID},
		"other's, named":        {"GET", signed("/tmp/a", "read", other.EnvdAccessToken, 0), hdr, 401, ""},
		"read signed for write": {"GET", signed("/tmp/a", "write", sb.EnvdAccessToken, 0), hdr, 401, ""},
		"expired":               {"GET", signed("/tmp/a", "read", sb.EnvdAccessToken, time.Now().Add(-time.Minute).Unix()), nil, 401, ""},
		"forged":                {"GET", strings.Replace(signed("/tmp/a", "read", sb.EnvdAccessToken, 0), "/tmp/a", "/tmp/b", 1), nil, 401, ""},
		"wrong token":           {"GET", signed("/tmp/a", "read", "nope", 0), nil, 401, ""},
	} {
		code, data, h := e.e2bCall(t, tc.method, tc.url, "", "body", tc.h)
		if code != tc.code {
			t.Errorf("%s: %d %s, want %d", name, code, data, tc.code)
			continue
		}
		if code != 200 {
			e2bError(t, code, data)
			continue
		}
		pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), tc.sandbox, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodeSb := strings.Split(pod.Status.ContainerStatuses[0].ContainerID, "/")[2]
		if p := h.Get("X-Got-Path"); p != node.DataPlanePrefix+"/v1/sandboxes/"+nodeSb+"/agent/files" {
			t.Errorf("%s: node saw %q, want sandbox %s's /files", name, p, nodeSb)
		}
	}
}

// TestE2BUpdateNetwork: PUT /sandboxes/{id}/network becomes the pod's
// network annotation (the node applies it) with E2B's settings beside it,
// which getInfo then reports; ingress settings and bad entries are
// refused by name and change nothing; another key's sandbox is 404.
func TestE2BUpdateNetwork(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal","allow_internet_access":false}`)
	annotations := func() map[string]string {
		t.Helper()
		p, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.SandboxID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Annotations
	}
	path := "/sandboxes/" + sb.SandboxID + "/network"
	if code, data, _ := e.e2bCall(t, "PUT", path, keyAlice, `{"allowOut":["pypi.org"],"denyOut":["0.0.0.0/0"]}`, nil); code != 204 {
		t.Fatalf("update network = %d %s", code, data)
	}
	a := annotations()
	if a[node.AnnotationNetwork] != `{"mode":"allow","allow":["pypi.org"]}` {
		t.Errorf("network annotation = %s", a[node.AnnotationNetwork])
	}
	code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+sb.SandboxID, keyAlice, "", nil)
	var d e2bwire.DetailBody
	var n e2bwire.NetworkConfig
	if code != 200 || json.Unmarshal(data, &d) != nil || d.AllowInternetAccess || json.Unmarshal(d.Network, &n) != nil || !slices.Equal(n.AllowOut, []string{"pypi.org"}) {
		t.Errorf("get after the update = %d %s", code, data)
	}
	for _, tc := range []struct {
		key, body string
		code      int
		names     string
	}{
		{keyAlice, `{"allowPublicTraffic":false}`, 400, "allowPublicTraffic"},
		{keyAlice, `{"allowOut":["bad domain!"]}`, 400, "bad domain"},
		{keyAlice, `{"allowOut":["refused.example"],"denyOut":["0.0.0.0/0"]}`, 403, "refused.example"},
		{keyBob, `{}`, 404, ""},
	} {
		code, data, _ := e.e2bCall(t, "PUT", path, tc.key, tc.body, nil)
		if code != tc.code {
			t.Errorf("update %s = %d %s, want %d", tc.body, code, data, tc.code)
			continue
		}
		if eb := e2bError(t, code, data); !strings.Contains(eb.Message, tc.names) {
			t.Errorf("update %s: message %q does not name %s", tc.body, eb.Message, tc.names)
		}
		if now := annotations(); now[node.AnnotationNetwork] != a[node.AnnotationNetwork] || now[AnnotationE2BNetwork] != a[AnnotationE2BNetwork] {
			t.Errorf("refused update %s changed the annotations: %v", tc.body, now)
		}
	}
}

// TestE2BPreview: a sandbox made with allowPublicTraffic: false gets a
// trafficAccessToken (connect hands it out again); its ports answer only
// requests carrying it, which goes no further than the gateway; an open
// sandbox's ports answer anyone, by Host or by header, with the Host the
// client used.
func TestE2BPreview(t *testing.T) {
	e := startGateway(t, true)
	var private e2bwire.SandboxBody
	code, data, _ := e.e2bCall(t, "POST", "/sandboxes", keyAlice, `{"templateID":"minimal","network":{"allowPublicTraffic":false}}`, nil)
	if code != 201 || json.Unmarshal(data, &private) != nil || private.TrafficAccessToken == nil || *private.TrafficAccessToken == "" {
		t.Fatalf("create with allowPublicTraffic false = %d %s, want a trafficAccessToken", code, data)
	}
	var again e2bwire.SandboxBody
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+private.SandboxID+"/connect", keyAlice, `{}`, nil); code != 200 || json.Unmarshal(data, &again) != nil ||
		again.TrafficAccessToken == nil || *again.TrafficAccessToken != *private.TrafficAccessToken {
		t.Errorf("connect = %d %s, want the create's trafficAccessToken", code, data)
	}
	open := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	host := func(id string) string { return "8080-" + id + "." + e2bwire.DefaultDomain }
	for name, tc := range map[string]struct {
		h    map[string]string
		code int
	}{
		"private, token":       {map[string]string{"Host": host(private.SandboxID), e2bwire.TrafficTokenHeader: *private.TrafficAccessToken}, 200},
		"private, no token":    {map[string]string{"Host": host(private.SandboxID)}, 403},
		"private, wrong token": {map[string]string{"Host": host(private.SandboxID), e2bwire.TrafficTokenHeader: "nope"}, 403},
		"private, envd token":  {map[string]string{"Host": host(private.SandboxID), "X-Access-Token": private.EnvdAccessToken}, 403},
		"open, by host":        {map[string]string{"Host": host(open.SandboxID)}, 200},
		"open, by header":      {map[string]string{"E2b-Sandbox-Id": open.SandboxID, "E2b-Sandbox-Port": "8080"}, 200},
	} {
		code, data, h := e.e2bCall(t, "GET", "/index.html?x=1", "", "", tc.h)
		if code != tc.code {
			t.Errorf("%s: %d %s, want %d", name, code, data, tc.code)
			continue
		}
		if code != 200 {
			e2bError(t, code, data)
			continue
		}
		if p, q := h.Get("X-Got-Path"), h.Get("X-Got-Query"); !strings.HasSuffix(p, "/ports/8080/index.html") || q != "x=1" {
			t.Errorf("%s: node saw %s?%s", name, p, q)
		}
		if s := h.Get("X-Got-Secrets"); s != "" {
			t.Errorf("%s: a token reached the node: %q", name, s)
		}
		if want := tc.h["Host"]; want != "" && h.Get("X-Got-Host") != want {
			t.Errorf("%s: node saw Host %q, want the client's %q", name, h.Get("X-Got-Host"), want)
		}
	}
}

// TestTokenKeyRotation: the Secret replaced with a new current key and
// the old one retired, a replica reading it again hands out a sandbox's
// token made under the old key (connect, signed URLs) and derives new
// sandboxes' tokens from the new one; with the old key dropped, connect
// answers 409 for the sandboxes made under it. A Secret gone or holding a
// short key changes nothing.
func TestTokenKeyRotation(t *testing.T) {
	e := startGateway(t, true)
	ctx := t.Context()
	old := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	secrets := e.kube.CoreV1().Secrets(ns)
	s, err := secrets.Get(ctx, TokenKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keyA := s.Data[tokenKeyField]
	keyB := bytes.Repeat([]byte{7}, tokenKeyLen)
	replace := func(data map[string][]byte) {
		t.Helper()
		if err := secrets.Delete(ctx, TokenKeySecret, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: TokenKeySecret, Namespace: ns}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(id string) (int, e2bwire.SandboxBody) {
		t.Helper()
		var got e2bwire.SandboxBody
		code, data, _ := e.e2bCall(t, "POST", "/sandboxes/"+id+"/connect", keyAlice, `{}`, nil)
		if code == 200 {
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
		}
		return code, got
	}

	replace(map[string][]byte{tokenKeyField: keyB, retiredKeyPrefix + "-1": keyA})
	if err := e.g.readTokenKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if code, got := connect(old.SandboxID); code != 200 || got.EnvdAccessToken != old.EnvdAccessToken {
		t.Errorf("connect under a retired key = %d, token %q; want 200 and the create's %q", code, got.EnvdAccessToken, old.EnvdAccessToken)
	}
	signed := "/files?path=/tmp/a&username=user&signature=" + url.QueryEscape(envd.FileSignature("/tmp/a", "read", "user", old.EnvdAccessToken, 0))
	if code, data, _ := e.e2bCall(t, "GET", signed, "", "", nil); code != 200 {
		t.Errorf("a URL signed with a retired key's token = %d %s, want 200", code, data)
	}
	fresh := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	if want := derive(keyB, envdPurpose, fresh.SandboxID); fresh.EnvdAccessToken != want {
		t.Errorf("a new sandbox's token %q is not the new key's %q", fresh.EnvdAccessToken, want)
	}

	// The old key dropped: its sandbox's token is no more handed out.
	replace(map[string][]byte{tokenKeyField: keyB})
	if err := e.g.readTokenKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _ := connect(old.SandboxID); code != 409 {
		t.Errorf("connect with its key dropped = %d, want 409", code)
	}
	if code, data, _ := e.e2bCall(t, "GET", signed, "", "", nil); code != 401 {
		t.Errorf("a URL signed with a dropped key's token = %d %s, want 401", code, data)
	}
	if code, got := connect(fresh.SandboxID); code != 200 || got.EnvdAccessToken != fresh.EnvdAccessToken {
		t.Errorf("connect under the current key = %d %q", code, got.EnvdAccessToken)
	}

	// A short retired key is refused whole; a Secret gone is not made
	// again by a reload; the keys stay as they were either way.
	replace(map[string][]byte{tokenKeyField: keyA, retiredKeyPrefix + "-short": []byte("short")})
	if err := e.g.readTokenKeys(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), retiredKeyPrefix+"-short") {
		t.Errorf("a short retired key: %v, want failed_precondition naming it", err)
	}
	if err := secrets.Delete(ctx, TokenKeySecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.g.readTokenKeys(ctx); err == nil {
		t.Error("a reload without the Secret succeeded")
	}
	if _, err := secrets.Get(ctx, TokenKeySecret, metav1.GetOptions{}); err == nil {
		t.Error("a reload made the Secret again")
	}
	if code, got := connect(fresh.SandboxID); code != 200 || got.EnvdAccessToken != fresh.EnvdAccessToken {
		t.Errorf("connect after refused reloads = %d %q, want the current key's token", code, got.EnvdAccessToken)
	}
}

// TestE2BTemplateBuild: E2B's template builds through the gateway go to
// the builder node's daemon (its upload links made the gateway's, naming
// the node); a build the node finished is recorded as the cluster's, with
// its tags, and reported "building" until every Ready node has it; tags
// resolve in a create, in fromTemplate and in Template.exists.
func TestE2BTemplateBuild(t *testing.T) {
	keyed := startGateway(t, true)
	if code, data, _ := keyed.e2bCall(t, "POST", "/v3/templates", keyAlice, `{"name":"app"}`, nil); code != 403 || !strings.Contains(string(data), "admin API key") {
		t.Errorf("request with a key that is no admin's = %d %s, want 403", code, data)
	}

	e := startGateway(t, false)
	code, data, _ := e.e2bCall(t, "POST", "/v3/templates", "", `{"name":"app","tags":["v1"]}`, nil)
	if code != 202 || !strings.Contains(string(data), `"buildID":"b1"`) {
		t.Fatalf("request = %d %s", code, data)
	}
	hash := strings.Repeat("ab", 32)
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	code, data, _ = e.e2bCall(t, "GET", "/templates/app/files/"+hash, "", "", nil)
	if code != 201 || json.Unmarshal(data, &link) != nil {
		t.Fatalf("upload link = %d %s", code, data)
	}
	want := e.url + "/templates/app/files/" + hash + "?expires=1&node=berth-a&signature=s"
	if link.Present || link.URL != want {
		t.Fatalf("upload link = %+v, want %s", link, want)
	}
	// The link needs no key; the node's daemon checks its signature.
	req, _ := http.NewRequestWithContext(t.Context(), "PUT", link.URL, strings.NewReader("tar"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 || resp.Header.Get("X-Got-Path") != node.DataPlanePrefix+node.E2BPrefix+"/templates/app/files/"+hash ||
		resp.Header.Get("X-Got-Query") != "expires=1&signature=s" || resp.Header.Get("X-Got-Body") != "tar" {
		t.Errorf("upload = %d, node saw %s ? %s body %q", resp.StatusCode, resp.Header.Get("X-Got-Path"), resp.Header.Get("X-Got-Query"), resp.Header.Get("X-Got-Body"))
	}
	if code, data, _ := e.e2bCall(t, "PUT", "/templates/app/files/"+hash+"?expires=1&signature=s&node=gone", "", "tar", nil); code != 404 {
		t.Errorf("upload to a node that is none = %d %s, want 404", code, data)
	}

	// Triggered on the build's node; a build no node has is 404.
	code, data, h := e.e2bCall(t, "POST", "/v2/templates/app/builds/b1", "", `{"fromTemplate":"minimal","steps":[]}`, nil)
	if code != 202 || h.Get("X-Got-Path") != node.DataPlanePrefix+node.E2BPrefix+"/v2/templates/app/builds/b1" {
		t.Errorf("trigger = %d %s, node saw %s", code, data, h.Get("X-Got-Path"))
	}
	if code, _, _ := e.e2bCall(t, "GET", "/templates/app/builds/nope/status", "", "", nil); code != 404 {
		t.Errorf("status of a build no node has = %d, want 404", code)
	}

	// Ready on its node, not yet on every Ready node: still building,
	// and recorded as the cluster's with its tags.
	status := func() string {
		t.Helper()
		code, data, _ := e.e2bCall(t, "GET", "/templates/app/builds/b1/status?logsOffset=0", "", "", nil)
		var st struct {
			Status string   `json:"status"`
			Logs   []string `json:"logs"`
		}
		if code != 200 || json.Unmarshal(data, &st) != nil || len(st.Logs) != 1 {
			t.Fatalf("status = %d %s", code, data)
		}
		return st.Status
	}
	// A second Ready node, which lacks app.
	a, err := e.kube.CoreV1().Nodes().Get(t.Context(), "berth-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := a.DeepCopy()
	b.Name, b.ResourceVersion, b.Annotations = "berth-b", "", map[string]string{node.AnnotationTemplates: "minimal"}
	if _, err := e.kube.CoreV1().Nodes().Create(t.Context(), b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, e.g, "berth-b", true)
	annotate := func(name, templates, ids string) {
		t.Helper()
		n, err := e.kube.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Annotations[node.AnnotationTemplates], n.Annotations[node.AnnotationTemplateBuildIDs] = templates, ids
		if _, err := e.kube.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		awaitNodeWith(t, e.g, name, true, func(n *corev1.Node) bool {
			return n.Annotations[node.AnnotationTemplates] == templates && n.Annotations[node.AnnotationTemplateBuildIDs] == ids
		})
	}
	cms := e.kube.CoreV1().ConfigMaps(ns)
	// Ready on its node, whose annotation does not list it yet: building,
	// nothing recorded.
	if st := status(); st != "building" {
		t.Errorf("status while berth-a does not list app = %q, want building", st)
	}
	if _, err := cms.Get(t.Context(), TemplatesConfigMap, metav1.GetOptions{}); err == nil {
		t.Errorf("app recorded before its node listed it")
	}
	// Listed on berth-a: recorded as the cluster's, as berth-a's build,
	// with its tags; building while berth-b lacks it, or has another
	// build of it.
	buildA, buildOld := strings.Repeat("a1", 16), strings.Repeat("0f", 16)
	// berth-a still says its build before this one (its annotation
	// behind the rebuild): not recorded yet.
	annotate("berth-a", "minimal,app", "app="+buildOld)
	if st := status(); st != "building" {
		t.Errorf("status while berth-a reports its older build = %q, want building", st)
	}
	if _, err := cms.Get(t.Context(), TemplatesConfigMap, metav1.GetOptions{}); err == nil {
		t.Errorf("app recorded while its node reported the build before")
	}
	annotate("berth-a", "minimal,app", "app="+buildA)
	if st := status(); st != "building" {
		t.Errorf("status while berth-b lacks app = %q, want building", st)
	}
	cm, err := cms.Get(t.Context(), TemplatesConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec := templateStates(cm)["app"]
	if rec.Deleted || rec.Built.IsZero() || !rec.Built.Before(time.Now().Add(-50*time.Minute)) || !slices.Equal(rec.BuildIDs, []string{buildA}) {
		t.Errorf("app's record = %+v, want built when the build was asked for, as berth-a's build", rec)
	}
	tags, err := e.g.e2bTags(t.Context(), "app")
	if err != nil || len(tags) != 2 || tags["default"].Template != "app" || tags["v1"].BuildID != "b1" {
		t.Errorf("app's tags = %v (%v)", tags, err)
	}
	annotate("berth-b", "minimal,app", "app="+buildOld)
	if st := status(); st != "building" {
		t.Errorf("status while berth-b has an older build of app = %q, want building", st)
	}
	annotate("berth-b", "minimal,app", "app="+buildA)
	if st := status(); st != "ready" {
		t.Errorf("status once every node has app's build = %q, want ready", st)
	}

	// Tags: fromTemplate, exists, list, remove, create.
	_, _, h = e.e2bCall(t, "POST", "/v2/templates/app/builds/b1", "", `{"fromTemplate":"app:v1"}`, nil)
	if got := h.Get("X-Got-Body"); got != `{"fromTemplate":"app"}` {
		t.Errorf("trigger from app:v1 reached the node as %s, want the template the tag names", got)
	}
	for alias, want := range map[string]int{"app": 200, "app:v1": 200, "app:nope": 404, "nope": 404, "Bad!": 400} {
		if code, data, _ := e.e2bCall(t, "GET", "/templates/aliases/"+url.PathEscape(alias), "", "", nil); code != want {
			t.Errorf("exists %s = %d %s, want %d", alias, code, data, want)
		}
	}
	code, data, _ = e.e2bCall(t, "GET", "/templates/app/tags", "", "", nil)
	if code != 200 || !strings.Contains(string(data), `"tag":"default"`) || !strings.Contains(string(data), `"tag":"v1"`) {
		t.Errorf("tags = %d %s", code, data)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/templates/tags", "", `{"target":"app:v1","tags":["stable"]}`, nil); code != 201 {
		t.Errorf("assign stable = %d %s", code, data)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/templates/tags", "", `{"target":"app:nope","tags":["x"]}`, nil); code != 404 {
		t.Errorf("assign from a tag that is none = %d %s, want 404", code, data)
	}
	if code, data, _ := e.e2bCall(t, "DELETE", "/templates/tags", "", `{"name":"app","tags":["v1","nope"]}`, nil); code != 404 {
		t.Errorf("remove a tag that is none = %d %s, want 404", code, data)
	}
	if code, data, _ := e.e2bCall(t, "DELETE", "/templates/tags", "", `{"name":"app","tags":["v1"]}`, nil); code != 204 {
		t.Errorf("remove v1 = %d %s", code, data)
	}
	if code, data, _ := e.e2bCall(t, "POST", "/sandboxes", "", `{"templateID":"app:v1"}`, nil); code != 404 || !strings.Contains(string(data), "templateID") {
		t.Errorf("create from a removed tag = %d %s, want 404 naming templateID", code, data)
	}
	var sb e2bwire.SandboxBody
	code, data, _ = e.e2bCall(t, "POST", "/sandboxes", "", `{"templateID":"app:stable","timeout":30}`, nil)
	if code != 201 || json.Unmarshal(data, &sb) != nil || sb.TemplateID != "app" {
		t.Fatalf("create from app:stable = %d %s", code, data)
	}
}

// TestGetReadsTheAPIServer: a sandbox's get (E2B's getInfo, the native
// GET) answers with its pod as the API server has it, not as this
// replica's cache last heard: a resume through another replica (its node
// said so a moment ago) shows at once. The cache here is made to trail on
// purpose: it says paused, the API server says running.
func TestGetReadsTheAPIServer(t *testing.T) {
	e := startGateway(t, true)
	sb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	cached, err := e.g.podByID(sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	stale := cached.DeepCopy()
	stale.Status.Conditions = append(stale.Status.Conditions, corev1.PodCondition{Type: node.ConditionPaused, Status: corev1.ConditionTrue, Reason: node.PausePaused, Message: "pause applied: memory"})
	if err := e.g.podIndex.Update(stale); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.g.podByID(sb.SandboxID); state(got) != types.StatePaused {
		t.Fatalf("the cache says %s, want it made to trail (paused)", state(got))
	}
	var info struct{ State string }
	if code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+sb.SandboxID, keyAlice, "", nil); code != 200 || json.Unmarshal(data, &info) != nil || info.State != "running" {
		t.Errorf("E2B getInfo = %d %s, want running", code, data)
	}
	var native types.Sandbox
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.SandboxID, keyAlice, "", &native); code != 200 || native.State != types.StateReady {
		t.Errorf("GET /v1/sandboxes = %d %+v %+v, want ready", code, eb, native)
	}
	// Another key still does not see it, fresh or not.
	if code, _, _ := e.e2bCall(t, "GET", "/sandboxes/"+sb.SandboxID, keyBob, "", nil); code != 404 {
		t.Errorf("another key's getInfo = %d, want 404", code)
	}
}
