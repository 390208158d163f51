package kube

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/berth-sandbox/berth/internal/kube/gateway"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/test/harness"
)

// otherKey is a second key of the E2B test's gateways.
const otherKey = "e2b_fedcba9876543210fedcba9876543210fedcba98"

// TestGatewayE2B: the official npm e2b SDK, unchanged, against two
// gateway replicas of a cluster of two Berth nodes: sandboxes made through
// gateway A are pods made from the base template; commands (output,
// streaming, exit codes, E2B's user and sudo) and files reach them through
// either gateway and the node that runs them; B lists, gets and kills
// them; a second key sees none. Then, over E2B's REST: bad creates are
// answered in E2B's shape, naming the field, and make no pod; a wrong
// access token is 401; another key's sandbox is 404.
func TestGatewayE2B(t *testing.T) {
	nodeBin, dir := e2bSuite(t)
	c := startCluster(t, "berth-a", "berth-b")
	cp := c.cp
	ctx := t.Context()
	ns := gateway.DefaultNamespace
	keys, cert := gatewaySetup(t, cp, map[string]testKey{"other": {secret: otherKey}, "admin": {secret: adminKey, admin: true}})
	gwA := startGateway(t, cp, "gateway-a", keys, cert)
	gwB := startGateway(t, cp, "gateway-b", keys, cert)

	// The base template (E2B's "base": a "user" account, sudo) on both
	// nodes; each node says so on its Node object.
	bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(c.nodes))
	for _, d := range c.nodes {
		wg.Go(func() {
			if _, err := d.Client.BuildTemplate(bctx, "base", io.Discard); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("build base: %v", err)
	}
	for name := range c.nodes {
		waitNode(t, cp, name, func(n *corev1.Node) bool {
			return slices.Contains(strings.Split(n.Annotations[node.AnnotationTemplates], ","), "base")
		})
	}

	sctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var extraEnv []string
	run := func(what string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(sctx, nodeBin, append([]string{"--test", "--test-reporter=spec"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), extraEnv...)
		cmd.Env = append(cmd.Env,
			"E2B_API_URL="+gwA.URL(),
			"E2B_SANDBOX_URL="+gwA.URL(),
			"BERTH_GATEWAY_B_URL="+gwB.URL(),
			"E2B_API_KEY="+gatewayKey,
			"E2B_API_KEY_2="+otherKey,
			"E2B_DOMAIN=berth.localhost",
			"NO_COLOR=1",
		)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: node --test failed: %v\n%s", what, err, out)
		}
		t.Logf("%s:\n%s", what, out)
	}
	run("the gateway's own SDK test", "kube-gateway.mjs")
	// The daemon's SDK suite: its data-plane tests, signed URLs included
	// (the gateway checks those), connect, snapshots and fork.
	run("the SDK suite's commands, files, pty, connect, preview hosts, metrics and pausing at the deadline", "--test-name-pattern=^(run: |background handles|sendStdin|commands\\.connect|a background command|write and read|write many|list with depth|as envd|watchDir|pty: |uploadUrl and downloadUrl|signed URLs built|Sandbox\\.connect reaches|getHost reaches|allowPublicTraffic: false requires|lifecycle \\{ onTimeout: pause, autoResume: true \\}|getMetrics reports usage|getMetrics keeps a history|GET /sandboxes/metrics: |sandbox logs: |snapshot: |fork: )",
		"commands.test.mjs", "files.test.mjs", "pty.test.mjs", "sandbox.test.mjs", "host.test.mjs", "pause.test.mjs", "snapshot.test.mjs")
	// The SDK deleted its snapshots; the forks' went with their copies.
	waitNoSnapshots(t, cp, ns)

	// Every pod the SDK runs made was an E2B sandbox of base, run as
	// "user"; each was killed through the SDK.
	pods := cp.Client.CoreV1().Pods(ns)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Annotations[gateway.AnnotationEnvdTokenSHA256] == "" || p.Annotations[node.AnnotationTemplate] != "base" || p.Annotations[node.AnnotationUser] != "user" {
			t.Errorf("pod %s: annotations %v", p.Name, p.Annotations)
		}
		waitPodGone(t, cp, ns, p.Name)
	}

	// Every pod event of the namespace from here on, in order.
	list, events := watchPods(t, cp, ns)
	if len(list.Items) != 0 {
		t.Fatalf("pods left: %d", len(list.Items))
	}

	// Over E2B's REST: refused creates make no pod.
	for _, tc := range []struct {
		body   string
		status int
		field  string
	}{
		{`{"templateID":"no-such-template"}`, 404, "templateID"},
		{`{"templateID":"base","timeout":-1}`, 400, "timeout"},
		{`{"templateID":"base","timeout":"ten"}`, 400, "timeout"},
	} {
		status, body := e2bCall(t, "POST", gwA.URL()+"/sandboxes", gatewayKey, tc.body, nil)
		if status != tc.status || !strings.Contains(body.Message, tc.field) || body.Code != tc.status {
			t.Errorf("create %s = %d %+v, want %d naming %s", tc.body, status, body, tc.status, tc.field)
		}
	}
	// One sandbox to check the data plane's refusals on.
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	status, _ := e2bCall(t, "POST", gwA.URL()+"/sandboxes", gatewayKey, `{"templateID":"base","timeout":120}`, &sb)
	if status != 201 || sb.EnvdAccessToken == "" {
		t.Fatalf("create = %d %+v", status, sb)
	}
	select {
	case ev := <-events.ResultChan():
		if p, ok := ev.Object.(*corev1.Pod); !ok || ev.Type != watch.Added || p.Name != sb.SandboxID {
			t.Fatalf("after the refused creates, the first pod event is %s %v, want %s added", ev.Type, ev.Object, sb.SandboxID)
		}
	case <-ctx.Done():
		t.Fatal("no pod added")
	}
	hdr := func(token string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
	}
	for _, gw := range []string{gwA.URL(), gwB.URL()} {
		if status, _ := e2bCall(t, "GET", gw+"/health", "", "", nil, hdr(sb.EnvdAccessToken)); status != 204 && status != 200 {
			t.Errorf("%s: envd health with the token = %d", gw, status)
		}
		if status, body := e2bCall(t, "GET", gw+"/health", "", "", nil, hdr("wrong")); status != 401 || body.Code != 401 {
			t.Errorf("%s: envd health with a wrong token = %d %+v, want 401", gw, status, body)
		}
		if status, body := e2bCall(t, "GET", gw+"/sandboxes/"+sb.SandboxID, otherKey, "", nil); status != 404 || body.Code != 404 {
			t.Errorf("%s: another key's get = %d %+v, want 404", gw, status, body)
		}
		if status, body := e2bCall(t, "DELETE", gw+"/sandboxes/"+sb.SandboxID, otherKey, "", nil); status != 404 || body.Code != 404 {
			t.Errorf("%s: another key's kill = %d %+v, want 404", gw, status, body)
		}
	}
	if status, _ := e2bCall(t, "DELETE", gwB.URL()+"/sandboxes/"+sb.SandboxID, gatewayKey, "", nil); status != 204 {
		t.Fatalf("kill = %d", status)
	}
	waitPodGone(t, cp, ns, sb.SandboxID)

	// E2B's template builds through the gateway: each runs on one node,
	// its uploads through the gateway, and is ready once both nodes have
	// it; sandboxes of it and of its tags run on either node. (No image
	// is pulled here: BERTH_TEST_IMAGE only names one for a build that
	// is refused before it pulls.)
	extraEnv = []string{"E2B_ADMIN_API_KEY=" + adminKey, "BERTH_TEST_IMAGE=registry.invalid/unused:1"}
	run("the SDK suite's template builds, through the gateway",
		"--test-name-pattern=^(a template from E2B's base image|steps that need the internet|template builds need an admin key)", "template.test.mjs")
	cm, err := cp.Client.CoreV1().ConfigMaps(ns).Get(ctx, gateway.TemplatesConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) < 2 {
		t.Errorf("the cluster's templates after the builds: %v, want the build's and its default tag's", cm.Data)
	}
	for name := range cm.Data {
		for nd := range c.nodes {
			waitNode(t, cp, nd, func(n *corev1.Node) bool {
				return slices.Contains(strings.Split(n.Annotations[node.AnnotationTemplates], ","), name)
			})
		}
	}
}

// adminKey is an admin key of the E2B test's gateways (template builds).
const adminKey = "e2b_abcdefabcdefabcdefabcdefabcdefabcdefabcd"

// e2bSuite finds node and test/e2b with the SDK installed, and skips
// without the base template's debootstrap result (as test/e2e's e2bNode).
func e2bSuite(t *testing.T) (nodeBin, dir string) {
	t.Helper()
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the E2B SDK test needs Node.js 20 or later")
	}
	dir = filepath.Join(repoRoot(t), "test", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		t.Fatalf("the e2b npm package is not installed: run `npm ci` in %s (scripts/test.sh does)", dir)
	}
	if os.Getenv("BERTH_TEST_BASE") != "1" {
		if _, err := os.Stat(harness.CacheDir() + "/debootstrap"); err != nil {
			t.Skip("the E2B SDK test needs the base template (debootstrap's result): set BERTH_TEST_BASE=1 (scripts/test.sh does) to build it")
		}
	}
	return nodeBin, dir
}

// e2bError is E2B's error body.
type e2bError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// e2bCall sends an E2B request with key (if any) and headers h, decoding
// a success into out (if any); it returns the status and an error body.
func e2bCall(t *testing.T, method, url, key, body string, out any, h ...map[string]string) (int, e2bError) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for _, m := range h {
		for k, v := range m {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb e2bError
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(data, &eb); err != nil {
			t.Fatalf("%s %s: %d with no JSON error: %q", method, url, resp.StatusCode, data)
		}
	} else if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v in %q", method, url, err, data)
		}
	}
	return resp.StatusCode, eb
}
