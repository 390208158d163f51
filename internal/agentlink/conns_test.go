package agentlink

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// TestCloseTo: CloseTo cuts a streaming response in flight and drops idle
// connections to that sandbox, and only to that one.
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
	// An idle connection to the other agent, kept by the transport.
	resp, err := c.Get(other.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	otherAddr := hostOf(t, other.URL)
	if n := l.conns.open(otherAddr); n != 1 {
		t.Fatalf("open connections to the other agent = %d, want 1 idle", n)
	}

	addr := hostOf(t, stream.URL)
	resp, err = c.Get(stream.URL)
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
		t.Errorf("open connections to the other agent after CloseTo = %d, want its idle one kept", n)
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
