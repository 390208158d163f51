package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/agentlink"
)

// Container probes, as the kubelet runs them. A container's startup probe
// runs from its start until it first succeeds; its liveness and readiness
// probes run once it has started (at once without a startup probe). A
// readiness result sets the container's Ready, and the pod is Ready when
// every container is; failureThreshold failures of a startup or liveness
// probe in a row kill the container (SIGTERM to its command, SIGKILL after
// the grace period), which then restarts as its pod's restart policy says.
//
// Each check runs in the sandbox, through its daemon: exec runs the
// command (exit 0 passes); httpGet asks the sandbox's port through the
// daemon's port proxy (a status from 200 to 399 passes); tcpSocket passes
// while something in the sandbox listens on the port, read from the
// sandbox's own /proc/net/tcp and tcp6 (the sandbox's network is its own:
// the host does not connect into it); grpc calls the standard health
// service (grpc.health.v1.Health/Check, with the probe's service name)
// over a port tunnel of the daemon, and passes on SERVING. httpGet to
// another host or over HTTPS, and probes of a container with no command
// of its own are refused when the pod is planned.

// probeKind names a probe as the pod spec does.
type probeKind string

const (
	probeStartup   probeKind = "startupProbe"
	probeLiveness  probeKind = "livenessProbe"
	probeReadiness probeKind = "readinessProbe"
)

// probe is one container probe, checked and with the kubelet's defaults.
type probe struct {
	kind probeKind
	// One of: exec's argv, an HTTP GET of path on port, a TCP port.
	exec     []string
	httpPath string
	headers  http.Header
	port     int
	tcp      bool
	// grpc: a gRPC health check of port, for service grpcService.
	grpc        bool
	grpcService string

	delay, period, timeout time.Duration
	success, failure       int
	// grace is how long a killed container gets between SIGTERM and
	// SIGKILL.
	grace time.Duration
}

// containerProbes are a container's probes (nil: none).
type containerProbes struct {
	startup, liveness, readiness *probe
}

func (cp containerProbes) any() bool {
	return cp.startup != nil || cp.liveness != nil || cp.readiness != nil
}

// defaultGrace is the pod's terminationGracePeriodSeconds when it sets
// none, as the API server defaults it.
const defaultGrace = 30 * time.Second

// podGrace is the pod's terminationGracePeriodSeconds.
func podGrace(spec corev1.PodSpec) time.Duration {
	if g := spec.TerminationGracePeriodSeconds; g != nil && *g >= 0 {
		return time.Duration(*g) * time.Second
	}
	return defaultGrace
}

// parseProbes checks a container's probes (field is the container's path
// in the pod spec).
func parseProbes(field string, c corev1.Container, spec corev1.PodSpec, hasCommand bool) (containerProbes, error) {
	grace := podGrace(spec)
	var out containerProbes
	for _, k := range []struct {
		kind probeKind
		p    *corev1.Probe
		to   **probe
	}{{probeStartup, c.StartupProbe, &out.startup}, {probeLiveness, c.LivenessProbe, &out.liveness}, {probeReadiness, c.ReadinessProbe, &out.readiness}} {
		if k.p == nil {
			continue
		}
		pf := field + "." + string(k.kind)
		if !hasCommand {
			return out, &planError{pf, "probes need the container's own process (set command): a container without one runs as long as its sandbox"}
		}
		pr, err := parseProbe(pf, k.kind, k.p, c, grace)
		if err != nil {
			return out, err
		}
		*k.to = pr
	}
	return out, nil
}

func parseProbe(field string, kind probeKind, p *corev1.Probe, c corev1.Container, grace time.Duration) (*probe, error) {
	pr := &probe{kind: kind, delay: time.Duration(p.InitialDelaySeconds) * time.Second,
		period: 10 * time.Second, timeout: time.Second, success: 1, failure: 3, grace: grace}
	if p.PeriodSeconds > 0 {
		pr.period = time.Duration(p.PeriodSeconds) * time.Second
	}
	if p.TimeoutSeconds > 0 {
		pr.timeout = time.Duration(p.TimeoutSeconds) * time.Second
	}
	if p.SuccessThreshold > 0 {
		pr.success = int(p.SuccessThreshold)
	}
	if p.FailureThreshold > 0 {
		pr.failure = int(p.FailureThreshold)
	}
	if p.TerminationGracePeriodSeconds != nil && *p.TerminationGracePeriodSeconds >= 0 {
		pr.grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
	}
	if kind != probeReadiness && pr.success != 1 {
		return nil, &planError{field + ".successThreshold", "must be 1 for a startup or liveness probe"}
	}
	h := p.ProbeHandler
	n := 0
	for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, &planError{field, "want exactly one of exec, httpGet, tcpSocket, grpc"}
	}
	switch {
	case h.Exec != nil:
		if len(h.Exec.Command) == 0 {
			return nil, &planError{field + ".exec.command", "is empty"}
		}
		pr.exec = h.Exec.Command
	case h.HTTPGet != nil:
		g := h.HTTPGet
		if g.Host != "" {
			return nil, &planError{field + ".httpGet.host", "probes reach the sandbox only; leave host unset"}
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			return nil, &planError{field + ".httpGet.scheme", fmt.Sprintf("%s is not served: the port proxy speaks HTTP", g.Scheme)}
		}
		port, err := probePort(field+".httpGet.port", g.Port, c)
		if err != nil {
			return nil, err
		}
		pr.port, pr.httpPath = port, g.Path
		if !strings.HasPrefix(pr.httpPath, "/") {
			pr.httpPath = "/" + pr.httpPath
		}
		pr.headers = http.Header{}
		for _, hd := range g.HTTPHeaders {
			pr.headers.Add(hd.Name, hd.Value)
		}
	case h.TCPSocket != nil:
		if h.TCPSocket.Host != "" {
			return nil, &planError{field + ".tcpSocket.host", "probes reach the sandbox only; leave host unset"}
		}
		port, err := probePort(field+".tcpSocket.port", h.TCPSocket.Port, c)
		if err != nil {
			return nil, err
		}
		pr.port, pr.tcp = port, true
	default:
		g := h.GRPC
		if g.Port < 1 || g.Port > 65535 {
			return nil, &planError{field + ".grpc.port", fmt.Sprintf("%d is not a port", g.Port)}
		}
		pr.port, pr.grpc = int(g.Port), true
		if g.Service != nil {
			pr.grpcService = *g.Service
		}
	}
	return pr, nil
}

// probePort resolves a probe's port: a number, or the name of one of the
// container's ports.
func probePort(field string, v intstr.IntOrString, c corev1.Container) (int, error) {
	port := v.IntValue()
	if v.Type == intstr.String {
		port = 0
		for _, cp := range c.Ports {
			if cp.Name == v.StrVal {
				port = int(cp.ContainerPort)
			}
		}
		if port == 0 {
			return 0, &planError{field, fmt.Sprintf("no container port is named %q", v.StrVal)}
		}
	}
	if port < 1 || port > 65535 {
		return 0, &planError{field, fmt.Sprintf("%d is not a port", port)}
	}
	return port, nil
}

// maxProcNet bounds the /proc/net/tcp table read from a sandbox.
const maxProcNet = 8 << 20

// check runs the probe once in sandbox id: nil when it passes.
func (p *Pods) check(ctx context.Context, id string, pr *probe) error {
	ctx, cancel := context.WithTimeout(ctx, pr.timeout)
	defer cancel()
	switch {
	case len(pr.exec) > 0:
		code, err := p.sb.Exec(ctx, id, client.ExecRequest{Cmd: pr.exec[0], Args: pr.exec[1:], Stdout: io.Discard, Stderr: io.Discard})
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("exit %d", code)
		}
		return nil
	case pr.tcp:
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			var b bytes.Buffer
			if err := p.sb.ReadFile(ctx, id, f, &limitWriter{w: &b, n: maxProcNet}); err != nil {
				continue // no IPv6 in the sandbox
			}
			if agentlink.ListensOn(b.Bytes(), pr.port) {
				return nil
			}
		}
		return fmt.Errorf("nothing listens on port %d", pr.port)
	case pr.grpc:
		return p.grpcCheck(ctx, id, pr.port, pr.grpcService)
	default:
		code, err := p.sb.PortGet(ctx, id, pr.port, pr.httpPath, pr.headers)
		if err != nil {
			return err
		}
		if code < 200 || code >= 400 {
			return fmt.Errorf("HTTP %d", code)
		}
		return nil
	}
}

// nextCheck is when a probe checks next after the check due at at: a
// period later, or, when a slow check ran past that, a period from now
// (checks that fell behind are skipped, as the kubelet does, not run back
// to back).
func nextCheck(at time.Time, period time.Duration, now time.Time) time.Time {
	next := at.Add(period)
	if next.Before(now) {
		return now.Add(period)
	}
	return next
}

// killSignal, sent to a container's wrapper (berth-agent podlog), makes
// it SIGKILL the container's command.
const killSignal = syscall.SIGUSR1

// probeRun runs a container's probes for its run pid until ctx ends (the
// run ended, or the pod): startup first, then liveness and readiness.
func (p *Pods) probeRun(ctx context.Context, ps *podState, c containerPlan, pid uint32) {
	pr := c.probes
	if !pr.any() {
		return
	}
	p.mu.Lock()
	id := ps.sandboxID
	started := time.Now()
	if cs := ps.containers[c.name]; cs != nil {
		started = cs.startedAt
		// A run followed again (after a pause or a node restart) is
		// probed afresh.
		cs.unstarted, cs.unready = pr.startup != nil, pr.readiness != nil
	}
	p.mu.Unlock()
	podKey := key(ps.pod.Namespace, ps.pod.Name)
	// wait sleeps until t or the end of ctx (false).
	wait := func(t time.Time) bool { return sleepCtx(ctx, time.Until(t)) }
	kill := func(why string) {
		p.log.Info("container_probe_kill", "pod", podKey, "container", c.name, "why", why)
		p.killContainer(ctx, ps, id, pid, c)
	}
	if s := pr.startup; s != nil {
		fails := 0
		for at := started.Add(s.delay); ; at = nextCheck(at, s.period, time.Now()) {
			if !wait(at) {
				return
			}
			if err := p.check(ctx, id, s); err == nil {
				break
			} else if ctx.Err() != nil {
				return
			} else if fails++; fails >= s.failure {
				kill(fmt.Sprintf("startup probe failed %d times: %v", fails, err))
				return
			}
		}
		p.setContainer(ps, c.name, func(cs *containerState) { cs.unstarted = false })
		p.changed(ps)
	}
	since := time.Now()
	if pr.startup == nil {
		since = started
	}
	done := make(chan struct{})
	if l := pr.liveness; l != nil {
		go func() {
			defer close(done)
			fails := 0
			for at := since.Add(l.delay); ; at = nextCheck(at, l.period, time.Now()) {
				if !wait(at) {
					return
				}
				err := p.check(ctx, id, l)
				switch {
				case ctx.Err() != nil:
					return
				case err == nil:
					fails = 0
					continue
				}
				if fails++; fails >= l.failure {
					kill(fmt.Sprintf("liveness probe failed %d times: %v", fails, err))
					return
				}
			}
		}()
	} else {
		close(done)
	}
	if r := pr.readiness; r != nil {
		ok, fails, ready := 0, 0, false
		for at := since.Add(r.delay); ; at = nextCheck(at, r.period, time.Now()) {
			if !wait(at) {
				break
			}
			err := p.check(ctx, id, r)
			if ctx.Err() != nil {
				break
			}
			if err == nil {
				ok, fails = ok+1, 0
			} else {
				ok, fails = 0, fails+1
			}
			switch {
			case !ready && ok >= r.success:
				ready = true
			case ready && fails >= r.failure:
				ready = false
				p.log.Info("container_not_ready", "pod", podKey, "container", c.name, "why", err)
			default:
				continue
			}
			p.setContainer(ps, c.name, func(cs *containerState) { cs.unready = !ready })
			p.changed(ps)
		}
	}
	<-done
}

// killContainer ends a container's run as the kubelet does after a
// failed probe: SIGTERM to its command, SIGKILL once the probe's grace
// has passed.
func (p *Pods) killContainer(ctx context.Context, ps *podState, id string, pid uint32, c containerPlan) {
	grace := podGrace(ps.pod.Spec)
	for _, pr := range []*probe{c.probes.liveness, c.probes.startup} {
		if pr != nil {
			grace = pr.grace
		}
	}
	p.terminate(ctx, ps, id, pid, c.name, grace)
}

// terminate ends a container's run pid: SIGTERM to its command, SIGKILL
// once grace has passed (both through its wrapper, which passes them on
// and records the exit). ctx ends when the run does.
func (p *Pods) terminate(ctx context.Context, ps *podState, id string, pid uint32, name string, grace time.Duration) {
	if err := p.sb.Signal(ctx, id, pid, int(syscall.SIGTERM)); err != nil {
		if ctx.Err() == nil {
			p.log.Warn("container_kill_failed", "pod", key(ps.pod.Namespace, ps.pod.Name), "container", name, "err", err)
		}
		return
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-ctx.Done(): // the run ended
		return
	case <-t.C:
	}
	if err := p.sb.Signal(ctx, id, pid, int(killSignal)); err != nil && ctx.Err() == nil {
		p.log.Warn("container_kill_failed", "pod", key(ps.pod.Namespace, ps.pod.Name), "container", name, "err", err)
	}
}
