package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/sandbox"
)

// tunnelManager is a Manager whose one sandbox's address is loopback;
// its session ends when end is called.
type tunnelManager struct {
	Manager
	ctx context.Context
}

func (m tunnelManager) AgentSession(ctx context.Context, id string) (context.Context, sandbox.AgentEndpoint, context.CancelFunc, error) {
	sctx, cancel := context.WithCancel(m.ctx)
	stop := context.AfterFunc(ctx, cancel)
	return sctx, sandbox.AgentEndpoint{Addr: "127.0.0.1:49983", Token: "t"}, func() { stop(); cancel() }, nil
}

// upperAfterEOF serves each connection on ln: it reads all of the input,
// then answers it upper-cased and closes.
func upperAfterEOF(t *testing.T, ln net.Listener) {
	t.Helper()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write([]byte(strings.ToUpper(string(b)) + "|done"))
			}()
		}
	}()
}

// rawTunnel sends a tunnel request for port with extra bytes right after
// its headers (in the same write, before any answer), and returns the
// connection and the answer's status line and headers read.
func rawTunnel(t *testing.T, srv *httptest.Server, port int, hdr, extra string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /v1/sandboxes/sb1/tunnel/%d HTTP/1.1\r\nHost: x\r\n%s\r\n%s", port, hdr, extra)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, br, resp
}

// TestTunnel: a tunnel carries bytes both ways, those sent with the
// request included, and passes the client's half-close on (the server
// answers only after its input ended); refusals come before any upgrade,
// as JSON naming the field; the sandbox's end cuts an open tunnel.
func TestTunnel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	upperAfterEOF(t, ln)
	port := ln.Addr().(*net.TCPAddr).Port
	sctx, end := context.WithCancel(context.Background())
	defer end()
	var d net.Dialer
	s := New(Config{Manager: tunnelManager{ctx: sctx}, Dial: d.DialContext})
	// Every handler's end is counted, a tunnel's too (its connection
	// was taken over, so the server no longer tracks it).
	var handlers sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		s.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	up := "Connection: Upgrade\r\nUpgrade: tcp\r\n"

	c, br, resp := rawTunnel(t, srv, port, up, "sent with the request, ")
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "tcp" {
		t.Fatalf("tunnel answer = %s %v", resp.Status, resp.Header)
	}
	if _, err := c.Write([]byte("then more")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "SENT WITH THE REQUEST, THEN MORE|done" {
		t.Errorf("through the tunnel: %q, %v", got, err)
	}

	for _, tc := range []struct {
		port        int
		hdr, field  string
		status      int
		messagePart string
	}{
		{port, "", "upgrade", 400, "Upgrade: tcp"},
		{port, "Connection: Upgrade\r\nUpgrade: websocket\r\n", "upgrade", 400, "websocket"},
		{49983, up, "port", 400, "agent"},
		{0, up, "port", 400, "1 to 65535"},
		{closedPort(t), up, "port", 502, "nothing answers on port"},
	} {
		_, _, resp := rawTunnel(t, srv, tc.port, tc.hdr, "")
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.status || !strings.Contains(string(body), `"field": "`+tc.field+`"`) || !strings.Contains(string(body), tc.messagePart) {
			t.Errorf("tunnel to %d with %q = %d %s, want %d on %s saying %q", tc.port, tc.hdr, resp.StatusCode, body, tc.status, tc.field, tc.messagePart)
		}
	}

	// The sandbox's end (a kill, a pause) cuts an open tunnel.
	_, br, resp = rawTunnel(t, srv, port, up, "")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("tunnel answer = %s", resp.Status)
	}
	cut := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(br)
		cut <- err
	}()
	end()
	select {
	case <-cut:
	case <-time.After(30 * time.Second):
		t.Fatal("the tunnel outlived its sandbox's session")
	}
	// Once every handler returned, no tunnel is counted.
	returned := make(chan struct{})
	go func() {
		handlers.Wait()
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("a tunnel's handler did not return after its sandbox's end")
	}
	if n := s.tunnels.open("sb1"); n != 0 {
		t.Errorf("%d tunnels counted after all ended", n)
	}
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return p
}
