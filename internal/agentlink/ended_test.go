package agentlink

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// cutBody yields its chunks, then fails as a transport does once the
// request's context is cancelled.
type cutBody struct {
	chunks [][]byte
	cancel func()
}

func (b *cutBody) Read(p []byte) (int, error) {
	if len(b.chunks) == 0 {
		b.cancel()
		return 0, context.Canceled
	}
	n := copy(p, b.chunks[0])
	b.chunks[0] = b.chunks[0][n:]
	if len(b.chunks[0]) == 0 {
		b.chunks = b.chunks[1:]
	}
	return n, nil
}

func (b *cutBody) Close() error { return nil }

func envelope(flags byte, msg string) []byte {
	out := make([]byte, 5+len(msg))
	out[0] = flags
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	copy(out[5:], msg)
	return out
}

// TestEndStreams: a Connect stream its sandbox's end cuts between two
// messages ends with an end-of-stream message carrying the cause's class
// and text; one cut inside a message, or by its caller, stays an error.
func TestEndStreams(t *testing.T) {
	ended := fmt.Errorf("sandbox x is stopping: out of memory: %w", errdefs.ErrFailedPrecondition)
	msg1, msg2 := envelope(0, `{"a":1}`), envelope(0, `{"b":22}`)
	whole := append(append([]byte(nil), msg1...), msg2...)
	for _, tc := range []struct {
		name    string
		chunks  [][]byte
		cause   error
		confirm bool // the stream breaks first; confirm finds the sandbox ended
		wantEOS bool
	}{
		{"between messages", [][]byte{whole[:3], whole[3:9], whole[9:]}, ended, false, true},
		{"inside a message", [][]byte{whole[:len(whole)-2]}, ended, false, false},
		{"by its caller", [][]byte{whole}, context.Canceled, false, false},
		{"agent died, confirmed", [][]byte{whole}, ended, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/process.Process/Start", nil)
			breaks, confirm := func() { cancel(tc.cause) }, func(*http.Request) {}
			if tc.confirm {
				breaks, confirm = func() {}, func(*http.Request) { cancel(tc.cause) }
			}
			resp := &http.Response{Request: req, Header: http.Header{"Content-Type": {"application/connect+json"}},
				Body: &cutBody{chunks: tc.chunks, cancel: breaks}}
			hook := EndStreams(func(c error) bool { return errors.Is(c, errdefs.ErrFailedPrecondition) }, confirm)
			if err := hook(resp); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if !tc.wantEOS {
				if err == nil {
					t.Errorf("stream cut %s read to its end (%q), want an error", tc.name, got)
				}
				return
			}
			if err != nil || !bytes.HasPrefix(got, whole) {
				t.Fatalf("stream = %q, %v; want both messages and an end", got, err)
			}
			eos := got[len(whole):]
			if len(eos) < 5 || eos[0] != 0x02 || int(binary.BigEndian.Uint32(eos[1:5])) != len(eos)-5 {
				t.Fatalf("tail %q is not one end-of-stream envelope", eos)
			}
			var end struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(eos[5:], &end); err != nil || end.Error.Code != "failed_precondition" || !strings.Contains(end.Error.Message, "out of memory") {
				t.Errorf("end of stream = %s (%v), want failed_precondition naming out of memory", eos[5:], err)
			}
		})
	}
}
