package node

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/berth-sandbox/berth/client"
)

// TestParseProbes: probes take the kubelet's defaults and a named port;
// what a Berth node cannot probe is refused, naming the field.
func TestParseProbes(t *testing.T) {
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "healthz", Port: intstr.FromString("http"),
		HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "1"}}}}, SuccessThreshold: 2}
	c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 5}
	c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/ready"}}}, FailureThreshold: 30}
	grace := int64(7)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	pr := pl.containers[0].probes
	if r := pr.readiness; r == nil || r.httpPath != "/healthz" || r.port != 8080 || r.headers.Get("X-Probe") != "1" || r.success != 2 || r.failure != 3 ||
		r.period != 10*time.Second || r.timeout != time.Second {
		t.Errorf("readiness = %+v", r)
	}
	if l := pr.liveness; l == nil || !l.tcp || l.port != 8080 || l.period != 5*time.Second || l.grace != 7*time.Second {
		t.Errorf("liveness = %+v", l)
	}
	if s := pr.startup; s == nil || strings.Join(s.exec, " ") != "test -e /ready" || s.failure != 30 {
		t.Errorf("startup = %+v", s)
	}

	for _, tc := range []struct {
		field string
		edit  func(c *corev1.Container)
	}{
		{"spec.containers[0].readinessProbe.grpc.port", func(c *corev1.Container) {
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 0}}}
		}},
		{"spec.containers[0].livenessProbe.httpGet.host", func(c *corev1.Container) {
			c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Host: "198.51.100.1", Port: intstr.FromInt32(80)}}}
		}},
		{"spec.containers[0].livenessProbe.httpGet.scheme", func(c *corev1.Container) {
			c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Scheme: corev1.URISchemeHTTPS, Port: intstr.FromInt32(443)}}}
		}},
		{"spec.containers[0].readinessProbe.tcpSocket.port", func(c *corev1.Container) {
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("nope")}}}
		}},
		{"spec.containers[0].livenessProbe.successThreshold", func(c *corev1.Container) {
			c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, SuccessThreshold: 2}
		}},
		{"spec.containers[0].readinessProbe", func(c *corev1.Container) {
			c.ReadinessProbe = &corev1.Probe{}
		}},
		{"spec.containers[0].readinessProbe", func(c *corev1.Container) {
			c.Command, c.Args = nil, nil
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
		}},
	} {
		pod := testPod()
		tc.edit(&pod.Spec.Containers[0])
		_, err := planPod(pod, "node")
		if pe, ok := err.(*planError); !ok || pe.field != tc.field {
			t.Errorf("want a refusal on %s, got %v", tc.field, err)
		}
	}
}

// probeRunner is fakeRunner whose probe commands pass or fail as the test
// sets, and whose container's command ends (143) on the wrapper's
// SIGTERM.
type probeRunner struct {
	*fakeRunner
	ready, live atomic.Bool
	mu          sync.Mutex
	signals     []int
}

func (f *probeRunner) Exec(ctx context.Context, id string, req client.ExecRequest) (int, error) {
	ok := map[string]*atomic.Bool{"ready": &f.ready, "live": &f.live}[req.Cmd]
	if ok == nil {
		return f.fakeRunner.Exec(ctx, id, req)
	}
	if ok.Load() {
		return 0, nil
	}
	return 1, nil
}

func (f *probeRunner) Signal(_ context.Context, _ string, pid uint32, sig int) error {
	f.mu.Lock()
	f.signals = append(f.signals, sig)
	f.mu.Unlock()
	if sig == int(syscall.SIGTERM) {
		f.fakeRunner.mu.Lock()
		cur := f.fakeRunner.pid
		f.fakeRunner.mu.Unlock()
		if pid == cur {
			f.exit(143)
		}
	}
	return nil
}

func (f *probeRunner) PortGet(context.Context, string, int, string, http.Header) (int, error) {
	return 0, io.EOF
}

// TestProbes: a container is Ready once its readiness probe passes and
// not Ready after failureThreshold failures; failed liveness checks
// SIGTERM its command, which restarts under the pod's policy.
func TestProbes(t *testing.T) {
	f := &probeRunner{fakeRunner: newFakeRunner()}
	f.live.Store(true)
	statuses := make(chan *corev1.Pod, 64)
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"ready"}}}, PeriodSeconds: 1, FailureThreshold: 2}
	c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"live"}}}, PeriodSeconds: 1, FailureThreshold: 2}
	p, ps := startFollowed(t, f, pod, func(pod *corev1.Pod) { statuses <- pod })
	// Not ready before its readiness probe passed.
	p.mu.Lock()
	st := p.withStatus(ps).Status
	p.mu.Unlock()
	if len(st.ContainerStatuses) != 1 || st.ContainerStatuses[0].Ready || st.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("before its readiness probe passed: %+v", st.ContainerStatuses)
	}

	await := func(what string, cond func(corev1.PodStatus) bool) {
		t.Helper()
		limit := time.After(time.Minute)
		for {
			select {
			case pod := <-statuses:
				if cond(pod.Status) {
					return
				}
			case <-limit:
				t.Fatalf("no status with %s within a minute", what)
			}
		}
	}
	ready := func(st corev1.PodStatus) bool {
		return len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].Ready && podCondition(&corev1.Pod{Status: st}, corev1.PodReady).Status == corev1.ConditionTrue
	}
	f.ready.Store(true)
	await("the container ready", ready)
	f.ready.Store(false)
	await("the container not ready", func(st corev1.PodStatus) bool {
		return len(st.ContainerStatuses) == 1 && !st.ContainerStatuses[0].Ready && podCondition(&corev1.Pod{Status: st}, corev1.PodReady).Status == corev1.ConditionFalse &&
			st.ContainerStatuses[0].State.Running != nil
	})
	f.ready.Store(true)
	f.live.Store(false)
	await("the container restarted after its liveness probe failed", func(st corev1.PodStatus) bool {
		return len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].RestartCount == 1
	})
	f.mu.Lock()
	sigs := f.signals
	f.mu.Unlock()
	if len(sigs) == 0 || sigs[0] != int(syscall.SIGTERM) {
		t.Errorf("signals sent = %v, want SIGTERM first", sigs)
	}
	if got := f.starts(); len(got) != 2 {
		t.Errorf("runs started %v, want 2", got)
	}
}

// TestNextCheck: checks keep their period; one that ran past the next
// due time does not make the next ones run back to back.
func TestNextCheck(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	if got := nextCheck(t0, time.Second, t0.Add(100*time.Millisecond)); !got.Equal(t0.Add(time.Second)) {
		t.Errorf("on time: next = %v, want t0+1s", got.Sub(t0))
	}
	if got := nextCheck(t0, time.Second, t0.Add(5*time.Second)); !got.Equal(t0.Add(6 * time.Second)) {
		t.Errorf("after a 5 s check: next = %v, want a period from now (t0+6s)", got.Sub(t0))
	}
}
