// Command grpchealth is a gRPC server with only the standard health
// service, for the kube tests' gRPC probes: it answers SERVING for every
// service name, and NOT_SERVING while the file named by -down exists.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

type health struct {
	healthpb.UnimplementedHealthServer
	down string
}

func (h *health) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if _, err := os.Stat(h.down); err == nil {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	log.Printf("check %q: serving", req.GetService())
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func main() {
	addr := flag.String("listen", ":9000", "address to serve on")
	down := flag.String("down", "/tmp/down", "NOT_SERVING while this file exists")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, &health{down: *down})
	log.Fatal(s.Serve(ln))
}
