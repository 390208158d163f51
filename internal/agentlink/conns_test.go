package agentlink

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestCloseTo: CloseTo cuts a streaming response in flight, and only
// connections to that sandbox: one to another stays open and usable.
func TestCloseTo(t *testing.T) {
	started := make(chan struct{})
	stream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer stream.Close()
	// Another sandbox: another loopback address.
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	other.Listener = ln
	other.Start()
	defer other.Close()

	l := New()
	c := &http.Client{Transport: l.Transport()}
	// A connection to the other agent. Dialed here rather than left idle
	// by a request: the transport may close a connection instead of
	// keeping it (one whose request write it did not see finish within
	// its short wait, as on a loaded host).
	otherAddr := hostOf(t, other.URL)
	oc, err := l.Dial(t.Context(), "tcp", other.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	if n := l.conns.open(otherAddr); n != 1 {
		t.Fatalf("open connections to the other agent = %d, want 1", n)
	}

	addr := hostOf(t, stream.URL)
	resp, err := c.Get(stream.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	if n := l.conns.open(addr); n != 1 {
		t.Fatalf("open connections to the streaming agent = %d, want 1", n)
	}
	l.CloseTo(addr)
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Errorf("the stream ended cleanly after CloseTo (read %q), want an error", b)
	}
	if n := l.conns.open(addr); n != 0 {
		t.Errorf("open connections to the agent after CloseTo = %d, want 0", n)
	}
	if n := l.conns.open(otherAddr); n != 1 {
		t.Errorf("open connections to the other agent after CloseTo = %d, want its one kept", n)
	}
	// And it still carries a request.
	if _, err := io.WriteString(oc, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(oc); err != nil || !strings.HasSuffix(string(b), "ok") {
		t.Errorf("request over the other agent's connection after CloseTo = %q, %v; want its answer", b, err)
	}
}

func hostOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Hostname()
}
