package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/meminfo"
)

// quiesceWait bounds how long /quiesce waits for the server goroutines of
// the connections it closed to finish.
const quiesceWait = 10 * time.Second

// connKey carries a request's connection in its context (ConnContext).
type connKey struct{}

// connTracker is every connection the agent's servers hold open, for
// /quiesce: before gVisor checkpoints a sandbox, no socket the agent holds
// may still be open on an endpoint whose peer is gone (runsc 2022 refuses
// to save an endpoint in the error state that still has waiters, and a
// failed save ends the sandbox). The host resets its connections first;
// how soon the agent notices is a race, so /quiesce closes what is left
// itself and answers only once every close has returned.
type connTracker struct {
	mu      sync.Mutex
	open    map[net.Conn]struct{}
	changed chan struct{} // closed and replaced when a connection leaves
}

func newConnTracker() *connTracker {
	return &connTracker{open: map[net.Conn]struct{}{}, changed: make(chan struct{})}
}

// hook is the servers' ConnState.
func (t *connTracker) hook(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch st {
	case http.StateNew:
		t.open[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		if _, ok := t.open[c]; ok {
			delete(t.open, c)
			close(t.changed)
			t.changed = make(chan struct{})
		}
	}
}

// others lists the open connections but self, and the channel that is
// closed when one leaves.
func (t *connTracker) others(self net.Conn) ([]net.Conn, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var cs []net.Conn
	for c := range t.open {
		if c != self {
			cs = append(cs, c)
		}
	}
	return cs, t.changed
}

// closeOthers closes every connection but self (net.Conn.Close returns
// once the socket is closed) and waits until their servers let go of
// them, or ctx ends.
func (t *connTracker) closeOthers(ctx context.Context, self net.Conn) error {
	cs, _ := t.others(self)
	for _, c := range cs {
		_ = c.Close() // its server may have closed it already
	}
	for {
		cs, changed := t.others(self)
		if len(cs) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// postQuiesce answers POST /quiesce, which the host sends on a connection
// of its own, over HTTP/1.1, right before a checkpoint: every other
// connection is closed, then the answer is written and this connection
// closed by the agent, so the host's read of its end proves the agent
// holds no connection at all.
func (s *Server) postQuiesce(w http.ResponseWriter, r *http.Request) {
	self, _ := r.Context().Value(connKey{}).(net.Conn)
	hj, ok := w.(http.Hijacker)
	if self == nil || !ok || r.ProtoMajor != 1 {
		jsonError(w, http.StatusBadRequest, errors.New("quiesce needs an HTTP/1.1 connection of its own"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), quiesceWait)
	defer cancel()
	status := "204 No Content"
	if err := s.conns.closeOthers(ctx, self); err != nil {
		s.log.Warn("quiesce", "err", err)
		status = "503 Service Unavailable"
	}
	accountMemory()
	c, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	_, _ = buf.WriteString("HTTP/1.1 " + status + "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	_ = buf.Flush()
	_ = c.Close()
}

// accountMemory has gVisor's sandbox kernel take stock of the memory the
// sandbox's processes committed, before the checkpoint that follows
// /quiesce: reading /proc/meminfo makes the sentry look up which pages of
// its memory file are there (mincore, 2–4 ms for 272 MiB). A page it has
// not taken stock of, the checkpoint reads instead, one at a time, to
// skip the zero ones, which made a sandbox's first pause 0.2–0.4 s slower
// at 256 MiB (the daemon's accountMemory says more). Under runc it is the
// read of a proc file and nothing more; a failure costs that time only.
func accountMemory() { _, _ = meminfo.Read() }
