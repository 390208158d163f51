package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/test/harness"
)

// TestPlanHostPorts: a container port with a hostPort is served by the
// node; what it cannot serve is refused naming the field.
func TestPlanHostPorts(t *testing.T) {
	pod := testPod()
	pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 18080}, {ContainerPort: 9090}, {ContainerPort: 53, HostPort: 5353, HostIP: "127.0.0.2", Protocol: corev1.ProtocolTCP},
		{ContainerPort: 53, HostPort: 5353, HostIP: "127.0.0.2", Protocol: corev1.ProtocolUDP}}
	p, err := planPod(pod, "n")
	if err != nil {
		t.Fatal(err)
	}
	want := []hostPort{{field: "spec.containers[0].ports[0]", addr: ":18080", target: 8080}, {field: "spec.containers[0].ports[2]", addr: "127.0.0.2:5353", target: 53},
		{field: "spec.containers[0].ports[3]", addr: "127.0.0.2:5353", target: 53, udp: true}}
	if !slices.Equal(p.hostPorts, want) {
		t.Errorf("host ports = %+v, want %+v", p.hostPorts, want)
	}
	for _, tc := range []struct {
		name  string
		ports []corev1.ContainerPort
		field string
	}{
		{"sctp", []corev1.ContainerPort{{ContainerPort: 53, HostPort: 53, Protocol: corev1.ProtocolSCTP}}, "spec.containers[0].ports[0].protocol"},
		{"udp twice", []corev1.ContainerPort{{ContainerPort: 53, HostPort: 53, Protocol: corev1.ProtocolUDP}, {ContainerPort: 54, HostPort: 53, Protocol: corev1.ProtocolUDP}}, "spec.containers[0].ports[1].hostPort"},
		{"twice", []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 81, HostPort: 8080}}, "spec.containers[0].ports[1].hostPort"},
		{"host ip", []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080, HostIP: "node"}}, "spec.containers[0].ports[0].hostIP"},
		{"range", []corev1.ContainerPort{{ContainerPort: 80, HostPort: 70000}}, "spec.containers[0].ports[0].hostPort"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod()
			pod.Spec.Containers[0].Ports = tc.ports
			_, err := planPod(pod, "n")
			var pe *planError
			if !errors.As(err, &pe) || pe.field != tc.field {
				t.Errorf("planPod = %v, want a plan error on %s", err, tc.field)
			}
		})
	}
}

// dialRunner is a sandbox whose ports are one local echo server.
type dialRunner struct {
	Sandboxes
	addr  string
	mu    sync.Mutex
	asked []int
}

// ForwardUDP answers each datagram on pc with "echo " and it, as a
// sandbox's echo server reached through tunnels would, until ctx ends.
func (d *dialRunner) ForwardUDP(ctx context.Context, _ string, pc net.PacketConn, port int) error {
	d.mu.Lock()
	d.asked = append(d.asked, port)
	d.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = pc.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 1<<16)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		_, _ = pc.WriteTo(append([]byte("echo "), buf[:n]...), addr)
	}
}

func (d *dialRunner) DialPort(ctx context.Context, _ string, port int) (io.ReadWriteCloser, error) {
	d.mu.Lock()
	d.asked = append(d.asked, port)
	d.mu.Unlock()
	var dl net.Dialer
	return dl.DialContext(ctx, "tcp", d.addr)
}

// TestServeHostPorts: the node's host port carries a connection to the
// container's port both ways, half-close included, and closes with the
// pod.
func TestServeHostPorts(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	d := &dialRunner{addr: echo.Addr().String()}
	p := &Pods{ctx: t.Context(), ip: "127.0.0.1", sb: d, log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	ctx, cancel := context.WithCancel(t.Context())
	port := strconv.Itoa(harness.FreePort(t))
	ps := &podState{pod: testPod(), ctx: ctx, cancel: cancel, sandboxID: "sb",
		plan: plan{hostPorts: []hostPort{{field: "spec.containers[0].ports[0]", addr: ":" + port, target: 8080}}}}
	if err := p.serveHostPorts(ps); err != nil {
		t.Fatal(err)
	}
	// The port is taken now: a second pod asking for it fails naming it.
	ps2 := &podState{pod: testPod(), ctx: ctx, sandboxID: "sb2", plan: ps.plan}
	if err := p.serveHostPorts(ps2); err == nil {
		t.Error("a second listener on the same host port started")
	}
	conn, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("through the host port")); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || string(got) != "through the host port" {
		t.Errorf("echo = %q, %v", got, err)
	}
	d.mu.Lock()
	if len(d.asked) != 1 || d.asked[0] != 8080 {
		t.Errorf("ports dialled in the sandbox = %v, want [8080]", d.asked)
	}
	d.mu.Unlock()
	cancel()
	p.Wait()
	if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
		c.Close()
		t.Error("the host port still takes connections after the pod ended")
	}
}

// TestServeUDPHostPort: a UDP host port is a UDP socket on the node whose
// datagrams the sandbox's daemon forwards to the container's port (here
// a fake that echoes), answered to their peer; it closes with the pod.
func TestServeUDPHostPort(t *testing.T) {
	d := &dialRunner{}
	p := &Pods{ctx: t.Context(), ip: "127.0.0.1", sb: d, log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	ctx, cancel := context.WithCancel(t.Context())
	port := strconv.Itoa(harness.FreePort(t))
	ps := &podState{pod: testPod(), ctx: ctx, cancel: cancel, sandboxID: "sb",
		plan: plan{hostPorts: []hostPort{{field: "spec.containers[0].ports[0]", addr: ":" + port, target: 53, udp: true}}}}
	if err := p.serveHostPorts(ps); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("udp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "echo query" {
		t.Errorf("answer = %q, %v", buf[:n], err)
	}
	d.mu.Lock()
	if len(d.asked) != 1 || d.asked[0] != 53 {
		t.Errorf("ports forwarded to = %v, want [53]", d.asked)
	}
	d.mu.Unlock()
	cancel()
	p.Wait()
	// Closed with the pod: the port is free again.
	pc, err := net.ListenPacket("udp", "127.0.0.1:"+port)
	if err != nil {
		t.Errorf("the host port is still held after the pod ended: %v", err)
	} else {
		pc.Close()
	}
}
