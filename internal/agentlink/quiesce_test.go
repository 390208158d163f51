package agentlink

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/agent"
)

// endWatch is a connection that reports when a read on it fails (the
// peer closed or reset it).
type endWatch struct {
	net.Conn
	once sync.Once
	end  chan struct{}
}

func (c *endWatch) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(func() { close(c.end) })
	}
	return n, err
}

func watchEnd(c net.Conn) *endWatch { return &endWatch{Conn: c, end: make(chan struct{})} }

// waitEnd waits, within a generous bound, for the agent to end c.
func waitEnd(t *testing.T, name string, c *endWatch) {
	t.Helper()
	select {
	case <-c.end:
	case <-time.After(time.Minute):
		t.Errorf("the agent did not close the %s connection", name)
	}
}

// TestQuiesceClosesEveryAgentConnection: Quiesce returns once the real
// agent closed every connection it held (an idle HTTP/1.1 one, one in the
// middle of a request, an idle h2c one) and its own.
func TestQuiesceClosesEveryAgentConnection(t *testing.T) {
	srv, err := agent.New(agent.Config{Token: testToken, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	go func() { _ = srv.Serve(ctx, l) }()
	t.Cleanup(srv.Close)
	addr := l.Addr().String()

	dial := func() *endWatch {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return watchEnd(c)
	}
	idle := dial()
	if _, err := io.WriteString(idle, "GET /health HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health on the idle connection: %v, %v", resp, err)
	}
	go func() { _, _ = io.Copy(io.Discard, br) }()
	partial := dial()
	if _, err := io.WriteString(partial, "GET /health HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, partial) }()

	var h2 *endWatch
	protos := new(http.Protocols)
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: protos, DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		h2 = watchEnd(c)
		return h2, nil
	}}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err = (&http.Client{Transport: tr}).Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || h2 == nil {
		t.Fatalf("health over h2c answered %s", resp.Proto)
	}

	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := New().Quiesce(qctx, addr, testToken); err != nil {
		t.Fatalf("Quiesce: %v", err)
	}
	waitEnd(t, "idle HTTP/1.1", idle)
	waitEnd(t, "half-sent request's", partial)
	waitEnd(t, "idle h2c", h2)

	// Without the token, nothing is closed.
	again := dial()
	go func() { _, _ = io.Copy(io.Discard, again) }()
	if err := New().Quiesce(qctx, addr, "wrong"); err == nil {
		t.Error("Quiesce with a wrong token succeeded")
	}
	select {
	case <-again.end:
		t.Error("a refused Quiesce closed a connection")
	default:
	}
}

// TestQuiesceNeedsAConnectionOfItsOwn: an agent served without its
// connection tracking (a bare handler) refuses, and Quiesce says so.
func TestQuiesceNeedsAConnectionOfItsOwn(t *testing.T) {
	srv, err := agent.New(agent.Config{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	err = New().Quiesce(t.Context(), ts.Listener.Addr().String(), testToken)
	if err == nil {
		t.Fatal("Quiesce through a bare handler succeeded")
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		t.Fatalf("Quiesce failed on the network, not with the agent's refusal: %v", err)
	}
}
