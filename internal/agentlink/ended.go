package agentlink

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
)

// EndStreams is a ReverseProxy ModifyResponse hook for proxies whose
// outgoing request's context ends, with a cause, when the sandbox does
// (sandbox.Manager.AgentSession). A Connect stream (process output, PTY,
// watch) cut that way ends with a Connect end-of-stream message carrying
// the cause's class and text, so the client reads "sandbox is stopping:
// out of memory" as a clean error instead of a connection torn mid-way.
// Other answers (a download) can only be cut: the proxy aborts them.
// isEnded picks the causes that are a sandbox's end (a caller that went
// away is not one). A stream that breaks while its context has not ended
// (a runc sandbox's agent died: the host kernel closed its end) calls
// confirm, which should find out at once whether the sandbox still runs
// and end its context if not, so its caller hears why.
func EndStreams(isEnded func(cause error) bool, confirm func(*http.Request)) func(*http.Response) error {
	return func(resp *http.Response) error {
		if resp.Request == nil || resp.Body == nil {
			return nil
		}
		mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if !strings.HasPrefix(mt, "application/connect+") {
			return nil
		}
		resp.Body = &endingStream{body: resp.Body, req: resp.Request, ctx: resp.Request.Context(), isEnded: isEnded, confirm: confirm}
		return nil
	}
}

// endingStream passes a Connect stream through, tracking its envelope
// boundaries (1 flag byte, 4 length bytes, the message), so that when
// the sandbox's end cuts it between two messages it can end it with an
// end-of-stream message of its own.
type endingStream struct {
	body    io.ReadCloser
	req     *http.Request
	ctx     context.Context
	isEnded func(error) bool
	confirm func(*http.Request)

	hdr  [5]byte
	nhdr int    // header bytes seen of the current envelope
	rest uint32 // message bytes still to come in it
	// tail is the end-of-stream message still to hand out, once cut.
	tail []byte
	done bool
}

func (s *endingStream) Read(p []byte) (int, error) {
	if s.done {
		if len(s.tail) == 0 {
			return 0, io.EOF
		}
		n := copy(p, s.tail)
		s.tail = s.tail[n:]
		return n, nil
	}
	n, err := s.body.Read(p)
	s.track(p[:n])
	if err == nil || errors.Is(err, io.EOF) {
		return n, err
	}
	if s.nhdr != 0 || s.rest != 0 {
		return n, err // cut inside a message: nothing clean to add
	}
	if s.ctx.Err() == nil && s.confirm != nil {
		s.confirm(s.req)
	}
	cause := context.Cause(s.ctx)
	if s.ctx.Err() == nil || !s.isEnded(cause) {
		return n, err
	}
	s.done, s.tail = true, endOfStream(cause)
	return n, nil
}

func (s *endingStream) Close() error { return s.body.Close() }

// track follows envelope boundaries through b.
func (s *endingStream) track(b []byte) {
	for len(b) > 0 {
		if s.rest > 0 {
			k := min(uint32(len(b)), s.rest)
			s.rest -= k
			b = b[k:]
			continue
		}
		k := copy(s.hdr[s.nhdr:], b)
		s.nhdr += k
		b = b[k:]
		if s.nhdr == len(s.hdr) {
			s.rest = binary.BigEndian.Uint32(s.hdr[1:])
			s.nhdr = 0
		}
	}
}

// endOfStream is a Connect end-of-stream envelope (flag 0x02, always
// JSON) carrying err as a Connect error.
func endOfStream(err error) []byte {
	msg, _ := json.Marshal(map[string]any{"error": map[string]string{"code": connectCode(err), "message": err.Error()}})
	out := make([]byte, 5+len(msg))
	out[0] = 0x02
	binary.BigEndian.PutUint32(out[1:5], uint32(len(msg)))
	copy(out[5:], msg)
	return out
}

// connectCode is the Connect code of err's class. Most errdefs codes are
// Connect's names; the two that are not map to their nearest.
func connectCode(err error) string {
	switch c := errdefs.Code(err); c {
	case errdefs.CodePolicyDenied:
		return "permission_denied"
	case errdefs.CodeNotImplemented:
		return "unimplemented"
	default:
		return c
	}
}
