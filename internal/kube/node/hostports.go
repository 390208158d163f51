package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/internal/splice"
)

// A container port with a hostPort is served on the node: the node
// listens on hostIP:hostPort (hostIP unset: the node's address) and joins
// each connection to the container's port through a port tunnel of the
// sandbox's daemon, as a kubelet's port mapping forwards the host's port
// to the pod. A UDP port is a UDP socket on the node whose every peer
// gets a UDP tunnel of its own to the container's port (closed after 2
// minutes without a datagram, as a NAT's UDP mapping), so the container
// tells peers apart and answers each. SCTP is not served. The scheduler
// keeps two pods from asking one node for the same hostPort and
// protocol. The listener opens once the sandbox is made (and again after
// the node restarted) and closes with the pod.

// hostPort is one port the node serves for a pod.
type hostPort struct {
	// field names the port in the pod's spec, for errors.
	field  string
	addr   string // host:port, host empty for the node's address
	target int
	udp    bool
}

// planHostPorts reads container c's ports (field names it) that ask for a
// hostPort.
func planHostPorts(field string, c corev1.Container) ([]hostPort, error) {
	var out []hostPort
	for j, pt := range c.Ports {
		if pt.HostPort == 0 {
			continue
		}
		f := fmt.Sprintf("%s.ports[%d]", field, j)
		switch {
		case pt.Protocol != "" && pt.Protocol != corev1.ProtocolTCP && pt.Protocol != corev1.ProtocolUDP:
			return nil, &planError{f + ".protocol", fmt.Sprintf("%s host ports are not supported on Berth nodes; TCP and UDP only", pt.Protocol)}
		case pt.HostPort < 1 || pt.HostPort > 65535:
			return nil, &planError{f + ".hostPort", fmt.Sprintf("%d: want 1 to 65535", pt.HostPort)}
		case pt.ContainerPort < 1 || pt.ContainerPort > 65535:
			return nil, &planError{f + ".containerPort", fmt.Sprintf("%d: want 1 to 65535", pt.ContainerPort)}
		case pt.HostIP != "" && net.ParseIP(pt.HostIP) == nil:
			return nil, &planError{f + ".hostIP", fmt.Sprintf("%q is not an address", pt.HostIP)}
		}
		out = append(out, hostPort{field: f, addr: net.JoinHostPort(pt.HostIP, strconv.Itoa(int(pt.HostPort))), target: int(pt.ContainerPort), udp: pt.Protocol == corev1.ProtocolUDP})
	}
	return out, nil
}

// serveHostPorts listens on the pod's host ports and serves them until
// its context ends. A port it cannot listen on fails the start.
func (p *Pods) serveHostPorts(ps *podState) error {
	socks := make([]io.Closer, 0, len(ps.plan.hostPorts))
	for _, hp := range ps.plan.hostPorts {
		addr := hp.addr
		if host, port, _ := net.SplitHostPort(addr); host == "" {
			addr = net.JoinHostPort(p.ip, port)
		}
		var lc net.ListenConfig
		var sock io.Closer
		var err error
		if hp.udp {
			sock, err = lc.ListenPacket(ps.ctx, "udp", addr)
		} else {
			sock, err = lc.Listen(ps.ctx, "tcp", addr)
		}
		if err != nil {
			for _, s := range socks {
				s.Close()
			}
			return fmt.Errorf("%s: listen on %s: %w", hp.field, addr, err)
		}
		socks = append(socks, sock)
	}
	k := key(ps.pod.Namespace, ps.pod.Name)
	for i, sock := range socks {
		hp := ps.plan.hostPorts[i]
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			<-ps.ctx.Done()
			sock.Close()
		}()
		if pc, ok := sock.(net.PacketConn); ok {
			go func() {
				defer p.wg.Done()
				p.log.Info("host_port_listening", "pod", k, "addr", pc.LocalAddr().String(), "protocol", "udp", "container_port", hp.target)
				p.mu.Lock()
				id := ps.sandboxID
				p.mu.Unlock()
				if err := p.sb.ForwardUDP(ps.ctx, id, pc, hp.target); err != nil && !errors.Is(err, net.ErrClosed) && ps.ctx.Err() == nil {
					p.log.Warn("host_port_failed", "addr", pc.LocalAddr().String(), "err", err)
				}
			}()
			continue
		}
		ln := sock.(net.Listener)
		go func() {
			defer p.wg.Done()
			p.log.Info("host_port_listening", "pod", k, "addr", ln.Addr().String(), "protocol", "tcp", "container_port", hp.target)
			for {
				conn, err := ln.Accept()
				if err != nil {
					if !errors.Is(err, net.ErrClosed) && ps.ctx.Err() == nil {
						p.log.Warn("host_port_accept_failed", "addr", ln.Addr().String(), "err", err)
					}
					return
				}
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					p.forwardHostPort(ps, conn, hp.target)
				}()
			}
		}()
	}
	return nil
}

// forwardHostPort joins conn to the pod's port target until both ends
// are done, or the pod ends.
func (p *Pods) forwardHostPort(ps *podState, conn net.Conn, target int) {
	defer conn.Close()
	p.mu.Lock()
	id := ps.sandboxID
	p.mu.Unlock()
	remote, err := p.sb.DialPort(ps.ctx, id, target)
	if err != nil {
		p.log.Info("host_port_dial_failed", "pod", key(ps.pod.Namespace, ps.pod.Name), "container_port", target, "err", err)
		return
	}
	defer remote.Close()
	stop := context.AfterFunc(ps.ctx, func() {
		conn.Close()
		remote.Close()
	})
	defer stop()
	splice.Conns(conn, remote)
}
