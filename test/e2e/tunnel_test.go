package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// tunnelServer starts, in sb, a TCP server on port that answers each
// connection with its input upper-cased once that input has ended (the
// client's half-close), then "end-of-input", and waits until it listens.
func tunnelServer(t *testing.T, sb *client.Sandbox, port int) {
	t.Helper()
	MustRun(t, sb, "printf '#!/bin/sh\\ntr a-z A-Z\\necho end-of-input\\n' > /tmp/srv.sh && chmod +x /tmp/srv.sh")
	MustRun(t, sb, fmt.Sprintf("busybox nc -ll -p %d -e /tmp/srv.sh </dev/null >/dev/null 2>&1 &", port))
	harness.WaitFor(t, time.Minute, fmt.Sprintf("the server in the sandbox to listen on %d", port), func() bool {
		out, _, _ := Run(t, sb, "netstat -ltn")
		return strings.Contains(out, fmt.Sprintf(":%d ", port))
	})
}

// roundTrip sends in on c, half-closes, and reads everything back; the
// writing and the reading overlap, as a large answer needs.
func roundTrip(c interface {
	io.ReadWriter
	CloseWrite() error
}, in []byte) ([]byte, error) {
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(in)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	out, rerr := io.ReadAll(c)
	return out, errors.Join(<-werr, rerr)
}

// TestPortTunnel: the Go SDK's DialPort and `berth forward --tcp` carry a
// TCP connection to a server in the sandbox that is not HTTP, both ways
// and half-closes included (the server answers only once its input
// ended), a megabyte each way; a port nobody listens on, the agent's
// port, a request that does not upgrade and an unknown sandbox get clear
// errors; a kill cuts an open tunnel, and nothing is left behind.
func TestPortTunnel(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})
	tunnelServer(t, sb, 9000)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	c, err := sb.DialPort(ctx, 9000)
	if err != nil {
		t.Fatal(err)
	}
	out, err := roundTrip(c, []byte("hello tunnel"))
	c.Close()
	if err != nil || string(out) != "HELLO TUNNELend-of-input\n" {
		t.Errorf("through DialPort: %q, %v; want the upper-cased input, then the end marker (sent after the half-close)", out, err)
	}
	big := bytes.Repeat([]byte("abcdefgh"), 1<<17) // 1 MiB
	c, err = sb.DialPort(ctx, 9000)
	if err != nil {
		t.Fatal(err)
	}
	out, err = roundTrip(c, big)
	c.Close()
	if want := append(bytes.ToUpper(big), "end-of-input\n"...); err != nil || !bytes.Equal(out, want) {
		t.Errorf("1 MiB through DialPort: got %d bytes, %v; want %d", len(out), err, len(want))
	}

	// Refusals, each naming its field.
	for _, tc := range []struct {
		port        int
		code, field string
	}{{9001, errdefs.CodeUnavailable, "port"}, {49983, errdefs.CodeInvalidArgument, "port"}, {0, errdefs.CodeInvalidArgument, "port"}} {
		_, err := sb.DialPort(ctx, tc.port)
		var e *errdefs.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Field != tc.field {
			t.Errorf("DialPort(%d) = %v, want %s on %s", tc.port, err, tc.code, tc.field)
		}
	}
	if _, err := d.Client.Sandbox("nosuchsandbox000000").DialPort(ctx, 9000); errdefs.Code(err) != errdefs.CodeNotFound {
		t.Errorf("DialPort into an unknown sandbox = %v, want not_found", err)
	}
	if code, body := callAPI(t, "GET", d.URL+"/v1/sandboxes/"+sb.ID+"/tunnel/9000", "", nil); code != 400 || !strings.Contains(body, `"field": "upgrade"`) {
		t.Errorf("tunnel without an upgrade = %d %s, want 400 on field upgrade", code, body)
	}

	// berth forward --tcp: a local listener, each connection a tunnel.
	cmd, line, stderr := startForward(t, d, sb.ID, "9000", "--tcp")
	var local string
	if _, err := fmt.Sscanf(line, "forwarding tcp://%s", &local); err != nil {
		t.Fatalf("forward --tcp printed %q", line)
	}
	for i := range 2 {
		lc, err := net.Dial("tcp", local)
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("connection %d", i)
		out, err := roundTrip(lc.(*net.TCPConn), []byte(msg))
		lc.Close()
		if want := strings.ToUpper(msg) + "end-of-input\n"; err != nil || string(out) != want {
			t.Errorf("through berth forward --tcp: %q, %v; want %q", out, err, want)
		}
	}

	// A kill cuts an open tunnel: its reader ends.
	open, err := sb.DialPort(ctx, 9000)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Write([]byte("pending")); err != nil {
		t.Fatal(err)
	}
	killCuts(ctx, t, d, sb, open, cmd, stderr, "--tcp")
}

// killCuts kills sb and checks that the open tunnel's reads end, that
// `berth forward` (cmd, started with flag) ends non-zero saying the
// sandbox ended, and that nothing is left behind.
func killCuts(ctx context.Context, t *testing.T, d *Daemon, sb *client.Sandbox, open io.Reader, cmd *exec.Cmd, stderr *bytes.Buffer, flag string) {
	t.Helper()
	cut := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(open)
		cut <- err
	}()
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cut:
	case <-ctx.Done():
		t.Fatalf("an open %s tunnel outlived its sandbox's kill", flag)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(stderr.String(), "ended") {
		t.Errorf("forward %s after the kill = %v, stderr %q; want it to end non-zero saying the sandbox ended", flag, err, stderr.String())
	}
	AssertNoLeaks(t, d)
}

// udpExchange sends each of msgs on c as a datagram, then reads as many
// answers (skipping the ones skip names) and returns them; it fails the
// test if they do not come within a minute.
func udpExchange(t *testing.T, c io.ReadWriter, skip string, msgs ...string) []string {
	t.Helper()
	for _, m := range msgs {
		if _, err := c.Write([]byte(m)); err != nil {
			t.Fatalf("send %q: %v", m, err)
		}
	}
	got := make(chan []string, 1)
	go func() {
		var out []string
		buf := make([]byte, 1<<16)
		for len(out) < len(msgs) {
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			if s := string(buf[:n]); s != skip {
				out = append(out, s)
			}
		}
		got <- out
	}()
	select {
	case out := <-got:
		return out
	case <-time.After(time.Minute):
		t.Fatalf("no answer to %d datagram(s) within a minute", len(msgs))
		return nil
	}
}

// TestUDPTunnel: DialUDP carries datagrams to a UDP server in the sandbox
// and its answers back, bounds and order kept, a 60 KB one too; a
// datagram the port refused (nothing listened yet) does not end the
// tunnel; `berth forward --udp` gives each local peer a tunnel of its
// own, each answered apart; another upgrade is refused on field upgrade;
// a kill ends the tunnel and the forward, and nothing is left behind.
func TestUDPTunnel(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	u, err := sb.DialUDP(ctx, 5353)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	harness.StartUDPEcho(t, bin, sb, 5353)
	// "early" was refused (or, had it been slow, is answered: skipped).
	if got := udpExchange(t, u, "echo early", "one", "two", "three"); strings.Join(got, "|") != "echo one|echo two|echo three" {
		t.Errorf("through DialUDP: %q", got)
	}
	big := strings.Repeat("x", 60000)
	if got := udpExchange(t, u, "echo early", big); len(got) != 1 || got[0] != "echo "+big {
		t.Errorf("a 60 KB datagram came back as %d answer(s)", len(got))
	}

	cmd, line, stderr := startForward(t, d, sb.ID, "5353", "--udp")
	var local string
	if _, err := fmt.Sscanf(line, "forwarding udp://%s", &local); err != nil {
		t.Fatalf("forward --udp printed %q", line)
	}
	for i := range 2 {
		pc, err := net.Dial("udp", local)
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("peer %d", i)
		if got := udpExchange(t, pc, "", msg); len(got) != 1 || got[0] != "echo "+msg {
			t.Errorf("through berth forward --udp: %q, want %q", got, "echo "+msg)
		}
		pc.Close()
	}

	code, body := callAPI(t, "GET", d.URL+"/v1/sandboxes/"+sb.ID+"/tunnel/5353", "", map[string]string{"Connection": "Upgrade", "Upgrade": "sctp"})
	if code != 400 || !strings.Contains(body, `"field": "upgrade"`) {
		t.Errorf("tunnel with Upgrade: sctp = %d %s, want 400 on field upgrade", code, body)
	}

	// A kill ends the open tunnel and the forward.
	killCuts(ctx, t, d, sb, u, cmd, stderr, "--udp")
}
