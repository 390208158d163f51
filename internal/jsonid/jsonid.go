// Package jsonid rewrites one ID for another in a stream of JSON lines.
//
// A sandbox's records on a Berth node (events, egress decisions, work
// log) name the node's sandbox ID; read through the Kubernetes gateway
// they name the gateway's. Rename replaces every JSON string that is
// exactly the old ID ("<id>", quotes included) a line at a time, so a
// followed NDJSON stream still passes each record on as it comes. Sandbox
// IDs are [a-z0-9] only, so the quoted form never needs escaping and
// cannot be part of a longer string.
package jsonid

import (
	"bytes"
	"io"
)

// Rename returns src with every quoted from replaced by quoted to, a
// whole line at a time.
func Rename(src io.ReadCloser, from, to string) io.ReadCloser {
	return &renameReader{src: src, old: []byte(`"` + from + `"`), new: []byte(`"` + to + `"`)}
}

// renameReader replaces old with new in whole lines of src.
type renameReader struct {
	src      io.ReadCloser
	old, new []byte
	// pending is read and not yet a whole line; out is rewritten and not
	// yet returned.
	pending, out []byte
	buf          [32 << 10]byte
	err          error
}

func (r *renameReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			if len(r.pending) == 0 {
				return 0, r.err
			}
			// The last line, without its newline.
			r.out, r.pending = bytes.ReplaceAll(r.pending, r.old, r.new), nil
			break
		}
		n, err := r.src.Read(r.buf[:])
		r.pending = append(r.pending, r.buf[:n]...)
		r.err = err
		if i := bytes.LastIndexByte(r.pending, '\n'); i >= 0 {
			r.out = bytes.ReplaceAll(r.pending[:i+1], r.old, r.new)
			r.pending = append([]byte(nil), r.pending[i+1:]...)
		}
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *renameReader) Close() error { return r.src.Close() }
