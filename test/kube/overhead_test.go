package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/kube/gateway"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/test/harness"
)

// overheadMaxRounds bounds BERTH_KUBE_GATEWAY_BENCH: each round makes and
// destroys two sandboxes, so 200 stay within a few minutes.
const overheadMaxRounds = 200

// route is one way to the same sandbox: through the gateway, through the
// node's data plane with the gateway's certificate, or straight to the
// node's daemon.
type route struct {
	name string
	sb   *client.Sandbox
}

// TestGatewayOverhead measures what the gateway adds to a request, for
// docs/scale.md: on one Berth node and one gateway replica, N rounds
// (BERTH_KUBE_GATEWAY_BENCH, at most 200) of an exec of `echo ok` and a
// read of a 4 KiB file in one sandbox, each round through the gateway
// (Go SDK, API key), through the node's data plane (/berth on its kubelet
// port, the gateway's client certificate: the gateway's own hop left
// out) and straight to the node's daemon over its TCP API (the floor);
// then N sequential creates → ready and deletes → destroyed through the
// gateway and straight on the daemon. The paths alternate within each
// round, so a change in the host's load hits all of them; every result is
// checked (exit code and output, bytes read, state) so a broken path
// cannot measure fast. It reports medians, p99 and means; it asserts no
// times. Opt-in (minutes of real sandboxes): unset, it skips.
func TestGatewayOverhead(t *testing.T) {
	v := os.Getenv("BERTH_KUBE_GATEWAY_BENCH")
	if v == "" {
		t.Skip("set BERTH_KUBE_GATEWAY_BENCH=N (1–200) to measure the gateway's per-request cost over N rounds")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > overheadMaxRounds {
		t.Fatalf("BERTH_KUBE_GATEWAY_BENCH=%q: want 1–%d", v, overheadMaxRounds)
	}
	c := startCluster(t, "berth-a")
	cp, d := c.cp, c.nodes["berth-a"]
	ns := gateway.DefaultNamespace
	keys, cert := gatewaySetup(t, cp, nil)
	gw := startGateway(t, cp, "gateway-a", keys, cert)
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	t.Logf("load before: %s", loadavg(t))

	// The sandbox every data-plane request reaches, and its ID on the node.
	sb, err := gw.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatalf("create through the gateway: %v", err)
	}
	nodeID := nodeSandbox(t, cp, c, ns, sb.ID)
	dataPlane := nodeDataPlane(t, cp, cert)
	paths := []route{
		{"gateway", sb},
		{"node data plane", dataPlane.Sandbox(nodeID)},
		{"daemon (floor)", d.Client.Sandbox(nodeID)},
	}

	content := make([]byte, 4096)
	rand.Read(content)
	if err := sb.WriteFile(ctx, "/tmp/bench.bin", bytes.NewReader(content)); err != nil {
		t.Fatalf("write file through the gateway: %v", err)
	}
	execOK := func(p route) error {
		var out bytes.Buffer
		code, err := p.sb.Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"ok"}, Stdout: &out})
		if err != nil || code != 0 || out.String() != "ok\n" {
			return fmt.Errorf("exec through %s = %d, %v, %q; want 0, ok", p.name, code, err, out.String())
		}
		return nil
	}
	readFile := func(p route) error {
		var got bytes.Buffer
		if err := p.sb.ReadFile(ctx, "/tmp/bench.bin", &got); err != nil || !bytes.Equal(got.Bytes(), content) {
			return fmt.Errorf("read through %s = %d bytes, %v; want the %d written", p.name, got.Len(), err, len(content))
		}
		return nil
	}
	// One untimed call each first: connections and handshakes are made
	// once per client, not per request.
	for _, p := range paths {
		if err := execOK(p); err != nil {
			t.Fatal(err)
		}
		if err := readFile(p); err != nil {
			t.Fatal(err)
		}
	}
	execT := map[string][]time.Duration{}
	readT := map[string][]time.Duration{}
	for i := range n {
		for j := range paths {
			p := paths[(i+j)%len(paths)]
			t0 := time.Now()
			if err := execOK(p); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			execT[p.name] = append(execT[p.name], time.Since(t0))
		}
		for j := range paths {
			p := paths[(i+j)%len(paths)]
			t0 := time.Now()
			if err := readFile(p); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			readT[p.name] = append(readT[p.name], time.Since(t0))
		}
	}
	if err := gw.Kill(ctx, sb.ID); err != nil {
		t.Fatalf("delete through the gateway: %v", err)
	}
	destroyed(t, d, nodeID)
	waitPodGone(t, cp, ns, sb.ID)

	// Create → ready and delete → destroyed, one sandbox at a time: the
	// gateway's (a pod, the scheduler, the node's pod watch, the node's
	// status back) against a create on the daemon.
	createT := map[string][]time.Duration{}
	deleteT := map[string][]time.Duration{}
	viaGateway := func() {
		t0 := time.Now()
		made, err := gw.Create(ctx, client.CreateRequest{})
		if err != nil || made.State != client.StateReady || made.Template != "minimal" {
			t.Fatalf("create through the gateway = %+v, %v", made, err)
		}
		createT["gateway"] = append(createT["gateway"], time.Since(t0))
		id := nodeSandbox(t, cp, c, ns, made.ID)
		t0 = time.Now()
		if err := gw.Kill(ctx, made.ID); err != nil {
			t.Fatalf("delete through the gateway: %v", err)
		}
		destroyed(t, d, id)
		deleteT["gateway"] = append(deleteT["gateway"], time.Since(t0))
		waitPodGone(t, cp, ns, made.ID)
	}
	direct := func() {
		t0 := time.Now()
		made, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal"})
		if err != nil || made.State != client.StateReady {
			t.Fatalf("create on the daemon = %+v, %v", made, err)
		}
		createT["daemon (floor)"] = append(createT["daemon (floor)"], time.Since(t0))
		t0 = time.Now()
		if err := d.Client.Kill(ctx, made.ID); err != nil {
			t.Fatalf("delete on the daemon: %v", err)
		}
		destroyed(t, d, made.ID)
		deleteT["daemon (floor)"] = append(deleteT["daemon (floor)"], time.Since(t0))
	}
	for i := range n {
		if i%2 == 0 {
			viaGateway()
			direct()
		} else {
			direct()
			viaGateway()
		}
	}
	t.Logf("load after: %s", loadavg(t))

	t.Logf("one node, one gateway replica, %d rounds, paths alternating within each round:", n)
	t.Logf("| measurement | path | n | p50 | p99 | mean |")
	t.Logf("|---|---|---|---|---|---|")
	for _, m := range []struct {
		what  string
		times map[string][]time.Duration
		order []string
	}{
		{"exec `echo ok`", execT, []string{"gateway", "node data plane", "daemon (floor)"}},
		{"read 4 KiB file", readT, []string{"gateway", "node data plane", "daemon (floor)"}},
		{"create → ready (minimal)", createT, []string{"gateway", "daemon (floor)"}},
		{"delete → destroyed on the node", deleteT, []string{"gateway", "daemon (floor)"}},
	} {
		for _, p := range m.order {
			ds := m.times[p]
			t.Logf("| %s | %s | %d | %s | %s | %s |", m.what, p, len(ds), ms(harness.Quantile(ds, 50)), ms(harness.Quantile(ds, 99)), ms(mean(ds)))
		}
	}
	harness.AssertNoLeaks(t, d)
}

// nodeSandbox is the node's sandbox of a gateway sandbox's pod.
func nodeSandbox(t *testing.T, cp *controlPlane, c *cluster, ns, name string) string {
	t.Helper()
	p, err := cp.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, ok := c.nodes[p.Spec.NodeName]
	if !ok {
		t.Fatalf("pod %s on %q, not a Berth node", name, p.Spec.NodeName)
	}
	live := podSandboxes(t, d, string(p.UID))
	if len(live) != 1 {
		t.Fatalf("pod %s: node sandboxes %v", name, ids(live))
	}
	return live[0].ID
}

// nodeDataPlane is a client of berth-a's data plane (/berth on its kubelet
// port) with the gateway's client certificate, as the gateway reaches it.
func nodeDataPlane(t *testing.T, cp *controlPlane, cert keyPair) *client.Client {
	t.Helper()
	n := waitNode(t, cp, "berth-a", func(*corev1.Node) bool { return true })
	caPEM, err := os.ReadFile(cp.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	kp, err := tls.LoadX509KeyPair(cert.cert, cert.key)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{kp}}, MaxIdleConnsPerHost: 64}}
	c, err := client.New(fmt.Sprintf("https://127.0.0.1:%d%s", n.Status.DaemonEndpoints.KubeletEndpoint.Port, node.DataPlanePrefix), client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// destroyed follows the node's sandbox until it is destroyed.
func destroyed(t *testing.T, d *harness.Daemon, id string) {
	t.Helper()
	fctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := d.Local.FollowEvents(fctx, id, func(client.Event) error { return nil }); err != nil {
		t.Fatalf("sandbox %s not destroyed: %v", id, err)
	}
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func loadavg(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
