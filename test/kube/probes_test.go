package kube

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/berth-sandbox/berth/test/harness"
)

// TestPodProbes: a pod's startup, readiness and liveness probes run in
// its sandbox. A tcpSocket startup probe holds the others until the
// server listens; an httpGet readiness probe (through the daemon's port
// proxy) makes the pod Ready and not Ready as the server's answer
// changes; a failing exec liveness probe gets the container SIGTERMed
// (exit 143) and started again under its restart policy, Ready again
// once its probes pass. A TCP host port and a UDP one carry traffic to
// the pod's servers.
func TestPodProbes(t *testing.T) {
	c := startCluster(t, "berth-a")
	cp := c.cp
	ctx := t.Context()
	// Long check timeouts: a loaded machine must not fail a check this
	// test expects to pass.
	pod := sandboxPod("probed", "sh", "-c", "rm -f /tmp/die; mkdir -p /tmp/www && echo ok > /tmp/www/healthz && exec httpd -f -p 8080 -h /tmp/www")
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	ctr := &pod.Spec.Containers[0]
	hostPort := harness.FreePort(t)
	ctr.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, HostPort: int32(hostPort)}}
	ctr.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}},
		PeriodSeconds: 1, TimeoutSeconds: 30, FailureThreshold: 120}
	ctr.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
		PeriodSeconds: 1, TimeoutSeconds: 30, FailureThreshold: 1}
	ctr.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "test ! -e /tmp/die"}}},
		PeriodSeconds: 1, TimeoutSeconds: 30, FailureThreshold: 1}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := func(want corev1.ConditionStatus) func(*corev1.Pod) bool {
		return func(p *corev1.Pod) bool {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady {
					return cond.Status == want && p.Status.Phase == corev1.PodRunning
				}
			}
			return false
		}
	}
	p := waitPod(t, cp, "default", "probed", "Ready", ready(corev1.ConditionTrue))
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || !cs[0].Ready || cs[0].Started == nil || !*cs[0].Started || cs[0].RestartCount != 0 {
		t.Errorf("ready container = %+v", cs)
	}

	// kubectl port-forward: the API server streams to the node, whose
	// daemon tunnels to the port in the sandbox.
	if got := portForwardGet(t, cp, "default", "probed", 8080, "/healthz"); !strings.HasPrefix(got, "HTTP/1.") || !strings.Contains(strings.SplitN(got, "\r\n", 2)[0], " 200 ") || !strings.HasSuffix(got, "\r\n\r\nok\n") {
		t.Errorf("GET /healthz through port-forward = %q, want 200 and ok", got)
	}

	// The hostPort: the node serves it on its address and forwards to
	// the container's port.
	hostURL := fmt.Sprintf("http://127.0.0.1:%d/healthz", hostPort)
	resp, err := http.Get(hostURL)
	if err != nil {
		t.Fatalf("GET through the host port: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("GET /healthz through the host port = %d %q, want 200 ok", resp.StatusCode, body)
	}

	if _, stderr, code := execPod(t, cp, "default", "probed", "", "rm", "/tmp/www/healthz"); code != 0 {
		t.Fatalf("rm healthz: %d %s", code, stderr)
	}
	p = waitPod(t, cp, "default", "probed", "not Ready once its server answers 404", ready(corev1.ConditionFalse))
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].Ready || cs[0].State.Running == nil || cs[0].RestartCount != 0 {
		t.Errorf("unready container = %+v, want running, not ready, not restarted", cs)
	}
	if _, stderr, code := execPod(t, cp, "default", "probed", "", "sh", "-c", "echo ok > /tmp/www/healthz"); code != 0 {
		t.Fatalf("write healthz: %d %s", code, stderr)
	}
	waitPod(t, cp, "default", "probed", "Ready again", ready(corev1.ConditionTrue))

	if _, stderr, code := execPod(t, cp, "default", "probed", "", "touch", "/tmp/die"); code != 0 {
		t.Fatalf("touch /tmp/die: %d %s", code, stderr)
	}
	p = waitPod(t, cp, "default", "probed", "restarted after its liveness probe failed", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount == 1 && ready(corev1.ConditionTrue)(p)
	})
	if last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.ExitCode != 143 {
		t.Errorf("the killed run = %+v, want exit 143 (SIGTERM)", last)
	}
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, "probed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "probed")

	// A gRPC readiness probe: the pod is Ready while the health service
	// in the sandbox answers SERVING for the probe's service, not Ready
	// once it answers NOT_SERVING.
	gp := sandboxPod("grpc-probed", "sh", "-c", "while [ ! -x /tmp/grpchealth ]; do sleep 0.1; done; exec /tmp/grpchealth -listen :9000 -down /tmp/down")
	gp.Spec.RestartPolicy = corev1.RestartPolicyAlways
	svc := "agent.v1"
	gp.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9000, Service: &svc}},
		PeriodSeconds: 1, TimeoutSeconds: 30, FailureThreshold: 1}
	gpod, err := cp.Client.CoreV1().Pods("default").Create(ctx, gp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", "grpc-probed", "Running", phase(corev1.PodRunning))
	sbs := podSandboxes(t, c.nodes["berth-a"], string(gpod.UID))
	if len(sbs) != 1 {
		t.Fatalf("sandboxes of grpc-probed: %d", len(sbs))
	}
	f, err := os.Open(grpcHealthBin)
	if err != nil {
		t.Fatal(err)
	}
	err = sbs[0].WriteFile(ctx, "/tmp/grpchealth.part", f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := execPod(t, cp, "default", "grpc-probed", "", "sh", "-c", "chmod 755 /tmp/grpchealth.part && mv /tmp/grpchealth.part /tmp/grpchealth"); code != 0 {
		t.Fatalf("install grpchealth: %d %s", code, stderr)
	}
	waitPod(t, cp, "default", "grpc-probed", "Ready through its gRPC probe", ready(corev1.ConditionTrue))
	if _, stderr, code := execPod(t, cp, "default", "grpc-probed", "", "touch", "/tmp/down"); code != 0 {
		t.Fatalf("touch /tmp/down: %d %s", code, stderr)
	}
	waitPod(t, cp, "default", "grpc-probed", "not Ready once it answers NOT_SERVING", ready(corev1.ConditionFalse))
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, "grpc-probed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "grpc-probed")

	// The host port closed with the pod.
	harness.WaitFor(t, time.Minute, "the host port to close", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort))
		if err == nil {
			c.Close()
		}
		return err != nil
	})

	// A UDP host port: each peer's datagrams reach the container's UDP
	// server and its answers come back to that peer.
	udpPort := harness.FreePort(t)
	up := sandboxPod("udp-echo", "sh", "-c", "exec sleep 100000")
	up.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 5353, HostPort: int32(udpPort), Protocol: corev1.ProtocolUDP}}
	upod, err := cp.Client.CoreV1().Pods("default").Create(ctx, up, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", "udp-echo", "Running", phase(corev1.PodRunning))
	sbs = podSandboxes(t, c.nodes["berth-a"], string(upod.UID))
	if len(sbs) != 1 {
		t.Fatalf("sandboxes of udp-echo: %d", len(sbs))
	}
	harness.StartUDPEcho(t, bin, sbs[0], 5353)
	for i := range 2 {
		conn, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", udpPort))
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("peer %d", i)
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		// A bound for a lost answer, not a timing: the answer is an
		// event on the socket.
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		buf := make([]byte, 256)
		n, err := conn.Read(buf)
		conn.Close()
		if err != nil || string(buf[:n]) != "echo "+msg {
			t.Errorf("through the UDP host port: %q, %v; want %q", buf[:n], err, "echo "+msg)
		}
	}
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, "udp-echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "udp-echo")
}
