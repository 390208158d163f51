package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/grpclog"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func init() {
	// gRPC's own log (its connection attempts) would reach the node's
	// stderr unstructured; a check that fails is the probe's error, which
	// the probe runner reports.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
}

// grpcCheck calls the gRPC health service on port of sandbox id over a
// port tunnel (plaintext HTTP/2, as the kubelet's gRPC probe), for
// service: nil when it answers SERVING.
func (p *Pods) grpcCheck(ctx context.Context, id string, port int, service string) error {
	conn, err := grpc.NewClient("passthrough:///sandbox",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			c, err := p.sb.DialPort(ctx, id, port)
			if err != nil {
				return nil, err
			}
			return tunnelConn{c}, nil
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("gRPC health check of port %d: %w", port, err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("gRPC health of service %q: %s", service, st)
	}
	return nil
}

// tunnelConn is a port tunnel as a net.Conn for gRPC's transport, which
// does not depend on its addresses or deadlines: the probe's context
// bounds the call, and ending it closes the tunnel.
type tunnelConn struct{ io.ReadWriteCloser }

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "berth-tunnel" }
func (tunnelAddr) String() string  { return "sandbox" }

func (tunnelConn) LocalAddr() net.Addr              { return tunnelAddr{} }
func (tunnelConn) RemoteAddr() net.Addr             { return tunnelAddr{} }
func (tunnelConn) SetDeadline(time.Time) error      { return nil }
func (tunnelConn) SetReadDeadline(time.Time) error  { return nil }
func (tunnelConn) SetWriteDeadline(time.Time) error { return nil }
