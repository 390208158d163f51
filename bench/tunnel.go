package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// The port tunnel rows: a 64-byte round trip to an echo server in a
// sandbox (test/harness/udpecho, TCP and UDP), through the daemon's port
// tunnel (Sandbox.DialPort, Sandbox.DialUDP) and, as the floor, straight
// from the host to the sandbox's address, on one connection each.

const (
	tunnelTCPPort = 7000
	tunnelUDPPort = 5353
	tunnelPayload = 64
)

func measureTunnels(ctx context.Context, tb *runner, d *harness.Daemon, n int) ([]row, error) {
	sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal"})
	if err != nil {
		return nil, err
	}
	defer func() { _ = d.Client.Kill(ctx, sb.ID) }()
	harness.StartEcho(tb, built, sb, tunnelUDPPort, tunnelTCPPort)
	// get gives the sandbox's address (a create does not).
	got, err := d.Client.Get(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if got.Network == nil || got.Network.Address == "" {
		return nil, fmt.Errorf("sandbox %s has no address for the direct floor", sb.ID)
	}
	addr := got.Network.Address
	same := func(p []byte) []byte { return p }
	echoed := func(p []byte) []byte { return append([]byte("echo "), p...) }
	measure := func(what string, dial func() (io.ReadWriteCloser, error), want func([]byte) []byte) ([]time.Duration, error) {
		c, err := dial()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		defer c.Close()
		// A datagram lost would leave a read waiting: the connection
		// closes after a minute whatever happens.
		stop := time.AfterFunc(time.Minute, func() { c.Close() })
		defer stop.Stop()
		out, err := roundTrips(c, n, want)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return out, nil
	}
	direct := func(network string, port int) func() (io.ReadWriteCloser, error) {
		return func() (io.ReadWriteCloser, error) {
			return net.Dial(network, net.JoinHostPort(addr, strconv.Itoa(port)))
		}
	}
	tcp, err := measure("TCP tunnel", func() (io.ReadWriteCloser, error) { return sb.DialPort(ctx, tunnelTCPPort) }, same)
	if err != nil {
		return nil, err
	}
	tcpFloor, err := measure("TCP direct", direct("tcp", tunnelTCPPort), same)
	if err != nil {
		return nil, err
	}
	udp, err := measure("UDP tunnel", func() (io.ReadWriteCloser, error) { return sb.DialUDP(ctx, tunnelUDPPort) }, echoed)
	if err != nil {
		return nil, err
	}
	udpFloor, err := measure("UDP direct", direct("udp", tunnelUDPPort), echoed)
	if err != nil {
		return nil, err
	}
	return []row{
		{fmt.Sprintf("TCP port tunnel round trip (%d bytes to an echo server, `Sandbox.DialPort`)", tunnelPayload), tcp},
		{"floor: the same round trip straight to the sandbox's address", tcpFloor},
		{fmt.Sprintf("UDP port tunnel round trip (a %d-byte datagram and its echo, `Sandbox.DialUDP`)", tunnelPayload), udp},
		{"floor: the same round trip straight to the sandbox's address", udpFloor},
	}, nil
}

// roundTrips sends n+5 payloads on c, each read back as want(payload)
// before the next, and returns the times of all but the first five.
func roundTrips(c io.ReadWriter, n int, want func([]byte) []byte) ([]time.Duration, error) {
	payload := bytes.Repeat([]byte("x"), tunnelPayload)
	exp := want(payload)
	buf := make([]byte, len(exp)+16)
	var out []time.Duration
	for i := 0; i < n+5; i++ {
		start := time.Now()
		if _, err := c.Write(payload); err != nil {
			return nil, err
		}
		got := 0
		for got < len(exp) {
			k, err := c.Read(buf[got:])
			if err != nil {
				return nil, err
			}
			got += k
		}
		if !bytes.Equal(buf[:got], exp) {
			return nil, fmt.Errorf("echo = %q, want %q", buf[:got], exp)
		}
		if i >= 5 {
			out = append(out, time.Since(start))
		}
	}
	return out, nil
}
