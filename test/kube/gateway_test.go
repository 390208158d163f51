package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/gateway"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/test/harness"
)

// gatewayKey is the API key the test's gateways accept.
const gatewayKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// opsKey is an admin key of the gateway tests.
const opsKey = "e2b_0123456789abcdef0123456789abcdef0123aaaa"

// startGateway runs `berth serve --kubernetes` on cp as a replica named
// name, with the API keys file keys, a client certificate the nodes' CA
// signed and extra flags, and returns a client of it with gatewayKey.
func startGateway(t *testing.T, cp *controlPlane, name, keys string, cert keyPair, extra ...string) *client.Client {
	t.Helper()
	c, _ := startGatewayProc(t, cp, name, keys, cert, extra...)
	return c
}

// startGatewayProc is startGateway, also returning a function that stops
// the replica (SIGTERM) before the test ends.
func startGatewayProc(t *testing.T, cp *controlPlane, name, keys string, cert keyPair, extra ...string) (*client.Client, func()) {
	t.Helper()
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	stop := start(t, name, bin.Berth, append([]string{"serve", "--kubernetes", "--kubeconfig", cp.Kubeconfig, "--listen", listen,
		"--node-client-cert", cert.cert, "--node-client-key", cert.key, "--node-ca", cp.CA,
		"--api-keys", keys, "--default-template", "minimal",
		// E2B's SDKs ask for the internet on every create: none here, so
		// nothing leaves the machine.
		"--e2b-default-network", "none"}, extra...)...)
	c, err := client.New("http://"+listen, client.WithAPIKey(gatewayKey))
	if err != nil {
		t.Fatal(err)
	}
	// The gateway answers once its caches are filled.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	t0 := time.NewTicker(20 * time.Millisecond)
	defer t0.Stop()
	for {
		if _, err := c.Health(ctx); err == nil {
			return c, stop
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gateway %s did not answer on %s", name, listen)
		case <-t0.C:
		}
	}
}

// testKey is an extra API key of a test's gateways: its secret, its
// quota as a YAML flow mapping ("" for none), and whether it is an admin
// key.
type testKey struct {
	secret, quota string
	admin         bool
}

// gatewaySetup makes the gateway's namespace, an --api-keys file with
// gatewayKey (id "tester") and the extra keys (by id), and a client
// certificate the nodes' CA signed, as an operator would for its replicas.
func gatewaySetup(t *testing.T, cp *controlPlane, extra map[string]testKey) (keys string, cert keyPair) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gateway.DefaultNamespace}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	var b strings.Builder
	b.WriteString("keys:\n  - id: tester\n    name: test\n    sha256: " + auth.HashKey(gatewayKey) + "\n")
	for _, id := range slices.Sorted(maps.Keys(extra)) {
		b.WriteString("  - id: " + id + "\n    sha256: " + auth.HashKey(extra[id].secret) + "\n")
		if q := extra[id].quota; q != "" {
			b.WriteString("    quota: " + q + "\n")
		}
		if extra[id].admin {
			b.WriteString("    admin: true\n")
		}
	}
	keys = filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(keys, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return keys, cp.pki.issue(t, "gateway", "berth-gateway", nil, false)
}

// watchPods lists the namespace's pods and watches every change to them
// from that list on, in order, until the test ends.
func watchPods(t *testing.T, cp *controlPlane, ns string) (*corev1.PodList, watch.Interface) {
	t.Helper()
	pods := cp.Client.CoreV1().Pods(ns)
	list, err := pods.List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := pods.Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return list, w
}

// TestGateway: two gateway replicas serve one cluster of two Berth nodes.
// Sandboxes made through one are pods (placed by the real scheduler); the
// other lists, gets and deletes them from its own cache; exec and files
// reach the sandboxes through either, over the nodes' kubelet port with
// mutual TLS; bad input makes no pod; deleting leaves nothing behind.
func TestGateway(t *testing.T) {
	c := startCluster(t, "berth-a", "berth-b")
	cp := c.cp
	ctx := t.Context()
	ns := gateway.DefaultNamespace
	keys, cert := gatewaySetup(t, cp, map[string]testKey{"other": {secret: otherKey}})
	gwA := startGateway(t, cp, "gateway-a", keys, cert)
	gwB := startGateway(t, cp, "gateway-b", keys, cert)
	gwOther, err := client.New(gwA.URL(), client.WithAPIKey(otherKey))
	if err != nil {
		t.Fatal(err)
	}

	// Every pod event of the namespace from here on, in order.
	pods := cp.Client.CoreV1().Pods(ns)
	_, events := watchPods(t, cp, ns)
	nextAdded := func() *corev1.Pod {
		t.Helper()
		for {
			select {
			case ev, ok := <-events.ResultChan():
				if !ok {
					t.Fatal("pod watch ended")
				}
				if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Added {
					return p
				}
			case <-ctx.Done():
				t.Fatal("no pod added")
			}
		}
	}

	// Two sandboxes through replica A, each a pod on a Berth node.
	var made []*client.Sandbox
	for i := range 2 {
		sb, err := gwA.Create(ctx, client.CreateRequest{CPU: 0.25, Memory: "128M", Env: map[string]string{"GREETING": "hello from the gateway"},
			Labels: map[string]string{"run": "gw"}, Timeout: "10m"})
		if err != nil {
			t.Fatalf("create %d through gateway A: %v", i, err)
		}
		if sb.State != client.StateReady || sb.Template != "minimal" || sb.CPU != 0.25 || sb.MemoryBytes != 128<<20 {
			t.Errorf("created = %+v", sb.Sandbox)
		}
		if p := nextAdded(); p.Name != sb.ID {
			t.Fatalf("pod added %s, want %s", p.Name, sb.ID)
		}
		made = append(made, sb)
	}
	// Where each runs: its pod's node, and the node's sandbox.
	type placed struct{ node, sandbox string }
	where := map[string]placed{}
	for _, sb := range made {
		p, err := pods.Get(ctx, sb.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d, ok := c.nodes[p.Spec.NodeName]
		if !ok || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod %s on %q, %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
		live := podSandboxes(t, d, string(p.UID))
		if len(live) != 1 || live[0].CPU != 0.25 || live[0].MemoryBytes != 128<<20 || live[0].Env["GREETING"] != "hello from the gateway" {
			t.Fatalf("pod %s: node sandboxes %+v", p.Name, live)
		}
		where[sb.ID] = placed{p.Spec.NodeName, live[0].ID}
	}

	// Exec through A: stdout, the sandbox's env, exit codes.
	sb := made[0]
	var out, errOut bytes.Buffer
	code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", `echo "$GREETING" $((6*7)); echo oops >&2; exit 7`}, Stdout: &out, Stderr: &errOut})
	if err != nil || code != 7 || out.String() != "hello from the gateway 42\n" || errOut.String() != "oops\n" {
		t.Errorf("exec = %d, %v, stdout %q, stderr %q", code, err, out.String(), errOut.String())
	}
	// Stdin streams in while the output streams out.
	out.Reset()
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "cat", Stdin: strings.NewReader("piped through\n"), Stdout: &out}); err != nil || code != 0 || out.String() != "piped through\n" {
		t.Errorf("exec cat = %d, %v, %q", code, err, out.String())
	}
	// A get through B carries the node's measure of its usage.
	if got, err := gwB.Get(ctx, sb.ID); err != nil || got.Usage == nil || got.Usage.MemoryBytes <= 0 || got.Usage.CPUSeconds <= 0 {
		t.Errorf("get through B = %+v, %v; want the node's usage", got, err)
	}
	// A file written through A reads back through B.
	content := strings.Repeat("berth gateway\n", 4096)
	if err := sb.WriteFile(ctx, "/tmp/through-gateway.txt", strings.NewReader(content)); err != nil {
		t.Fatalf("write file through A: %v", err)
	}
	var read bytes.Buffer
	if err := gwB.Sandbox(sb.ID).ReadFile(ctx, "/tmp/through-gateway.txt", &read); err != nil || read.String() != content {
		t.Errorf("read through B = %d bytes, %v; want %d", read.Len(), err, len(content))
	}
	if code, err := gwB.Sandbox(made[1].ID).Exec(ctx, client.ExecRequest{Cmd: "test", Args: []string{"!", "-e", "/tmp/through-gateway.txt"}}); err != nil || code != 0 {
		t.Errorf("the other sandbox has the file, or exec failed: %d, %v", code, err)
	}
	// A server in the sandbox answers through B's ports route (gateway,
	// node, daemon); a port nothing serves is 502; another key gets 404.
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "mkdir -p /tmp/www && echo served in the pod > /tmp/www/hello.txt && busybox httpd -p 8080 -h /tmp/www"}}); err != nil || code != 0 {
		t.Fatalf("start httpd: %d, %v", code, err)
	}
	portGet := func(key, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", gwB.URL()+"/v1/sandboxes/"+sb.ID+"/ports/"+path, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := portGet(gatewayKey, "8080/hello.txt"); code != 200 || body != "served in the pod\n" {
		t.Errorf("port 8080 through B = %d %q", code, body)
	}
	if code, body := portGet(gatewayKey, "8081/"); code != 502 {
		t.Errorf("a port nothing serves = %d %q, want 502", code, body)
	}
	if code, body := portGet(otherKey, "8080/hello.txt"); code != 404 {
		t.Errorf("another key's port = %d %q, want 404", code, body)
	}
	// A TCP connection to a port through B's tunnel (gateway, node,
	// daemon: three upgrades carried through), half-close included: the
	// server answers once its input ended.
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "printf '#!/bin/sh\\ntr a-z A-Z\\necho end-of-input\\n' > /tmp/srv.sh && chmod +x /tmp/srv.sh && (busybox nc -ll -p 9000 -e /tmp/srv.sh </dev/null >/dev/null 2>&1 &)"}}); err != nil || code != 0 {
		t.Fatalf("start nc: %d, %v", code, err)
	}
	harness.WaitFor(t, time.Minute, "nc to listen in the sandbox", func() bool {
		var out bytes.Buffer
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "netstat", Args: []string{"-ltn"}, Stdout: &out})
		return err == nil && code == 0 && strings.Contains(out.String(), ":9000 ")
	})
	if tc, err := gwB.Sandbox(sb.ID).DialPort(ctx, 9000); err != nil {
		t.Errorf("tunnel through B: %v", err)
	} else {
		go func() {
			_, _ = tc.Write([]byte("through the gateway"))
			_ = tc.CloseWrite()
		}()
		got, err := io.ReadAll(tc)
		tc.Close()
		if err != nil || string(got) != "THROUGH THE GATEWAYend-of-input\n" {
			t.Errorf("tunnel through B = %q, %v", got, err)
		}
	}
	if _, err := gwB.Sandbox(sb.ID).DialPort(ctx, 9001); errdefs.Code(err) != errdefs.CodeUnavailable {
		t.Errorf("a tunnel to a port nothing serves = %v, want unavailable", err)
	}
	if other, err := client.New(gwB.URL(), client.WithAPIKey(otherKey)); err != nil {
		t.Fatal(err)
	} else if _, err := other.Sandbox(sb.ID).DialPort(ctx, 9000); errdefs.Code(err) != errdefs.CodeNotFound {
		t.Errorf("another key's tunnel = %v, want not_found", err)
	}

	// What the node's daemon recorded of the sandbox reads through B: its
	// events, the work log with the command A ran, its egress policy
	// (none: the gateway's default). Records name the gateway's ID of
	// the sandbox, never the node's.
	nodeID := where[sb.ID].sandbox
	evs, err := gwB.Events(ctx, sb.ID)
	created := slices.ContainsFunc(evs, func(e client.Event) bool { return e.Type == "created" && e.SandboxID == sb.ID })
	if err != nil || !created || slices.ContainsFunc(evs, func(e client.Event) bool { return e.SandboxID == nodeID }) {
		t.Errorf("events through B = %+v, %v; want %s's created event, none naming the node's %s", evs, err, sb.ID, nodeID)
	}
	wl, err := gwB.Worklog(ctx, sb.ID)
	ran := slices.ContainsFunc(wl, func(e client.WorklogEntry) bool { return e.Cmd == "cat" && e.Sandbox == sb.ID })
	if err != nil || !ran {
		t.Errorf("work log through B = %+v, %v; want the cat A ran, naming %s", wl, err, sb.ID)
	}
	if pol, err := gwB.NetworkPolicy(ctx, sb.ID); err != nil || pol.Mode != "none" {
		t.Errorf("network policy through B = %+v, %v; want mode none", pol, err)
	}
	if _, err := gwB.NetworkLog(ctx, sb.ID, false); err != nil {
		t.Errorf("network log through B: %v", err)
	}
	// A policy set through A is the node daemon's, read through B; a bad
	// entry is named and changes nothing.
	if pol, err := gwA.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: "allow", Allow: []string{"PyPI.org", "198.51.100.0/24"}}); err != nil || pol.Mode != "allow" {
		t.Errorf("set network policy through A = %+v, %v", pol, err)
	}
	wantAllow := []string{"pypi.org", "198.51.100.0/24"}
	if pol, err := gwB.NetworkPolicy(ctx, sb.ID); err != nil || pol.Mode != "allow" || !slices.Equal(pol.Allow, wantAllow) {
		t.Errorf("network policy through B after the set = %+v, %v; want allow %v", pol, err, wantAllow)
	}
	var bad *errdefs.Error
	if _, err := gwA.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: "allow", Allow: []string{"not a host"}}); !errors.As(err, &bad) || bad.Code != errdefs.CodeInvalidArgument || bad.Field != "allow[0]" {
		t.Errorf("set a bad policy = %v, want invalid_argument naming allow[0]", err)
	}
	if pol, err := gwB.NetworkPolicy(ctx, sb.ID); err != nil || !slices.Equal(pol.Allow, wantAllow) {
		t.Errorf("network policy after a refused set = %+v, %v", pol, err)
	}
	if _, err := gwOther.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: "open"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's policy set = %v, want not found", err)
	}
	// Another key sees none of it.
	if _, err := gwOther.Worklog(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's work log read = %v, want not found", err)
	}

	// B lists and gets what A made: its state is the cluster's, once B's
	// cache caught up with A's (it trails by its watch's latency).
	var listed []*client.Sandbox
	harness.WaitFor(t, 30*time.Second, "gateway B to list A's sandboxes ready", func() bool {
		listed, err = gwB.List(ctx, client.ListOptions{Labels: map[string]string{"run": "gw"}})
		return err == nil && len(listed) == 2 && !slices.ContainsFunc(listed, func(l *client.Sandbox) bool { return l.State != client.StateReady })
	})
	var listedIDs []string
	for _, l := range listed {
		listedIDs = append(listedIDs, l.ID)
		if l.State != client.StateReady {
			t.Errorf("listed %s is %s", l.ID, l.State)
		}
	}
	slices.Sort(listedIDs)
	want := []string{made[0].ID, made[1].ID}
	slices.Sort(want)
	if !slices.Equal(listedIDs, want) {
		t.Errorf("B lists %v, want %v", listedIDs, want)
	}
	if got, err := gwB.Get(ctx, made[1].ID); err != nil || got.State != client.StateReady || got.Labels["run"] != "gw" {
		t.Errorf("get through B = %+v, %v", got, err)
	}

	// Bad input names its field and makes no pod: the next pod added is
	// the good create's after them.
	for _, tc := range []struct {
		req   client.CreateRequest
		class error
		field string
	}{
		{client.CreateRequest{Isolation: "vm"}, errdefs.ErrInvalidArgument, "isolation"},
		{client.CreateRequest{Template: "nosuchtemplate"}, errdefs.ErrNotFound, "template"},
		{client.CreateRequest{Memory: "lots"}, errdefs.ErrInvalidArgument, "memory"},
	} {
		_, err := gwB.Create(ctx, tc.req)
		var e *errdefs.Error
		if !errors.Is(err, tc.class) || !errors.As(err, &e) || e.Field != tc.field {
			t.Errorf("create %+v = %v, want %v on field %s", tc.req, err, tc.class, tc.field)
		}
	}
	third, err := gwB.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatalf("create through B: %v", err)
	}
	if p := nextAdded(); p.Name != third.ID {
		t.Errorf("pod added %s after the refused creates, want %s: a refused create made a pod", p.Name, third.ID)
	}
	p3, err := pods.Get(ctx, third.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sbs := podSandboxes(t, c.nodes[p3.Spec.NodeName], string(p3.UID)); len(sbs) != 1 {
		t.Fatalf("third pod: node sandboxes %v", ids(sbs))
	} else {
		where[third.ID] = placed{p3.Spec.NodeName, sbs[0].ID}
	}
	made = append(made, third)

	// Pause through B: the node's daemon pauses the sandbox (runc: a
	// filesystem pause), both replicas list it paused, its data plane is
	// refused; a resume through A brings it back with its files and the
	// time it had left.
	if err := third.WriteFile(ctx, "/tmp/kept.txt", strings.NewReader("kept across the pause\n")); err != nil {
		t.Fatalf("write before the pause: %v", err)
	}
	before, err := gwA.Get(ctx, third.ID)
	if err != nil {
		t.Fatal(err)
	}
	paused, err := gwB.Pause(ctx, third.ID)
	if err != nil || paused.State != client.StatePaused || paused.Pause != "filesystem" {
		t.Fatalf("pause through B = %+v, %v", paused, err)
	}
	w3 := where[third.ID]
	if got, err := c.nodes[w3.node].Local.Get(ctx, w3.sandbox); err != nil || got.State != client.StatePaused {
		t.Errorf("node sandbox after the pause = %+v, %v; want paused", got, err)
	}
	// A's cache may trail B's by its watch's latency (docs/kubernetes.md).
	harness.WaitFor(t, 30*time.Second, "gateway A to list the sandbox paused", func() bool {
		l, err := gwA.List(ctx, client.ListOptions{State: client.StatePaused})
		return err == nil && len(l) == 1 && l[0].ID == third.ID
	})
	if pod, err := pods.Get(ctx, third.ID, metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodRunning ||
		pod.Status.ContainerStatuses[0].State.Waiting == nil || pod.Status.ContainerStatuses[0].State.Waiting.Reason != node.ReasonPaused {
		t.Errorf("paused pod = %+v, %v; want Running with its container waiting (%s)", pod.Status, err, node.ReasonPaused)
	}
	if _, err := gwA.Sandbox(third.ID).Exec(ctx, client.ExecRequest{Cmd: "true"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec in a paused sandbox = %v, want failed precondition", err)
	}
	// What its node recorded still reads while it is paused.
	if evs, err := gwA.Events(ctx, third.ID); err != nil || !slices.ContainsFunc(evs, func(e client.Event) bool { return e.Type == "paused" && e.SandboxID == third.ID }) {
		t.Errorf("events of the paused sandbox = %+v, %v; want its paused event", evs, err)
	}
	resumed, err := gwA.Resume(ctx, third.ID, 0)
	if err != nil || resumed.State != client.StateReady {
		t.Fatalf("resume through A = %+v, %v", resumed, err)
	}
	// The deadline kept what was left (the pause took at most minutes).
	if left, had := time.Until(resumed.Deadline), time.Until(before.Deadline); left < had-time.Second || left > had+3*time.Minute {
		t.Errorf("resumed with %v left, had %v before the pause", left, had)
	}
	read.Reset()
	if err := gwB.Sandbox(third.ID).ReadFile(ctx, "/tmp/kept.txt", &read); err != nil || read.String() != "kept across the pause\n" {
		t.Errorf("file after the resume = %q, %v", read.String(), err)
	}
	if got, err := c.nodes[w3.node].Local.Get(ctx, w3.sandbox); err != nil || got.State != client.StateReady {
		t.Errorf("node sandbox after the resume = %+v, %v; want ready", got, err)
	}
	// auto_resume: a paused sandbox's next exec resumes it and runs.
	auto, err := gwB.Create(ctx, client.CreateRequest{AutoResume: true})
	if err != nil || !auto.AutoResume {
		t.Fatalf("create with auto_resume = %+v, %v", auto, err)
	}
	// track records a sandbox made here: the next pod added is its, and
	// where it runs once it does.
	track := func(sb *client.Sandbox) {
		t.Helper()
		made = append(made, sb)
		if p := nextAdded(); p.Name != sb.ID {
			t.Fatalf("pod added %s, want %s", p.Name, sb.ID)
		}
	}
	place := func(p *corev1.Pod) *client.Sandbox {
		t.Helper()
		sbs := podSandboxes(t, c.nodes[p.Spec.NodeName], string(p.UID))
		if len(sbs) != 1 {
			t.Fatalf("pod %s: node sandboxes %v", p.Name, ids(sbs))
		}
		where[p.Name] = placed{p.Spec.NodeName, sbs[0].ID}
		return sbs[0]
	}
	track(auto)
	pa, err := pods.Get(ctx, auto.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	place(pa)
	if _, err := gwB.Pause(ctx, auto.ID); err != nil {
		t.Fatalf("pause the auto_resume sandbox: %v", err)
	}
	out.Reset()
	if code, err := gwA.Sandbox(auto.ID).Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"woke"}, Stdout: &out}); err != nil || code != 0 || out.String() != "woke\n" {
		t.Errorf("exec in a paused auto_resume sandbox = %d, %v, %q", code, err, out.String())
	}
	// Resumed through A: B's cache shows it once it caught up.
	harness.WaitFor(t, 30*time.Second, "gateway B to show the auto_resume sandbox ready", func() bool {
		got, err := gwB.Get(ctx, auto.ID)
		return err == nil && got.State == client.StateReady
	})
	if _, err := gwOther.Pause(ctx, auto.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's pause = %v, want not found", err)
	}
	// on_timeout pause: its node's daemon pauses it at the deadline; a
	// timeout cannot be set then (it would resume it), a resume can, and
	// gives it the gateway's default timeout.
	atDeadline, err := gwA.Create(ctx, client.CreateRequest{OnTimeout: client.OnTimeoutPause, Timeout: "3s"})
	if err != nil || atDeadline.OnTimeout != client.OnTimeoutPause {
		t.Fatalf("create with on_timeout pause = %+v, %v", atDeadline, err)
	}
	track(atDeadline)
	pd := waitPod(t, cp, ns, atDeadline.ID, "paused at its deadline", func(p *corev1.Pod) bool {
		st, _ := node.Paused(p)
		return st == "paused"
	})
	if st := place(pd).State; st != client.StatePaused {
		t.Errorf("node sandbox at the deadline is %s, want paused", st)
	}
	if pd.Status.Phase != corev1.PodRunning {
		t.Errorf("pod paused at its deadline is %s, want Running", pd.Status.Phase)
	}
	if _, err := gwA.SetTimeout(ctx, atDeadline.ID, time.Minute); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("timeout of a sandbox paused at its deadline = %v, want failed precondition", err)
	}
	woke, err := gwB.Resume(ctx, atDeadline.ID, 0)
	if err != nil || woke.State != client.StateReady || time.Until(woke.Deadline) < time.Minute {
		t.Errorf("resume of a sandbox paused at its deadline = %+v, %v; want ready with the default timeout", woke, err)
	}
	out.Reset()
	if code, err := gwA.Sandbox(atDeadline.ID).Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"back"}, Stdout: &out}); err != nil || code != 0 || out.String() != "back\n" {
		t.Errorf("exec after the resume = %d, %v, %q", code, err, out.String())
	}
	// idle_pause: its node's daemon pauses it once idle; with
	// auto_resume the next exec resumes it, with the time it had left.
	idle, err := gwB.Create(ctx, client.CreateRequest{IdlePause: "2s", AutoResume: true, Timeout: "10m"})
	if err != nil || idle.IdlePause != "2s" {
		t.Fatalf("create with idle_pause = %+v, %v", idle, err)
	}
	track(idle)
	pi := waitPod(t, cp, ns, idle.ID, "paused once idle", func(p *corev1.Pod) bool {
		_, ok := node.PausedByDaemon(p)
		return ok
	})
	place(pi)
	out.Reset()
	if code, err := gwA.Sandbox(idle.ID).Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"awake"}, Stdout: &out}); err != nil || code != 0 || out.String() != "awake\n" {
		t.Errorf("exec in an idle-paused auto_resume sandbox = %d, %v, %q", code, err, out.String())
	}
	// (Idle again for 2 s, it may be paused again by the time of the get.)
	if got, err := gwA.Get(ctx, idle.ID); err != nil || got.State != client.StateReady && got.State != client.StatePaused || time.Until(got.Deadline) < 9*time.Minute {
		t.Errorf("idle sandbox after the exec = %+v, %v; want most of its 10m left", got, err)
	}

	// Snapshots through A: taken by the sandbox's node and recorded in
	// the cluster, so B lists it; a sandbox made from it through B runs
	// on that node with the snapshot's files; a fork makes copies there;
	// another key sees none of it.
	snap, err := gwA.Snapshot(ctx, sb.ID, "with-file")
	if err != nil || snap.Source != sb.ID || snap.Kind != client.SnapshotFilesystem || snap.Labels["run"] != "gw" {
		t.Fatalf("snapshot through A = %+v, %v", snap, err)
	}
	if l, err := gwB.Snapshots(ctx); err != nil || !slices.ContainsFunc(l, func(s client.Snapshot) bool { return s.ID == snap.ID }) {
		t.Errorf("snapshots through B = %+v, %v; want %s", l, err, snap.ID)
	}
	if _, err := gwOther.GetSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's get of the snapshot = %v, want not found", err)
	}
	if _, err := gwOther.Create(ctx, client.CreateRequest{Snapshot: snap.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's create from the snapshot = %v, want not found", err)
	}
	hasFile := func(id string) {
		t.Helper()
		var got bytes.Buffer
		if err := gwA.Sandbox(id).ReadFile(ctx, "/tmp/through-gateway.txt", &got); err != nil || got.String() != content {
			t.Errorf("the snapshot's file in %s: %d bytes, %v; want %d", id, got.Len(), err, len(content))
		}
	}
	onSnapshotNode := func(id string) {
		t.Helper()
		p, err := pods.Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != where[sb.ID].node || p.Annotations[node.AnnotationSnapshot] == "" {
			t.Errorf("sandbox %s from a snapshot runs on %s with %v; want on %s", id, p.Spec.NodeName, p.Annotations, where[sb.ID].node)
		}
		place(p)
	}
	// Its export, streamed from its node, is an archive a daemon imports.
	var archive bytes.Buffer
	if err := gwB.ExportSnapshot(ctx, snap.ID, &archive); err != nil {
		t.Fatalf("export through B: %v", err)
	}
	exported := bytes.Clone(archive.Bytes())
	daemonB := c.nodes["berth-b"].Local
	imported, err := daemonB.ImportSnapshot(ctx, &archive)
	if err != nil || imported.Template != "minimal" || imported.Kind != client.SnapshotFilesystem {
		t.Errorf("import of the gateway's export on a daemon = %+v, %v", imported, err)
	} else if err := daemonB.RemoveSnapshot(ctx, imported.ID); err != nil {
		t.Errorf("remove the imported snapshot: %v", err)
	}
	// Moved to the other node: its export imported through the gateway
	// naming that node; a sandbox from the copy runs there, with the file.
	otherNode := "berth-a"
	if where[sb.ID].node == otherNode {
		otherNode = "berth-b"
	}
	moved, err := gwA.ImportSnapshotWith(ctx, bytes.NewReader(exported), client.ImportOptions{Node: otherNode, Labels: map[string]string{"moved": "yes"}})
	// The archive is the node daemon's: the sandbox's API labels are the
	// cluster's record's, so the import has only those it was given.
	if err != nil || moved.ID == snap.ID || len(moved.Labels) != 1 || moved.Labels["moved"] != "yes" {
		t.Fatalf("import through A to %s = %+v, %v", otherNode, moved, err)
	}
	fromMoved, err := gwB.Create(ctx, client.CreateRequest{Snapshot: moved.ID})
	if err != nil {
		t.Fatalf("create from the moved snapshot: %v", err)
	}
	if p := nextAdded(); p.Name != fromMoved.ID {
		t.Fatalf("pod added %s, want %s", p.Name, fromMoved.ID)
	}
	if p, err := pods.Get(ctx, fromMoved.ID, metav1.GetOptions{}); err != nil || p.Spec.NodeName != otherNode {
		t.Errorf("sandbox from the moved snapshot runs on %v (%v), want %s", p.Spec.NodeName, err, otherNode)
	} else {
		place(p)
	}
	var got bytes.Buffer
	if err := gwA.Sandbox(fromMoved.ID).ReadFile(ctx, "/tmp/through-gateway.txt", &got); err != nil || got.String() != content {
		t.Errorf("the file in the sandbox from the moved snapshot: %d bytes, %v", got.Len(), err)
	}
	// Deleting the sandbox and then its snapshot right away works: the
	// node destroys a deleted pod's sandbox before it removes a snapshot.
	if err := gwA.Kill(ctx, fromMoved.ID); err != nil {
		t.Fatal(err)
	}
	if err := gwB.RemoveSnapshot(ctx, moved.ID); err != nil {
		t.Errorf("remove the moved snapshot after its sandbox's delete: %v", err)
	}
	waitPodGone(t, cp, ns, fromMoved.ID)
	if err := gwOther.ExportSnapshot(ctx, snap.ID, io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's export = %v, want not found", err)
	}
	// Each copy's pod is the next added.
	added := func(id string) {
		t.Helper()
		if p := nextAdded(); p.Name != id {
			t.Fatalf("pod added %s, want %s", p.Name, id)
		}
	}
	fromSnap, err := gwB.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Labels: map[string]string{"from": "snapshot"}})
	if err != nil {
		t.Fatalf("create from the snapshot through B: %v", err)
	}
	added(fromSnap.ID)
	onSnapshotNode(fromSnap.ID)
	hasFile(fromSnap.ID)
	fork, err := gwA.Fork(ctx, sb.ID, 2)
	if err != nil || len(fork.Sandboxes) != 2 || !fork.Snapshot.Fork {
		t.Fatalf("fork through A = %+v, %v", fork, err)
	}
	for _, cs := range fork.Sandboxes {
		added(cs.ID)
		onSnapshotNode(cs.ID)
		hasFile(cs.ID)
	}
	// A snapshot a sandbox sits on stays; once they are gone, it goes
	// from its node and from the cluster.
	if err := gwB.RemoveSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("remove a snapshot a sandbox sits on = %v, want failed precondition", err)
	}
	if _, err := gwB.GetSnapshot(ctx, snap.ID); err != nil {
		t.Errorf("the refused remove lost the snapshot: %v", err)
	}
	for _, id := range []string{fromSnap.ID, fork.Sandboxes[0].ID, fork.Sandboxes[1].ID} {
		if err := gwA.Kill(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		waitPodGone(t, cp, ns, id)
		// Its node's sandbox has ended once its events end.
		w := where[id]
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := c.nodes[w.node].Local.FollowEvents(fctx, w.sandbox, func(client.Event) error { return nil })
		cancel()
		if err != nil {
			t.Fatalf("sandbox %s (%s on %s) after delete: %v", id, w.sandbox, w.node, err)
		}
	}
	if err := gwB.RemoveSnapshot(ctx, snap.ID); err != nil {
		t.Errorf("remove snapshot %s once nothing sits on it: %v", snap.ID, err)
	}
	// The fork's snapshot went with its copies: the leader removed it.
	waitNoSnapshots(t, cp, ns)
	for _, id := range []string{snap.ID, fork.Snapshot.ID} {
		if _, err := c.nodes[where[sb.ID].node].Local.GetSnapshot(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("snapshot %s on its node after the remove: %v, want not found", id, err)
		}
	}
	if l, err := gwA.Snapshots(ctx); err != nil || len(l) != 0 {
		t.Errorf("snapshots after the removes = %+v, %v", l, err)
	}

	// The node's data plane: only clients with a certificate its CA
	// signed, only for its pods' sandboxes (not another sandbox of its
	// daemon's).
	nodeA := waitNode(t, cp, "berth-a", func(*corev1.Node) bool { return true })
	nodeURL := fmt.Sprintf("https://127.0.0.1:%d%s/v1/sandboxes/", nodeA.Status.DaemonEndpoints.KubeletEndpoint.Port, node.DataPlanePrefix)
	if tpls := nodeA.Annotations[node.AnnotationTemplates]; !slices.Contains(strings.Split(tpls, ","), "minimal") {
		t.Errorf("node templates annotation = %q", tpls)
	}
	other := c.nodes["berth-a"].Create(t, client.CreateRequest{})
	caPEM, err := os.ReadFile(cp.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	gwCert, err := tls.LoadX509KeyPair(cert.cert, cert.key)
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{gwCert}}}}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	if resp, err := noCert.Get(nodeURL + other.ID + "/agent/health"); err == nil {
		resp.Body.Close()
		t.Errorf("node data plane without a client certificate = %d, want a refused handshake", resp.StatusCode)
	}
	resp, err := withCert.Get(nodeURL + other.ID + "/agent/files?path=/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("node data plane for a sandbox of no pod = %d, want 404", resp.StatusCode)
	}
	if err := c.nodes["berth-a"].Local.Kill(ctx, other.ID); err != nil {
		t.Fatal(err)
	}

	// Delete through B: the pods leave the API, the nodes destroy their
	// sandboxes, and the data plane of a deleted sandbox is not found.
	for _, sb := range made {
		if err := gwB.Kill(ctx, sb.ID); err != nil {
			t.Errorf("delete %s through B: %v", sb.ID, err)
		}
	}
	for _, sb := range made {
		waitPodGone(t, cp, ns, sb.ID)
		w := where[sb.ID]
		d := c.nodes[w.node]
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := d.Local.FollowEvents(fctx, w.sandbox, func(client.Event) error { return nil })
		cancel()
		if err != nil {
			t.Errorf("sandbox %s (%s on %s) after delete: %v", sb.ID, w.sandbox, w.node, err)
		}
		if got, err := d.Local.Get(ctx, w.sandbox); err == nil && got.State != client.StateStopped {
			t.Errorf("node sandbox %s after delete is %s", w.sandbox, got.State)
		}
	}
	// A's cache follows the API server's watch: it sees the deletes
	// B made.
	harness.WaitFor(t, 30*time.Second, "gateway A to see the deletes", func() bool {
		l, err := gwA.List(ctx, client.ListOptions{})
		return err == nil && len(l) == 0
	})
	if _, err := gwA.Get(ctx, made[0].ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get of a deleted sandbox through A = %v, want not found", err)
	}
	if _, err := made[0].Exec(ctx, client.ExecRequest{Cmd: "true"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("exec in a deleted sandbox = %v, want not found", err)
	}
	for _, d := range c.nodes {
		harness.AssertNoLeaks(t, d)
	}
}

// TestGatewayTemplates: templates through the gateway on two real nodes:
// the list merges the nodes' daemons', a build and a Dockerfile build run
// on both (an admin key's only), a sandbox of the Dockerfile's template
// runs with its files, and the template is removed from both.
func TestGatewayTemplates(t *testing.T) {
	c := startCluster(t, "berth-a", "berth-b")
	ctx := t.Context()
	keys, cert := gatewaySetup(t, c.cp, map[string]testKey{"ops": {secret: opsKey, admin: true}})
	gw := startGateway(t, c.cp, "gateway-a", keys, cert)
	ops, err := client.New(gw.URL(), client.WithAPIKey(opsKey))
	if err != nil {
		t.Fatal(err)
	}
	tpls, err := gw.Templates(ctx)
	if err != nil {
		t.Fatalf("templates through the gateway: %v", err)
	}
	var minimal *client.Template
	for i := range tpls {
		if tpls[i].Name == "minimal" {
			minimal = &tpls[i]
		}
	}
	if minimal == nil || !minimal.Built || !slices.Equal(minimal.Nodes, []string{"berth-a", "berth-b"}) {
		t.Errorf("templates through the gateway = %+v, want minimal built on berth-a and berth-b", tpls)
	}

	if _, err := gw.BuildTemplate(ctx, "minimal", io.Discard); errdefs.Code(err) != errdefs.CodePermissionDenied {
		t.Errorf("template build by a plain key: %v, want permission_denied", err)
	}
	var buildLog bytes.Buffer
	built, err := ops.BuildTemplate(ctx, "minimal", &buildLog)
	if err != nil {
		t.Fatalf("template build through the gateway: %v\n%s", err, buildLog.String())
	}
	if !built.Built || !slices.Equal(built.Nodes, []string{"berth-a", "berth-b"}) || !strings.Contains(buildLog.String(), "[berth-a] ") || !strings.Contains(buildLog.String(), "[berth-b] ") {
		t.Errorf("template build = %+v, log:\n%s\nwant minimal built on berth-a and berth-b, each node's log named", built, buildLog.String())
	}

	// A warm pool of one on each node, set through the gateway: a pod's
	// create claims from its node's pool.
	ns := gateway.DefaultNamespace
	pool, err := ops.SetTemplateWarm(ctx, "minimal", 1)
	if err != nil || pool.Target != 2 {
		t.Fatalf("warm pool through the gateway = %+v, %v; want a target of 2 (1 on each node)", pool, err)
	}
	// The pools fill in the background: wait until the nodes' daemons
	// report both ready, bounded.
	harness.WaitFor(t, 2*time.Minute, "each node's warm pool of minimal to be ready (2 in the gateway's sum)", func() bool {
		tpls, err := gw.Templates(ctx)
		i := slices.IndexFunc(tpls, func(t client.Template) bool { return t.Name == "minimal" })
		return err == nil && i >= 0 && tpls[i].Warm != nil && tpls[i].Warm.Ready == 2
	})
	// Each node offers one pod fewer while its pool holds a sandbox: the
	// scheduler counts the pool.
	podsLeft := func(n *corev1.Node) int64 {
		return n.Status.Capacity.Pods().Value() - n.Status.Allocatable.Pods().Value()
	}
	for name := range c.nodes {
		waitNode(t, c.cp, name, func(n *corev1.Node) bool { return podsLeft(n) == 1 })
	}
	warmSb, err := gw.Create(ctx, client.CreateRequest{CPU: 0.25, Memory: "128M", Timeout: "5m"})
	if err != nil {
		t.Fatalf("create with warm pools: %v", err)
	}
	warmPod, err := c.cp.Client.CoreV1().Pods(ns).Get(ctx, warmSb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	warmNode := c.nodes[warmPod.Spec.NodeName]
	sbs := podSandboxes(t, warmNode, string(warmPod.UID))
	if len(sbs) != 1 {
		t.Fatalf("pod %s: node sandboxes %+v", warmPod.Name, sbs)
	}
	evs, err := warmNode.Local.Events(ctx, sbs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e client.Event) bool { return e.Type == "created" && strings.HasSuffix(e.Message, ", warm") }) {
		t.Errorf("the pod's sandbox was not claimed from its node's pool: events %+v", evs)
	}
	if err := gw.Kill(ctx, warmSb.ID); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, c.cp, ns, warmSb.ID)
	if pool, err := ops.SetTemplateWarm(ctx, "minimal", 0); err != nil || pool.Target != 0 {
		t.Errorf("drop the warm pools = %+v, %v", pool, err)
	}
	for name := range c.nodes {
		waitNode(t, c.cp, name, func(n *corev1.Node) bool { return podsLeft(n) == 0 })
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM berth:minimal\nCOPY hello.txt /hello.txt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("built through the gateway\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	buildLog.Reset()
	df, err := ops.BuildDockerfile(ctx, "gwdf", client.DockerfileBuild{ContextDir: dir}, &buildLog)
	if err != nil {
		t.Fatalf("Dockerfile build through the gateway: %v\n%s", err, buildLog.String())
	}
	if !df.Built || !slices.Equal(df.Nodes, []string{"berth-a", "berth-b"}) {
		t.Errorf("Dockerfile build = %+v, want built on berth-a and berth-b", df)
	}
	// Sandboxes of it run with its files, wherever the scheduler puts
	// them.
	for i := range 2 {
		sb, err := gw.Create(ctx, client.CreateRequest{Template: "gwdf", CPU: 0.25, Memory: "128M", Timeout: "5m"})
		if err != nil {
			t.Fatalf("create %d of the Dockerfile's template: %v", i, err)
		}
		var out bytes.Buffer
		if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "cat", Args: []string{"/hello.txt"}, Stdout: &out}); err != nil || code != 0 || out.String() != "built through the gateway\n" {
			t.Errorf("cat /hello.txt in sandbox %d = %d %v %q", i, code, err, out.String())
		}
		pod, err := c.cp.Client.CoreV1().Pods(ns).Get(ctx, sb.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d := c.nodes[pod.Spec.NodeName]
		sbs := podSandboxes(t, d, string(pod.UID))
		if len(sbs) != 1 {
			t.Fatalf("pod %s: node sandboxes %+v", pod.Name, sbs)
		}
		if err := gw.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		// The template is the daemon's to remove once no sandbox of it
		// stands: its node's sandbox has ended once its events end.
		waitPodGone(t, c.cp, ns, sb.ID)
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = d.Local.FollowEvents(fctx, sbs[0].ID, func(client.Event) error { return nil })
		cancel()
		if err != nil {
			t.Fatalf("sandbox %s after delete: %v", sbs[0].ID, err)
		}
	}
	syncedTemplates(t, c, gw, ops, "gwdf", "built through the gateway\n")
}

// syncedTemplates: template name, made through the gateway on both nodes
// (whose /hello.txt holds hello), is the cluster's. A node that loses it
// gets it back from the other, the same bits; a node left with a build
// older than the cluster's last rebuild gets the new one in its place;
// it exports and imports through the gateway; a delete one node refuses
// (a sandbox uses it there) is finished by the leader once that sandbox
// is gone.
func syncedTemplates(t *testing.T, c *cluster, gw, ops *client.Client, name, hello string) {
	ctx := t.Context()
	a, b := c.nodes["berth-a"], c.nodes["berth-b"]
	hasTemplate := func(d *harness.Daemon, name string) (client.Template, bool) {
		ts, err := d.Local.Templates(ctx)
		i := slices.IndexFunc(ts, func(tp client.Template) bool { return tp.Name == name && tp.Built })
		if err != nil || i < 0 {
			return client.Template{}, false
		}
		return ts[i], true
	}
	helloIn := func(d *harness.Daemon, template string) string {
		sb, err := d.Local.Create(ctx, client.CreateRequest{Template: template, Timeout: "5m"})
		if err != nil {
			t.Fatalf("create of %s on its node: %v", template, err)
		}
		defer d.Local.Kill(ctx, sb.ID)
		var out bytes.Buffer
		if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "cat", Args: []string{"/hello.txt"}, Stdout: &out}); err != nil || code != 0 {
			t.Errorf("cat /hello.txt in %s: %d %v", template, code, err)
		}
		return out.String()
	}

	// A node that lost it (removed on its daemon, behind the gateway's
	// back) gets it back from the other node.
	want, ok := hasTemplate(a, name)
	if !ok {
		t.Fatalf("berth-a has no built %s", name)
	}
	if err := b.Local.RemoveTemplate(ctx, name); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 3*time.Minute, "the leader to copy "+name+" back to berth-b", func() bool {
		_, ok := hasTemplate(b, name)
		return ok
	})
	got, _ := hasTemplate(b, name)
	if got.Source != want.Source || got.SizeBytes != want.SizeBytes || !got.BuiltAt.Equal(want.BuiltAt) || got.Layers != want.Layers || got.BuildID == "" || got.BuildID != want.BuildID {
		t.Errorf("copied template = %+v\nsource's        = %+v", got, want)
	}
	if out := helloIn(b, name); out != hello {
		t.Errorf("/hello.txt from the copied template = %q, want %q", out, hello)
	}

	// A rebuild through the gateway, then berth-b put back to the build
	// before it (as a node that was not Ready during the rebuild would
	// have): the leader replaces it with berth-a's, the rebuild's bits.
	var old bytes.Buffer
	if err := b.Local.ExportTemplate(ctx, name, &old); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hello = "rebuilt through the gateway\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM berth:minimal\nCOPY hello.txt /hello.txt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte(hello), 0o644); err != nil {
		t.Fatal(err)
	}
	var rebuildLog bytes.Buffer
	if _, err := ops.BuildDockerfile(ctx, name, client.DockerfileBuild{ContextDir: dir}, &rebuildLog); err != nil {
		t.Fatalf("rebuild through the gateway: %v\n%s", err, rebuildLog.String())
	}
	rebuilt, ok := hasTemplate(a, name)
	if !ok || !rebuilt.BuiltAt.After(want.BuiltAt) || rebuilt.BuildID == want.BuildID {
		t.Fatalf("berth-a after the rebuild: %+v (%v), want a build after %s", rebuilt, ok, want.BuiltAt)
	}
	if _, err := b.Local.ImportTemplate(ctx, bytes.NewReader(old.Bytes()), name); errdefs.Code(err) != errdefs.CodeAlreadyExists {
		t.Errorf("import over %s on berth-b without replace: %v, want already_exists", name, err)
	}
	if back, err := b.Local.ReplaceTemplate(ctx, bytes.NewReader(old.Bytes()), name); err != nil || !back.BuiltAt.Equal(want.BuiltAt) {
		t.Fatalf("berth-b put back to the old build: %+v, %v", back, err)
	}
	harness.WaitFor(t, 3*time.Minute, "the leader to bring berth-b to the rebuild of "+name, func() bool {
		got, ok := hasTemplate(b, name)
		return ok && got.BuildID == rebuilt.BuildID
	})
	if out := helloIn(b, name); out != hello {
		t.Errorf("/hello.txt on berth-b after the sync = %q, want the rebuild's %q", out, hello)
	}

	// Export and import through the gateway, admin keys only.
	if err := gw.ExportTemplate(ctx, name, io.Discard); errdefs.Code(err) != errdefs.CodePermissionDenied {
		t.Errorf("export by a plain key: %v, want permission_denied", err)
	}
	var archive bytes.Buffer
	if err := ops.ExportTemplate(ctx, name, &archive); err != nil {
		t.Fatalf("export through the gateway: %v", err)
	}
	imported, err := ops.ImportTemplate(ctx, bytes.NewReader(archive.Bytes()), name+"-copy")
	if err != nil || !imported.Built || !slices.Equal(imported.Nodes, []string{"berth-a", "berth-b"}) {
		t.Fatalf("import through the gateway = %+v, %v; want built on both nodes", imported, err)
	}
	if out := helloIn(a, name+"-copy"); out != hello {
		t.Errorf("/hello.txt from the imported template = %q, want %q", out, hello)
	}
	if _, err := ops.ImportTemplate(ctx, bytes.NewReader(archive.Bytes()), name+"-copy"); errdefs.Code(err) != errdefs.CodeAlreadyExists {
		t.Errorf("import over a name both nodes have: %v, want already_exists", err)
	}
	if err := ops.RemoveTemplate(ctx, name+"-copy"); err != nil {
		t.Fatal(err)
	}

	// A delete berth-b refuses (a sandbox of it runs there) is done on
	// berth-a and recorded; once the sandbox is gone the leader removes
	// it from berth-b, and copies it nowhere meanwhile.
	user, err := b.Local.Create(ctx, client.CreateRequest{Template: name, Timeout: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	err = ops.RemoveTemplate(ctx, name)
	if errdefs.Code(err) != errdefs.CodeFailedPrecondition || !strings.Contains(err.Error(), "berth-b") || !strings.Contains(err.Error(), "done on berth-a") {
		t.Errorf("remove while berth-b uses it: %v; want failed_precondition naming berth-b, done on berth-a", err)
	}
	cm, err := c.cp.Client.CoreV1().ConfigMaps(gateway.DefaultNamespace).Get(ctx, gateway.TemplatesConfigMap, metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data[name], `"deleted":true`) {
		t.Errorf("the cluster's record of %s = %v, %v; want deleted", name, cm, err)
	}
	if _, ok := hasTemplate(a, name); ok {
		t.Errorf("berth-a still has %s after the delete", name)
	}
	if err := b.Local.Kill(ctx, user.ID); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 3*time.Minute, "the leader to remove "+name+" from berth-b", func() bool {
		_, ok := hasTemplate(b, name)
		return !ok
	})
	if _, ok := hasTemplate(a, name); ok {
		t.Errorf("%s came back on berth-a", name)
	}
	if err := ops.RemoveTemplate(ctx, name); errdefs.Code(err) != errdefs.CodeNotFound {
		t.Errorf("remove again: %v, want not_found", err)
	}
}
