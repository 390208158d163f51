package worklog

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// maxMessage bounds the memory one observed message may take; larger ones
// are skipped (counted, not decoded), so a stream costs at most this much.
const maxMessage = 1 << 20

// Connect envelope flags.
const (
	flagCompressed = 0x01
	flagEndStream  = 0x02
)

// envelopeParser splits a Connect stream (1 flag byte, 4-byte big-endian
// length, message) into messages as bytes arrive in arbitrary pieces. It
// never fails: a stream it cannot follow costs a skipped message, not the
// proxied connection.
type envelopeParser struct {
	hdr  [5]byte
	nhdr int
	size uint32
	msg  []byte
	// skip is what remains of an oversized message being discarded.
	skip    uint32
	skipped int
	onMsg   func(flags byte, msg []byte)
}

func (p *envelopeParser) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		switch {
		case p.nhdr < len(p.hdr):
			c := copy(p.hdr[p.nhdr:], b)
			p.nhdr += c
			b = b[c:]
			if p.nhdr < len(p.hdr) {
				continue
			}
			p.size = binary.BigEndian.Uint32(p.hdr[1:])
			p.msg = p.msg[:0]
			if p.size > maxMessage {
				p.skip = p.size
				continue
			}
			if p.size == 0 {
				p.deliver()
			}
		case p.skip > 0:
			c := uint32(min(len(b), int(min(p.skip, 1<<30))))
			p.skip -= c
			b = b[c:]
			if p.skip == 0 {
				p.skipped++
				p.nhdr = 0
			}
		default:
			c := min(len(b), int(p.size)-len(p.msg))
			p.msg = append(p.msg, b[:c]...)
			b = b[c:]
			if len(p.msg) == int(p.size) {
				p.deliver()
			}
		}
	}
	return n, nil
}

func (p *envelopeParser) deliver() {
	if p.onMsg != nil {
		p.onMsg(p.hdr[0], p.msg)
	}
	p.nhdr = 0
	// A big message's buffer is not kept for the rest of the stream.
	if cap(p.msg) > 64<<10 {
		p.msg = nil
	}
}

// ParseEnvelopes splits a complete Connect stream into its messages; rest
// holds the bytes of an incomplete last envelope. Messages over the size
// bound are left out.
func ParseEnvelopes(data []byte) (flags []byte, msgs [][]byte, rest int) {
	p := envelopeParser{onMsg: func(f byte, m []byte) {
		flags = append(flags, f)
		msgs = append(msgs, bytes.Clone(m))
	}}
	_, _ = p.Write(data) // never fails
	rest = p.nhdr
	if p.nhdr == len(p.hdr) {
		if p.size > maxMessage {
			rest += int(p.size - p.skip)
		} else {
			rest += len(p.msg)
		}
	}
	return flags, msgs, rest
}

// codec decodes messages of one Connect content type.
type codec struct {
	json bool
	// gzip is set when compressed messages are gzip (Connect-Content-
	// Encoding); other encodings are not decoded.
	gzip bool
}

func (c codec) unmarshal(flags byte, b []byte, m proto.Message) error {
	if flags&flagCompressed != 0 {
		if !c.gzip {
			return errors.New("compressed message with unknown encoding")
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return err
		}
		b, err = io.ReadAll(io.LimitReader(zr, maxMessage+1))
		if err != nil {
			return err
		}
		if len(b) > maxMessage {
			return fmt.Errorf("message over %d bytes", maxMessage)
		}
	}
	if c.json {
		return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
	}
	return proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
}

// decompress returns an end-stream message's JSON, decompressed if needed.
func (c codec) endStream(flags byte, b []byte) []byte {
	if flags&flagCompressed == 0 {
		return b
	}
	if !c.gzip {
		return nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	out, _ := io.ReadAll(io.LimitReader(zr, 64<<10))
	return out
}
