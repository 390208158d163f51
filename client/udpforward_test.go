package client

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/proto/datagram"
)

// udpDaemon answers UDP port tunnels as a daemon would, its sandbox's
// server answering each datagram with "echo " and it; opened counts the
// tunnels, and closed receives one value per tunnel its client ended.
type udpDaemon struct {
	opened atomic.Int32
	closed chan struct{}
}

func (d *udpDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/sandboxes/sb1/tunnel/5353" || r.Header.Get("Upgrade") != datagram.Protocol {
		http.Error(w, "bad tunnel", http.StatusBadRequest)
		return
	}
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	d.opened.Add(1)
	_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: udp\r\n\r\n")
	_ = buf.Flush()
	in := bufio.NewReader(buf)
	p := make([]byte, datagram.MaxSize)
	for {
		n, err := datagram.Read(in, p)
		if err != nil {
			d.closed <- struct{}{}
			return
		}
		if datagram.Write(conn, append([]byte("echo "), p[:n]...)) != nil {
			return
		}
	}
}

// ask sends msg from c and returns the answer (bounded: a lost answer
// fails the test, it does not time it).
func ask(t *testing.T, c net.Conn, msg string) string {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("answer to %q: %v", msg, err)
	}
	return string(buf[:n])
}

// TestForwardUDP: each peer gets a tunnel of its own and its answers; an
// idle peer's tunnel is closed and its next datagram opens another; the
// end of ctx ends ForwardUDP and its tunnels.
func TestForwardUDP(t *testing.T) {
	d := &udpDaemon{closed: make(chan struct{}, 16)}
	srv := httptest.NewServer(d)
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Sandbox("sb1").ForwardUDP(ctx, pc, 5353, 100*time.Millisecond) }()

	a, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := ask(t, a, "from a"); got != "echo from a" {
		t.Errorf("a got %q", got)
	}
	if got := ask(t, b, "from b"); got != "echo from b" {
		t.Errorf("b got %q", got)
	}
	if n := d.opened.Load(); n != 2 {
		t.Errorf("%d tunnels for two peers", n)
	}
	// Both go idle: their tunnels close (the daemon sees each end).
	for range 2 {
		select {
		case <-d.closed:
		case <-time.After(time.Minute):
			t.Fatal("an idle peer's tunnel was not closed")
		}
	}
	if got := ask(t, a, "again"); got != "echo again" || d.opened.Load() != 3 {
		t.Errorf("after the idle close: %q, %d tunnels", got, d.opened.Load())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ForwardUDP at the end of ctx = %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ForwardUDP did not return at the end of its context")
	}
	select {
	case <-d.closed:
	case <-time.After(time.Minute):
		t.Fatal("the open tunnel outlived ForwardUDP")
	}
}
