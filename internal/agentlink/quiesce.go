package agentlink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"

	"github.com/berth-sandbox/berth/errdefs"
)

// Quiesce asks the agent at addr to close every connection it holds, on a
// connection of its own that the agent closes after answering, and
// returns once it read that close: from then on the agent holds no socket
// into the host, which gVisor's checkpoint needs (see the agent's
// quiesce.go). Call it after CloseTo. An agent without /quiesce (an older
// one, restored from a checkpoint) answers errdefs.ErrNotImplemented.
func (l *Link) Quiesce(ctx context.Context, addr, token string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("quiesce agent at %s: %w", addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // as every connection into a sandbox (see New)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/quiesce", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Access-Token", token)
	req.Close = true
	if err := req.Write(c); err != nil {
		return fmt.Errorf("quiesce agent at %s: %w", addr, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fmt.Errorf("quiesce agent at %s: %w", addr, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return fmt.Errorf("quiesce agent at %s: %s: %w", addr, resp.Status, errdefs.ErrNotImplemented)
	case resp.StatusCode != http.StatusNoContent:
		return fmt.Errorf("quiesce agent at %s: %s", addr, resp.Status)
	}
	// The agent closes this connection once it answered: reading to the
	// end is what shows its socket is gone.
	if _, err := io.Copy(io.Discard, io.LimitReader(br, 1<<16)); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("quiesce agent at %s: waiting for its close: %w", addr, err)
	}
	return ctx.Err()
}
