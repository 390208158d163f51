package node

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
)

// TestGRPCProbe: a grpc probe is planned with its port and service and
// passes while the health service answers SERVING for that service, over
// the sandbox's port tunnel; NOT_SERVING, an unknown service and nothing
// listening fail it.
func TestGRPCProbe(t *testing.T) {
	pod := testPod()
	svc := "agent.v1"
	pod.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9000, Service: &svc}}}
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	pr := pl.containers[0].probes.readiness
	if pr == nil || !pr.grpc || pr.port != 9000 || pr.grpcService != "agent.v1" {
		t.Fatalf("readiness = %+v", pr)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	defer srv.Stop()
	d := &dialRunner{addr: ln.Addr().String()}
	p := &Pods{ctx: t.Context(), sb: d, log: slog.New(slog.DiscardHandler)}

	hs.SetServingStatus("agent.v1", healthpb.HealthCheckResponse_SERVING)
	if err := p.check(t.Context(), "sb", pr); err != nil {
		t.Errorf("SERVING: %v", err)
	}
	hs.SetServingStatus("agent.v1", healthpb.HealthCheckResponse_NOT_SERVING)
	if err := p.check(t.Context(), "sb", pr); err == nil || !strings.Contains(err.Error(), "NOT_SERVING") {
		t.Errorf("NOT_SERVING: %v, want a failure saying so", err)
	}
	other := *pr
	other.grpcService = "unknown.v1"
	if err := p.check(t.Context(), "sb", &other); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
	d.mu.Lock()
	if len(d.asked) != 3 || d.asked[0] != 9000 {
		t.Errorf("ports dialled = %v, want 9000 for each check", d.asked)
	}
	d.mu.Unlock()

	srv.Stop()
	short := *pr
	short.timeout = 2 * time.Second
	if err := p.check(t.Context(), "sb", &short); err == nil {
		t.Error("a check passed with nothing listening")
	}
}
